"""Whether another process writes a file: HDF5 takes an ``flock`` on each file it opens for
writing (unless ``HDF5_USE_FILE_LOCKING=FALSE``), which is seen here without opening the file in
HDF5."""

from __future__ import annotations

import fcntl

__all__ = ["held_by_a_writer"]


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
