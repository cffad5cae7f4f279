"""Appending rows to the datasets of an open HDF5 file: chunk sizes, disk space, low-level writes.

``RowAppender`` is the part of ``HDF5Writer`` that touches the file: it sizes each dataset's
chunks from its row size and the expected number of rows, reserves the space an append needs
before HDF5 writes anything (``diskspace.SpaceReserver``), writes with h5py's low-level calls
(per-append Python overhead is a large part of the cost) and rewrites the committed counters in
place. After a write error ``freeze()`` stops every further write to the file.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import h5py
import numpy as np

from hpccollect.storage.diskspace import SpaceReserver, release_beyond_end

__all__ = ["DEFAULT_EXPECTED_ROWS", "RowAppender", "chunk_rows"]

#: chunks are sized for this many rows when the writer is not told how many to expect
DEFAULT_EXPECTED_ROWS = 16_384
_MIN_CHUNK_BYTES = 16 << 10
_METADATA_BYTES = 64 << 10  # object headers and chunk index nodes an append may add


def chunk_rows(row_bytes: int, expected_rows: int | None, max_bytes: int = 1 << 20) -> int:
    """Rows per chunk: about an eighth of the expected data, at least 16 KiB, at most ``max_bytes``.

    A small run gets small chunks (its file is about its data's size), a long one big chunks
    (fewer, faster appends and sequential reads).
    """
    expected = expected_rows or DEFAULT_EXPECTED_ROWS
    target = min(max_bytes, max(_MIN_CHUNK_BYTES, expected * row_bytes // 8))
    return int(min(max(1, target // row_bytes), 1 << 20))


def _row_bytes(array: np.ndarray) -> int:
    return max(1, int(np.prod(array.shape[1:], dtype=np.int64)) * array.dtype.itemsize)


class RowAppender:
    """Appends rows to the resizable datasets of ``file`` (created on first use).

    Args:
        file: the HDF5 file, open for writing with the default (POSIX) driver.
        path: its path (to give back the space reserved past its end once it is closed).
        compression: the datasets' compression (None, ``"gzip"``, ``"lzf"``).
        chunk_bytes: the largest chunk.
        expected_rows: about how many rows the file will hold (None: a few thousand).
    """

    def __init__(
        self,
        file: h5py.File,
        path: Path,
        *,
        compression: str | None,
        chunk_bytes: int,
        expected_rows: int | None,
    ) -> None:
        self.file, self.path = file, path
        self.compression, self.chunk_bytes, self.expected_rows = (
            compression,
            chunk_bytes,
            expected_rows,
        )
        self.space = SpaceReserver(path, file.id.get_vfd_handle())
        self._datasets: dict[str, h5py.h5d.DatasetID] = {}
        self._chunking: dict[str, tuple[int, int]] = {}
        self._counters: tuple[h5py.h5a.AttrID, ...] | None = None

    def append(self, data: dict[str, np.ndarray], start: int) -> None:
        """Write ``data`` (path -> rows) at row ``start`` of each dataset; ``OSError`` before
        anything is written when the disk cannot take it."""
        n = len(next(iter(data.values())))
        self.space.ensure(self.file.id.get_filesize() + self._bytes_needed(data, start, n))
        for path, array in data.items():
            ds = self._dataset(path, array)
            trailing = array.shape[1:]
            ds.set_extent((start + n, *trailing))
            file_space = ds.get_space()
            file_space.select_hyperslab((start,) + (0,) * len(trailing), (n, *trailing))
            ds.write(h5py.h5s.create_simple(array.shape), file_space, np.ascontiguousarray(array))

    def _bytes_needed(self, data: dict[str, np.ndarray], start: int, n: int) -> int:
        """At most how much the file grows by appending ``n`` rows at ``start``."""
        total = _METADATA_BYTES
        for path, array in data.items():
            rows, row_bytes = self._chunking.get(path) or self._chunk_shape(array)
            new_chunks = -(-(start + n) // rows) + (start // -rows)
            if self.compression:  # a compressed chunk that grows is written elsewhere
                new_chunks += 1
            total += new_chunks * (rows * row_bytes + 4096)
        return total

    def _chunk_shape(self, array: np.ndarray) -> tuple[int, int]:
        """(rows per chunk, bytes per row) of the dataset for ``array``."""
        row_bytes = _row_bytes(array)
        return chunk_rows(row_bytes, self.expected_rows, self.chunk_bytes), row_bytes

    def _dataset(self, path: str, array: np.ndarray) -> h5py.h5d.DatasetID:
        cached = self._datasets.get(path)
        if cached is not None:
            return cached
        trailing = array.shape[1:]
        self._chunking[path] = rows, _ = self._chunk_shape(array)
        self._datasets[path] = self.file.create_dataset(
            path,
            shape=(0, *trailing),
            maxshape=(None, *trailing),
            chunks=(rows, *trailing),
            dtype=array.dtype,
            compression=self.compression,
        ).id
        return self._datasets[path]

    def write_counters(self, steps: int, episodes: int) -> None:
        """Rewrite ``committed_steps``/``committed_episodes`` in place (they exist from the start)."""
        if self._counters is None:
            self._counters = tuple(
                h5py.h5a.open(self.file.id, name)
                for name in (b"committed_steps", b"committed_episodes")
            )
        for attr, value in zip(self._counters, (steps, episodes), strict=True):
            attr.write(np.array(value, dtype=np.int64))

    def fsync(self) -> None:
        try:
            fd = self.file.id.get_vfd_handle()
        except (OSError, TypeError, ValueError):  # not a POSIX file driver: flush() is all
            return
        try:
            os.fsync(fd)
        except OSError as err:
            if err.errno != errno.EINVAL:  # EINVAL: this file cannot be synced
                raise

    def freeze(self) -> None:
        """After a write error, point HDF5's descriptor at /dev/null: the file stays exactly as it
        was, and HDF5 can close without failing again (a close that fails crashes h5py later)."""
        try:
            fd = self.file.id.get_vfd_handle()
            null = os.open(os.devnull, os.O_RDWR)
        except (OSError, TypeError, ValueError):
            return
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)

    def forget(self) -> None:
        """Drop the low-level ids (before the file is closed)."""
        self._datasets.clear()
        self._counters = None

    def release(self) -> None:
        """Give back the space reserved past the end of the (closed) file."""
        try:
            fd = os.open(self.path, os.O_WRONLY)
        except OSError:
            return
        try:
            release_beyond_end(fd, self.space.reserved)
        finally:
            os.close(fd)
