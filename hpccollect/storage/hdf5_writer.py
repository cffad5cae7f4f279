"""``HDF5Writer``: collector batches -> an HDF5 shard of whole episodes, safe against crashes.

Rows are transitions grouped by episode, in time order. Steps of an episode that has not ended
wait in memory; when it ends, the whole episode is appended, the file is flushed, then the
file's ``committed_steps`` and ``committed_episodes`` are rewritten in place and the file is
flushed again (and fsync'ed every few appends). A reader trusts only the committed rows, so a
``kill -9`` loses at most the episodes in flight; with compression, whose chunks are written
whole (``h5append``), at most one chunk's rows as well. Every attribute a later write changes
exists from the start and is rewritten in place: nothing a crash can tear grows the file's
headers after the first commit. The file is ``<path>.partial`` while open and renamed to
``<path>`` when closed. It is made as ``<path>.partial.new`` and takes the ``.partial`` name
once its metadata is on disk, so a ``.partial`` can always be opened; a ``.partial.new`` left by
a kill holds no row (``repair`` and ``--resume`` delete it).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import uuid
from collections import deque
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from tensordict import TensorDictBase

from hpccollect._version import __version__
from hpccollect.errors import ArgumentTypeError, ArgumentValueError, StorageError
from hpccollect.storage.diskspace import describe_os_error
from hpccollect.storage.episodes import EpisodeAssembler, Episodes
from hpccollect.storage.h5append import DEFAULT_EXPECTED_ROWS, RowAppender, chunk_rows
from hpccollect.storage.layout import EPISODE, SQUEEZED, keymap_to_json
from hpccollect.storage.metadata import env_metadata
from hpccollect.storage.sink import Sink
from hpccollect.storage.spaces_json import describe
from hpccollect.storage.unfinished import (
    partial_path,
    refuse_a_live_writer,
    staging_path,
    sync_folder,
)

__all__ = ["DEFAULT_EXPECTED_ROWS", "FORMAT_VERSION", "HDF5Writer", "chunk_rows", "partial_path"]

FORMAT_VERSION = 1
_COMPRESSIONS = (None, "gzip", "lzf")


class HDF5Writer(Sink):
    """Writes collector batches to one HDF5 file (one shard per writing process).

    Use it as a collector's ``replay_buffer`` (so ``start()`` streams to disk), or call
    ``extend(batch)`` on each batch a collector yields. Close it (or use ``with``) to write the
    episodes still open as truncated and to give the file its final name.

    Args:
        path: the final file name (``.h5``).
        env: the env id, ``EnvSpec``, gymnasium env or ``GymEnv`` the data comes from: its id,
            spec (kwargs, ``max_episode_steps``, wrappers) and spaces are recorded.
        env_kwargs: with an env id, the keyword arguments it was made with (``--env-kwargs``).
        run_id: the run this shard belongs to; the shards of one run share it (default: new).
        shard: this shard's index within its run (a distributed job's rank).
        config: the collector configuration to record (any JSON-able mapping).
        seed: the seed of the run.
        compression: None (default, fastest), ``"gzip"`` or ``"lzf"``.
        chunk_bytes: the largest chunk per dataset.
        expected_rows: about how many rows the file will hold (``total_frames``): chunks are
            sized from it and each dataset's row size, so a small run makes a small file.
            Default: a few thousand rows' worth (small chunks).
        fsync_every: fsync the file every this many appends (flush happens at every append).
        overwrite: replace an existing file of that name.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        env: Any = None,
        env_kwargs: dict | None = None,
        run_id: str | None = None,
        shard: int = 0,
        config: dict | None = None,
        seed: int | None = None,
        compression: str | None = None,
        chunk_bytes: int = 1 << 20,
        expected_rows: int | None = None,
        fsync_every: int = 8,
        overwrite: bool = False,
    ) -> None:
        if expected_rows is not None and (
            isinstance(expected_rows, bool)
            or not isinstance(expected_rows, int)
            or expected_rows < 1
        ):
            raise ArgumentValueError(
                f"expected_rows must be a positive integer (or None), got {expected_rows!r}."
            )
        if compression not in _COMPRESSIONS:
            raise ArgumentValueError(
                f"compression={compression!r} is not supported; use one of {_COMPRESSIONS}."
            )
        self.path = Path(path)
        self.partial = partial_path(self.path)
        for existing in (self.path, self.partial):
            if existing.exists() and not overwrite:
                raise ArgumentValueError(
                    f"{existing} already exists; pass overwrite=True (--overwrite) to replace it"
                    + (
                        ", or repair it with hpccollect.storage.repair()"
                        if existing == self.partial
                        else ""
                    )
                    + "."
                )
        refuse_a_live_writer(self.partial)
        self.compression, self.chunk_bytes, self.fsync_every = compression, chunk_bytes, fsync_every
        self.expected_rows = expected_rows
        self.failed: StorageError | None = None
        staged = staging_path(self.path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self._create_file(staged)
            self._rows = self._appender(self._file)
        except (OSError, RuntimeError) as err:
            raise StorageError(f"cannot create {self.partial}: {describe_os_error(err)}") from err
        self._episodes = EpisodeAssembler()
        # (steps, episodes, episodes being written): one attribute, set in one step, so that a
        # commit cut short (a second Ctrl-C) is written again before anything else (by the next
        # commit or by close()), neither lost nor twice
        self._state: tuple[int, int, Episodes | None] = (0, 0, None)
        # per commit, its episodes' ends (steps, episodes) not yet in the file's counters
        self._ends: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self._in_file = (0, 0)  # the file's counters: what a crash keeps
        self.returns: list[float] = []
        self._appends = 0
        self._closed = False
        try:
            self._write_metadata(env, env_kwargs, config, seed, run_id, shard)
            try:
                self._take_partial_name(self._file, self._rows, staged)  # readers can open it
            except (OSError, RuntimeError) as err:
                self.failed = StorageError(
                    f"cannot create {self.partial}: {describe_os_error(err)}"
                )
                self._rows.freeze()  # a close that writes would fail again
                raise self.failed from err
        except BaseException:  # a bad argument or a failed write leaves no file behind
            self._closed = True
            self._rows.forget()
            with contextlib.suppress(OSError, RuntimeError):
                self._file.close()
            staged.unlink(missing_ok=True)
            raise

    def _create_file(self, path: Path) -> h5py.File:
        """A new file, open for writing (its own method so that tests can watch its writes)."""
        return h5py.File(path, "w")

    def _appender(self, file: h5py.File) -> RowAppender:
        return RowAppender(
            file,
            self.partial,
            compression=self.compression,
            chunk_bytes=self.chunk_bytes,
            expected_rows=self.expected_rows,
        )

    def _lay_out(self, data: dict[str, np.ndarray]) -> None:
        """Before the first commit: the file with its datasets (no rows yet) and its keymap.

        Creating datasets changes HDF5's headers in many writes, which a crash can tear and
        leave an unreadable file. So the laid-out file is made beside the empty one, synced,
        and renamed over it: a reader sees one or the other.
        """
        staged = staging_path(self.path)
        file = self._create_file(staged)
        try:
            for key, value in self._file.attrs.items():
                file.attrs[key] = value
            keymap = self._episodes.keymap
            file.attrs["keymap"] = keymap_to_json(keymap)
            file.attrs["squeezed"] = sorted(SQUEEZED & set(keymap))
            rows = self._appender(file)
            rows.lay_out(data)
            self._take_partial_name(file, rows, staged)
            empty, unused = self._file, self._rows
            self._file, self._rows = file, rows
        except BaseException:
            file.close()
            staged.unlink(missing_ok=True)
            raise
        unused.forget()
        empty.close()  # it was unlinked by the rename: its blocks go with it

    def _take_partial_name(self, file: h5py.File, rows: RowAppender, staged: Path) -> None:
        """``staged``, whole on disk, becomes the ``.partial`` file in one rename."""
        file.flush()
        rows.fsync()
        os.replace(staged, self.partial)
        sync_folder(self.partial)

    def _write_metadata(
        self,
        env: Any,
        env_kwargs: dict | None,
        config: dict | None,
        seed: int | None,
        run_id: str | None,
        shard: int,
    ) -> None:
        env_attrs = env_metadata(env, env_kwargs)
        if isinstance(shard, bool) or not isinstance(shard, int) or shard < 0:
            raise ArgumentValueError(f"shard must be an integer >= 0, got {shard!r}.")
        attrs = self._file.attrs
        attrs["format_version"] = FORMAT_VERSION
        attrs["hpccollect_version"] = __version__
        attrs["created"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
        attrs["host"] = socket.gethostname()  # the node that wrote it (a shard's, on a cluster)
        attrs["committed_steps"] = np.int64(0)
        attrs["committed_episodes"] = np.int64(0)
        attrs["complete"] = np.False_
        attrs["collector_config"] = describe(config or {})
        attrs["run_id"] = str(run_id) if run_id is not None else uuid.uuid4().hex
        attrs["shard"] = shard
        if seed is not None:
            attrs["seed"] = int(seed)
        for key, value in env_attrs.items():
            attrs[key] = value

    # ------------------------------------------------------------------ input
    def extend(self, batch: TensorDictBase) -> None:
        """Take a collector batch; the episodes it ends are committed (readable after a crash).

        Args:
            batch: ``[T]``, ``[N, T]``, ``[W, N, T]`` or split trajectories, as collectors yield.

        Raises:
            StorageError: this write or an earlier one failed (the file keeps its committed
                rows, and takes no more).
            ArgumentValueError: the writer is closed.
            ArgumentTypeError: ``batch`` is not a TensorDict.
        """
        if self.failed is not None:
            raise StorageError(
                f"{self.partial}: no more writes after an earlier error: {self.failed}"
            )
        if self._closed:
            raise ArgumentValueError(f"{self.path} is closed; open a new HDF5Writer to write more.")
        if not isinstance(batch, TensorDictBase):
            raise ArgumentTypeError(f"extend() takes a TensorDict, got {type(batch).__name__}.")
        episodes = self._episodes.take(batch)
        if episodes is not None:
            self._commit(episodes)

    # ------------------------------------------------------------------ output
    @property
    def committed_steps(self) -> int:
        """Steps of the episodes handed to the file: all in it once it is closed, and all but
        the last chunk's with compression until then (the file's own counters say what a
        crash keeps)."""
        return self._state[0]

    @property
    def committed_episodes(self) -> int:
        """Episodes handed to the file (see ``committed_steps``)."""
        return self._state[1]

    def _commit(self, episodes: Episodes) -> None:
        """Append whole episodes, flush, then move the file's committed counters and flush again."""
        cut_short = self._state[2]
        if cut_short is not None and cut_short is not episodes:  # first, the one cut short
            self._commit(cut_short)
        steps, count, _ = self._state
        self._state = (steps, count, episodes)
        data = {p: (a.reshape(len(a)) if p in SQUEEZED else a) for p, a in episodes.data.items()}
        tids, lengths = episodes.ids, episodes.lengths
        data[EPISODE] = np.repeat(tids.astype(np.int64), lengths)
        n = len(data[EPISODE])
        try:
            if "keymap" not in self._file.attrs:
                self._lay_out(data)
            self._rows.append(data, steps)  # raises before writing when the disk is too full
            self._file.flush()  # the rows are written before any counter covers them
            self._appends += 1
            if self._appends % self.fsync_every == 0:
                self._rows.fsync()
            self._move_counters((steps, count, lengths))
        except (OSError, RuntimeError) as err:
            raise self._fail(err) from err
        self._state = (steps + n, count + len(tids), None)
        self.returns += episodes.returns()

    def _move_counters(self, commit: tuple[int, int, np.ndarray] | None = None) -> None:
        """Make the file's counters cover every episode whose rows are all in the file; after a
        commit, ``commit`` is its first row, its first episode and its episodes' lengths."""
        durable, last = self._rows.durable_rows, None
        if commit is not None:
            steps, count, lengths = commit
            end = steps + int(lengths.sum())
            if not self._ends and durable == end:  # every row in the file (uncompressed)
                self._set_counters(end, count + len(lengths))
                return
            while self._ends and self._ends[-1][0][0] > steps:  # a retried commit's own ends
                self._ends.pop()
            self._ends.append((steps + np.cumsum(lengths), count + np.arange(1, len(lengths) + 1)))
        while self._ends:
            steps, episodes = self._ends[0]
            k = int(np.searchsorted(steps, durable, side="right"))
            if k:
                last = int(steps[k - 1]), int(episodes[k - 1])
            if k < len(steps):
                self._ends[0] = steps[k:], episodes[k:]
                break
            self._ends.popleft()
        if last is not None:
            self._set_counters(*last)

    def _set_counters(self, steps: int, episodes: int) -> None:
        """Write the file's committed counters, and flush them."""
        self._rows.write_counters(steps, episodes)
        self._file.flush()
        self._in_file = steps, episodes

    def _fail(self, err: BaseException) -> StorageError:
        """Remember the first write error; the file keeps its committed rows and stays partial."""
        if self.failed is None:
            self.failed = StorageError(
                f"cannot write {self.partial}: {describe_os_error(err)}; its "
                f"{self._in_file[0]} committed rows ({self._in_file[1]} episodes) are "
                f"kept: free space, then run `python -m hpccollect repair {self.partial}`."
            )
            self.failed.errno = getattr(err, "errno", None)
        return self.failed

    @property
    def open_episodes(self) -> int:
        """Episodes started but not ended yet (written as truncated at close)."""
        return self._episodes.open_episodes

    def close(self) -> Path:
        """Write open episodes as truncated, fsync, close, and rename to the final name.

        After a write error (``self.failed``) nothing more is written: the file stays ``.partial``
        with its committed rows.

        Returns:
            The file's path: its final name, or the ``.partial`` one after an earlier write
            error.

        Raises:
            StorageError: the last episodes or the final flush could not be written (the file
                stays ``.partial`` with its committed rows).
        """
        if self._closed:
            return self.path if self.failed is None else self.partial
        try:
            if self.failed is None:
                rest = self._episodes.finish()
                if rest is not None:
                    self._commit(rest)  # after any commit cut short (see _commit)
                elif self._state[2] is not None:
                    self._commit(self._state[2])
                try:
                    self._rows.finish()
                    self._file.flush()  # the rows are written before any counter covers them
                    self._move_counters()
                    self._rows.mark_complete()
                    self._file.flush()
                    self._rows.fsync()
                except (OSError, RuntimeError) as err:
                    raise self._fail(err) from err
        finally:
            self._closed = True
            self._close_file()
        if self.failed is not None:
            return self.partial
        os.replace(self.partial, self.path)
        sync_folder(self.path)
        return self.path

    def _close_file(self) -> None:
        """Close the HDF5 file (after an error, without writing more), then give back the space
        reserved past its end."""
        if self.failed is not None:
            self._rows.freeze()
        self._rows.forget()
        try:
            self._file.close()
        except (OSError, RuntimeError) as err:
            self._fail(err)
        self._rows.release()

    def __len__(self) -> int:
        return self.committed_steps

    def __repr__(self) -> str:
        return (
            f"HDF5Writer({str(self.path)!r}, committed_steps={self.committed_steps}, "
            f"committed_episodes={self.committed_episodes}, open_episodes={self.open_episodes})"
        )
