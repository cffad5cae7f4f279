"""The names a dataset file goes by until it is finished, and what a kill leaves under them.

A writer makes its file as ``<name>.partial.new`` (``staging_path``), renames it to
``<name>.partial`` (``partial_path``) once it can be opened, and to ``<name>`` once closed. A
``.partial.new`` that a kill left never held a row (``drop_staging`` deletes it). HDF5 takes an
``flock`` on each file it opens for writing (unless ``HDF5_USE_FILE_LOCKING=FALSE``), which tells
a live writer's file from one a crash left (``held_by_a_writer``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from hpccollect.errors import StorageError

__all__ = [
    "drop_staging",
    "final_path",
    "held_by_a_writer",
    "partial_path",
    "refuse_a_live_writer",
    "staging_path",
    "sync_folder",
]


_PARTIAL = ".partial"
_STAGING = ".partial.new"


def partial_path(path: str | os.PathLike) -> Path:
    """Where a file is written until it is closed."""
    path = Path(path)
    return path.with_name(path.name + _PARTIAL)


def staging_path(path: str | os.PathLike) -> Path:
    """Where a file of ``path`` is made before it takes its ``partial_path`` name (when
    created, and when laid out for its first rows): what a kill there leaves holds no row."""
    path = Path(path)
    return path.with_name(path.name + _STAGING)


def final_path(path: str | os.PathLike) -> Path:
    """A dataset file's finished name, from any of its names (finished, partial, staging)."""
    path = Path(path)
    for suffix in (_STAGING, _PARTIAL):
        if path.name.endswith(suffix):
            return path.with_name(path.name.removesuffix(suffix))
    return path


def held_by_a_writer(fd: int) -> bool:
    """Whether another process has the file of ``fd`` open for writing in HDF5.

    Takes a shared lock on ``fd`` where none does (kept until ``fd`` is closed, so that no
    writer opens the file meanwhile).

    Args:
        fd: a descriptor of the file, open for reading.

    Returns:
        True when a writer holds the file's lock; False otherwise, and where the file system
        has no such locks (nothing can tell there).
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no flock on this file system (some NFS and Lustre mounts)
        return False
    return False


def refuse_a_live_writer(partial: Path) -> None:
    """Raise ``StorageError`` where another process writes ``partial``: ``overwrite`` replaces
    a file a crash left, never one being written."""
    with _opened(partial) as fd:
        if fd is not None and held_by_a_writer(fd):
            raise StorageError(
                f"cannot create {partial}: another process is writing it (it holds the file's "
                "lock); end that job first, or write to another path."
            )


def drop_staging(path: str | os.PathLike) -> bool:
    """Delete the file that a writer of ``path`` left when it was killed while making it
    (``staging_path(path)``: it never held a committed row). One that a running writer holds
    (its HDF5 lock), or that cannot be opened to tell, is left alone.

    Args:
        path: the dataset's final file name.

    Returns:
        Whether a file was deleted.
    """
    staged = staging_path(path)
    with _opened(staged) as fd:
        if fd is None or held_by_a_writer(fd):
            return False  # none there, or a writer is making it now
        try:  # the file locked here, not one made since under that name
            if not os.path.samestat(os.fstat(fd), os.stat(staged)):
                return False
        except FileNotFoundError:
            return False
        staged.unlink(missing_ok=True)  # with the lock still held
        return True


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[int | None]:
    """A descriptor of ``path`` open for reading (None where it cannot be opened), closed on
    leaving the block: a lock taken on it lasts that long."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def sync_folder(path: Path) -> None:
    """Make a rename into ``path``'s folder survive a power cut (where the system allows)."""
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
