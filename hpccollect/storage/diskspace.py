"""Disk space for a file that grows: reserve it before writing, so a full disk fails cleanly.

HDF5 cannot undo a write that failed half way: a full disk in the middle of a flush leaves a
file whose metadata points at data that was never written. ``SpaceReserver`` makes sure the
space a write needs is allocated *before* HDF5 writes anything: it extends a reservation with
``fallocate(FALLOC_FL_KEEP_SIZE)`` (blocks are allocated, the file size does not change, quotas
apply), checks ``RLIMIT_FSIZE``, and where ``fallocate`` is not supported it checks the free
space with ``statvfs``. The reservation beyond the file's end is given back at close.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import re

__all__ = ["SpaceReserver", "describe_os_error"]

_KEEP_SIZE = 0x01
_PUNCH_HOLE = 0x02
_MIN_STEP = 256 << 10
_MAX_STEP = 64 << 20
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.ENODEV}


def _load_fallocate():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None
    func = getattr(libc, "fallocate64", None) or getattr(libc, "fallocate", None)
    if func is not None:
        func.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        func.restype = ctypes.c_int
    return func


_fallocate = _load_fallocate()


def _call_fallocate(fd: int, mode: int, offset: int, length: int) -> int:
    """0, or the errno of a failed ``fallocate`` (ENOSYS where there is none)."""
    if _fallocate is None or length <= 0:
        return 0 if length <= 0 else errno.ENOSYS
    if _fallocate(fd, mode, offset, length) == 0:
        return 0
    return ctypes.get_errno()


def _fsize_limit() -> int | None:
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


class SpaceReserver:
    """Keeps the bytes ``[0, reserved)`` of one open file allocated on disk.

    Args:
        path: the file (named in errors).
        fd: a descriptor of it open for writing; None for a file HDF5 writes through no
            descriptor (its ``core`` or ``fileobj`` driver): nothing is reserved.
    """

    def __init__(self, path: os.PathLike | str, fd: int | None) -> None:
        self.path, self.fd = path, fd
        self.reserved = 0
        self.fallocate_works = _fallocate is not None

    def ensure(self, end: int) -> None:
        """Make sure a write may grow the file up to ``end`` bytes; ``OSError`` if it may not.

        Raises OSError with ``errno.EFBIG`` (past ``RLIMIT_FSIZE``), ``ENOSPC`` or ``EDQUOT``
        before anything is written.
        """
        limit = _fsize_limit()
        if limit is not None and end > limit:
            raise OSError(errno.EFBIG, f"{os.strerror(errno.EFBIG)} (RLIMIT_FSIZE {limit} bytes)")
        if end <= self.reserved or self.fd is None:
            return
        if self.fallocate_works:
            step = min(max(self.reserved // 4, _MIN_STEP), _MAX_STEP)
            target = max(end, self.reserved + step)
            if limit is not None:
                target = min(target, limit)
            err = _call_fallocate(self.fd, _KEEP_SIZE, self.reserved, target - self.reserved)
            if err and target > end:  # not room for the step: try exactly what is needed
                target = end
                err = _call_fallocate(self.fd, _KEEP_SIZE, self.reserved, target - self.reserved)
            if not err:
                self.reserved = target
                return
            if err not in _UNSUPPORTED:
                raise OSError(err, os.strerror(err))
            self.fallocate_works = False
        stat = os.fstatvfs(self.fd)
        free = stat.f_bavail * stat.f_frsize
        if end - os.fstat(self.fd).st_size > free:
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({free} bytes free)")

    def release(self) -> None:
        """Give back the reserved blocks beyond the file's end (the file is unchanged)."""
        if self.fd is not None:
            release_beyond_end(self.fd, self.reserved)
        self.reserved = 0


def release_beyond_end(fd: int, reserved: int | None = None) -> None:
    """Free blocks allocated past the end of the file open as ``fd`` (a kept reservation)."""
    size = os.fstat(fd).st_size
    length = (reserved - size) if reserved is not None else _MAX_STEP
    if length > 0:
        _call_fallocate(fd, _PUNCH_HOLE | _KEEP_SIZE, size, length)
    with contextlib.suppress(OSError):  # the same size: frees what is left on ext4 and tmpfs
        os.ftruncate(fd, size)


_ERRNO_IN_TEXT = re.compile(r"errno = (\d+)")


def describe_os_error(err: BaseException) -> str:
    """The cause of a failed write in a few words: the errno's text, else the first line."""
    code = getattr(err, "errno", None)
    if not code:
        found = _ERRNO_IN_TEXT.search(str(err))
        code = int(found.group(1)) if found else None
    if code:
        text = os.strerror(code)
        detail = err.strerror if isinstance(err, OSError) and err.strerror else ""
        if detail and detail != text and "(" in detail:
            text += " " + detail[detail.index("(") :]
        return f"{text} (errno {code})"
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
