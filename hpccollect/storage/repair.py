"""``repair``: make a file left by a crash, a ``kill -9`` or a full disk whole again.

It keeps exactly the committed rows, checks the result with ``H5Dataset.check()`` and only then
gives the file its final name; what it cannot save, it says.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import h5py

from hpccollect.errors import ArgumentValueError, StorageError
from hpccollect.storage.diskspace import SpaceReserver, describe_os_error, release_beyond_end
from hpccollect.storage.hdf5_reader import H5Dataset
from hpccollect.storage.layout import EPISODE, keymap_from_json
from hpccollect.storage.unfinished import drop_staging, final_path, partial_path, staging_path

__all__ = ["repair"]

#: room for the attributes repair adds (reserved before anything is written)
_REPAIR_BYTES = 64 << 10
# HDF5's message when a write failed after the superblock recorded a larger end of file
_TRUNCATED = re.compile(r"truncated file: eof = (\d+).*stored_eof = (\d+)")
_LOCKED = "unable to lock file"  # HDF5's message when another process holds the file's lock
#: how long repair waits, by default, for another process to let go of the file's lock
LOCK_TIMEOUT_S = 10.0


def repair(path: str | os.PathLike, *, lock_timeout: float = LOCK_TIMEOUT_S) -> Path:
    """Cut a file back to its committed rows, check it, and give a ``.partial`` its final name.

    A file a writer was killed while making (``<name>.partial.new``, see ``staging_path``)
    holds no row: it is deleted.

    Args:
        path: the file, by its final name or its ``.partial`` (or ``.partial.new``) one.
        lock_timeout: seconds to wait while another process holds the file's HDF5 lock. A writer
            that was just killed holds it until its last thread has exited, which can take a
            moment after the process is reported gone; a writer still running holds it for good.

    Returns:
        The repaired file's path.

    Raises:
        StorageError: naming what could not be saved when the file cannot be written (still no
            space, read-only, still open in a writer after ``lock_timeout``) or still has problems
            afterwards; the file then keeps its ``.partial`` name.
    """
    path = Path(path)
    final = final_path(path)
    dropped = drop_staging(final)
    if path == staging_path(final):
        path = final
    partial = partial_path(final)
    target = partial if partial.exists() else path
    if not target.exists():
        raise ArgumentValueError(
            f"{path} does not exist (nor {partial.name})"
            + (
                f"; {staging_path(final).name}, left by a writer killed before its file held "
                "a row, was deleted: start the run again."
                if dropped
                else "."
            )
        )
    if not h5py.is_hdf5(target):
        raise ArgumentValueError(
            f"{target} is not an HDF5 file (no HDF5 signature in it): there is nothing of a "
            "dataset to repair; check the path."
        )
    if target != final and final.exists():
        raise ArgumentValueError(f"cannot rename {target} to {final}: it exists; move one away.")
    committed = _cut_to_committed(target, lock_timeout)
    with H5Dataset(target) as ds:
        problems = ds.check()
    if problems:
        with h5py.File(target, "r+") as file:  # deleting needs no space
            del file.attrs["complete"]
        raise StorageError(
            f"{target}: cut back to its {committed} committed rows, but they are not sound "
            f"({'; '.join(problems)}); those rows could not be saved, the file keeps its name."
        )
    if target != final:
        os.replace(target, final)
    return final


def _cut_to_committed(target: Path, lock_timeout: float) -> int:
    """Resize every dataset to ``committed_steps`` and mark the file complete; the rows kept."""
    try:
        file = _open_unlocked(target, lock_timeout)
    except OSError as err:
        if _LOCKED in str(err):
            raise StorageError(
                f"cannot repair {target}: another process still has it open for writing "
                f"after {lock_timeout:g} s (is the job that writes it still running?); end "
                "that process and run repair again; nothing was changed."
            ) from err
        raise StorageError(
            f"cannot repair {target}: {describe_os_error(err)}; nothing was changed."
        ) from err
    space = SpaceReserver(target, file.id.get_vfd_handle())
    try:
        space.ensure(file.id.get_filesize() + _REPAIR_BYTES)
    except OSError as err:
        file.close()  # nothing was written: closing writes nothing either
        raise StorageError(
            f"cannot repair {target}: {describe_os_error(err)}; nothing was changed, its committed "
            "rows are still readable: free space (or make it writable) and run repair again."
        ) from err
    try:
        with file:
            if "committed_steps" not in file.attrs:
                raise ArgumentValueError(
                    f"{target} is not an hpccollect dataset (no committed_steps)."
                )
            n = int(file.attrs["committed_steps"])
            keymap = file.attrs.get("keymap")
            names = [*keymap_from_json(keymap), EPISODE] if keymap is not None else []
            dropped = max((file[x].shape[0] - n for x in names if x in file), default=0)
            for name in names:
                if name in file and file[name].shape[0] != n:
                    file[name].resize(n, axis=0)
            file.flush()  # the cut frees the space the attributes may need
            file.attrs["repaired"] = f"kept {n} committed rows, dropped {max(dropped, 0)} others"
            file.attrs["complete"] = True
            file.flush()
    except (OSError, RuntimeError) as err:
        raise StorageError(
            f"cannot repair {target}: {describe_os_error(err)}; free space (or make it "
            "writable) and run repair again: its committed rows are still readable."
        ) from err
    fd = os.open(target, os.O_WRONLY)
    try:
        release_beyond_end(fd, space.reserved)  # and what a killed writer had reserved
    finally:
        os.close(fd)
    return n


def _open_unlocked(target: Path, lock_timeout: float) -> h5py.File:
    """Open for repair once no other process holds the file's lock, waiting ``lock_timeout``
    (then HDF5's error is raised)."""
    deadline = time.monotonic() + lock_timeout
    while True:
        try:
            return _open_for_repair(target)
        except OSError as err:
            if _LOCKED not in str(err) or time.monotonic() >= deadline:
                raise
        time.sleep(0.05)


def _open_for_repair(target: Path) -> h5py.File:
    """Open read-write; a file whose last write failed is first grown back to its recorded end."""
    try:
        return h5py.File(target, "r+")
    except OSError as err:
        found = _TRUNCATED.search(str(err))
        if found is None:
            raise
        eof, stored = int(found.group(1)), int(found.group(2))
    if os.path.getsize(target) == eof:
        os.truncate(target, stored)  # zeros (a hole) where the failed write did not land
    return h5py.File(target, "r+")
