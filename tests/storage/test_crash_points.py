"""Every point a ``kill -9`` can stop a writer at: the file then holds exactly its committed rows.

HDF5 changes a file with many ``write`` calls per append. A killed process leaves the writes it
made (the page cache keeps them) and none after. The writer here is the real ``HDF5Writer``,
whose file goes through h5py's ``fileobj`` driver to a file object that records every write.
The file as a kill after write k would leave it is rebuilt from the first k writes and read
back with the real reader, for every k from the writer's first write to its close: the
``.partial`` file is made under another name and renamed once readable, so at every k it is
either absent (only that staging file exists, and holds no row) or readable.
"""

from __future__ import annotations

import io
import os

import h5py
import numpy as np
import pytest

from hpccollect import SyncDataCollector
from hpccollect.errors import ArgumentValueError
from hpccollect.storage import HDF5Writer, drop_staging, open_dataset, repair, staging_path
from hpccollect.storage.layout import EPISODE

pytestmark = pytest.mark.timeout(300)


class _Recording(io.FileIO):
    """A file that adds each write and truncation made to it to ``log``, in order."""

    def __init__(self, path, log: list) -> None:
        super().__init__(path, "w+")
        self.log = log
        log.append(("create", str(path), self))

    def write(self, data) -> int:
        self.log.append((self, self.tell(), bytes(data)))
        return super().write(data)

    def truncate(self, size=None) -> int:
        size = self.tell() if size is None else size
        self.log.append((self, size, None))
        return super().truncate(size)


class _RecordedWriter(HDF5Writer):
    log: list = []

    def _create_file(self, path) -> h5py.File:
        return h5py.File(_Recording(path, self.log), "w")


def _image(log, path) -> bytes | None:
    """The bytes under the name ``path`` after the events in ``log``: a file's writes and
    truncations (by the file, whatever its name is), creations and renames (of names); None
    while no file has that name."""
    names, files = {}, {}
    for what, offset, data in log:
        if what == "create":
            names[offset] = data
            files[data] = bytearray()
        elif what == "rename":
            names[data] = names.pop(offset)
        elif data is None:
            del files[what][offset:]
            files[what].extend(bytes(offset - len(files[what])))
        else:
            image = files[what]
            image.extend(bytes(max(0, offset + len(data) - len(image))))
            image[offset : offset + len(data)] = data
    return bytes(files[names[str(path)]]) if str(path) in names else None


def _columns(ds) -> dict[str, np.ndarray]:
    return {p: ds.file[p][: len(ds)] for p in [*ds.keymap, EPISODE]} if ds.keymap else {}


@pytest.mark.slow
@pytest.mark.parametrize("compression", [None, "gzip", "lzf"])
def test_a_kill_after_any_write_leaves_exactly_the_committed_rows(
    tmp_path, monkeypatch, compression
):
    log = []
    monkeypatch.setattr(_RecordedWriter, "log", log)
    replace = os.replace
    monkeypatch.setattr(
        os, "replace", lambda a, b: (log.append(("rename", str(a), str(b))), replace(a, b))
    )
    collector = SyncDataCollector("CartPole-v1", None, frames_per_batch=40, total_frames=480)
    collector.set_seed(0)
    path = tmp_path / "run.h5"
    # small chunks: several fill up (and, compressed, are written whole) during the run
    with _RecordedWriter(path, env="CartPole-v1", compression=compression, chunk_bytes=1024) as w:
        for batch in collector:
            w.extend(batch)
    collector.shutdown()
    with open_dataset(path) as ds:
        final, total = _columns(ds), len(ds)
    assert total == 480

    closing = log.index(("rename", str(w.partial), str(path)))  # close()'s: the file is done
    crash, seen, unborn = tmp_path / "crash.h5.partial", 0, None
    for k in range(closing + 1):
        image = _image(log[:k], w.partial)
        if image is None:  # killed before the file took its name: only the staging file
            assert seen == 0, f"after write {k}: the .partial file is gone"
            unborn = _image(log[:k], staging_path(path))
            continue
        crash.write_bytes(image)
        try:
            ds = open_dataset(crash)
        except Exception as err:
            raise AssertionError(f"a kill after write {k} of {closing}: {err}") from err
        with ds:
            rows, columns = len(ds), _columns(ds)
            assert ds.check() == [], f"after write {k}"
        assert rows >= seen, f"after write {k}: {rows} committed rows, {seen} before"
        for name, column in columns.items():
            assert np.array_equal(column, final[name][:rows]), f"after write {k}: {name}"
        seen = rows
    assert seen == total
    # what the last kill before the file took its name leaves: repair deletes it, and says so
    assert unborn is not None
    for named in ("unborn.h5", "unborn.h5.partial.new"):  # by its final name, or its own
        staging_path(tmp_path / "unborn.h5").write_bytes(unborn)
        with pytest.raises(ArgumentValueError, match=r"unborn.h5.partial.new, left by a writer"):
            repair(tmp_path / named)
        assert not staging_path(tmp_path / "unborn.h5").exists()


def test_a_staging_file_a_writer_holds_is_left_alone(tmp_path):
    """``drop_staging`` deletes only a staging file no writer holds (HDF5's lock on it)."""
    path = tmp_path / "run.h5"
    held = h5py.File(staging_path(path), "w")
    try:
        assert not drop_staging(path) and staging_path(path).exists()
    finally:
        held.close()
    assert drop_staging(path) and not staging_path(path).exists()
    assert not drop_staging(path)


class _CutShort(HDF5Writer):
    """Raises KeyboardInterrupt (a second Ctrl-C) in its third commit, before or after that
    commit has moved the file's counters."""

    after_counters = False

    def _move_counters(self, *commit) -> None:
        self.moves = getattr(self, "moves", 0) + 1
        if self.after_counters:
            super()._move_counters(*commit)
        if self.moves == 3:
            raise KeyboardInterrupt
        if not self.after_counters:
            super()._move_counters(*commit)


@pytest.mark.parametrize("compression", [None, "gzip"])
@pytest.mark.parametrize("then", ["close", "extend"])
@pytest.mark.parametrize("after_counters", [False, True], ids=["before-counters", "after"])
def test_a_commit_cut_short_by_ctrl_c_is_written_once(tmp_path, after_counters, then, compression):
    """Whether the writer is closed next (a second Ctrl-C) or given more batches (an
    interrupt caught in a notebook), the commit cut short is written once, before the rest."""
    collector = SyncDataCollector("CartPole-v1", None, frames_per_batch=40, total_frames=200)
    collector.set_seed(0)
    batches = [b.clone() for b in collector]
    collector.shutdown()
    kw = {"compression": compression, "chunk_bytes": 1024}
    kept = batches if then == "extend" else batches[:3]
    with HDF5Writer(tmp_path / "clean.h5", **kw) as clean:
        for batch in kept:
            clean.extend(batch)
    cut = _CutShort(tmp_path / "cut.h5", **kw)
    cut.after_counters = after_counters
    with pytest.raises(KeyboardInterrupt):
        for batch in batches:
            cut.extend(batch)
    assert cut.moves == 3
    for batch in batches[3:] if then == "extend" else ():
        cut.extend(batch)
    assert cut.close() == tmp_path / "cut.h5"
    with open_dataset(tmp_path / "clean.h5") as want, open_dataset(tmp_path / "cut.h5") as got:
        assert got.check() == [] and got.complete
        assert (len(got), got.committed_episodes) == (len(want), want.committed_episodes)
        for name, column in _columns(want).items():
            assert np.array_equal(_columns(got)[name], column), name
    assert cut.committed_steps == len(want) and len(cut.returns) == want.committed_episodes
