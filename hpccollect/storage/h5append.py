"""Appending rows to the datasets of an open HDF5 file: chunk sizes, disk space, low-level writes.

``RowAppender`` is the part of ``HDF5Writer`` that touches the file: it sizes each dataset's
chunks from its row size and the expected number of rows, reserves the space an append needs
before HDF5 writes anything (``diskspace.SpaceReserver``), writes with h5py's low-level calls
(per-append Python overhead is a large part of the cost) and rewrites the committed counters in
place. After a write error ``freeze()`` stops every further write to the file.

Compressed datasets are written a whole chunk at a time. HDF5 writes a compressed chunk that
grows somewhere new and frees its old place; a later chunk of the same append may then be
written over that place while the file's index (rewritten only at the next flush) still points
at it, so a ``kill -9`` there corrupts rows already committed. Written once and whole, no chunk
moves: rows wait in a one-chunk buffer per dataset (``durable_rows`` says how many are in the
file), and ``finish()`` writes the last, partial chunk once at close.
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


def _descriptor(file: h5py.File) -> int | None:
    """The descriptor HDF5 writes the file through; None for a driver that has none."""
    try:
        return file.id.get_vfd_handle()
    except (OSError, RuntimeError, TypeError, ValueError):
        return None


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
        self.space = SpaceReserver(path, _descriptor(file))
        self._datasets: dict[str, h5py.h5d.DatasetID] = {}
        self._chunking: dict[str, tuple[int, int]] = {}
        self._counters: tuple[h5py.h5a.AttrID, ...] | None = None
        self._whole = compression is not None  # write whole chunks only (see the module doc)
        self._held: dict[str, np.ndarray] = {}  # with _whole: each dataset's unwritten chunk
        self._fill: dict[str, int] = {}  # with _whole: rows held in it
        self._written: dict[str, int] = {}  # with _whole: each dataset's rows in the file
        #: rows of every dataset in the file (the rest wait in the buffer until their chunk is
        #: whole)
        self.durable_rows = 0

    def lay_out(self, data: dict[str, np.ndarray]) -> None:
        """Create the datasets for rows like ``data``'s (path -> rows), with no rows yet.

        Compressed, a narrow dataset's chunk holds at most 4 KiB or as many rows as the widest
        dataset's chunk: how many rows a ``kill -9`` may lose stays small."""
        if self._whole:
            widest = min(self._chunk_shape(a)[0] for a in data.values())  # the widest's rows
            for path, array in data.items():
                rows, row_bytes = self._chunk_shape(array)
                self._chunking[path] = min(rows, max(widest, 4096 // row_bytes, 1)), row_bytes
                self._written[path] = self._fill[path] = 0
        for path, array in data.items():
            self._dataset(path, array)

    def append(self, data: dict[str, np.ndarray], start: int) -> None:
        """Put ``data`` (path -> rows) at row ``start`` of each dataset; ``OSError`` before
        anything is written when the disk cannot take it.

        Appending again from an earlier ``start`` with the same rows (a commit cut short and
        retried) rewrites them: the result is as if the first call had completed.
        """
        n = len(next(iter(data.values())))
        if not self._whole:
            self.space.ensure(self.file.id.get_filesize() + self._bytes_needed(data, start, n))
            for path, array in data.items():
                self._write(self._dataset(path, array), array, start)
            self.durable_rows = start + n
            return
        for path, array in data.items():
            self._append_whole(path, array, start)
        self.durable_rows = min(self._written.values())

    def _append_whole(self, path: str, array: np.ndarray, start: int) -> None:
        """Rows of one compressed dataset: whole chunks to the file, the rest to its buffer."""
        written = self._written[path]
        if start < written:  # a retry: the rows before ``written`` are in the file
            array, start = array[written - start :], written
        rows = self._chunking[path][0]
        held = self._held.get(path)
        if held is None:
            ds = self._dataset(path, array)
            held = self._held[path] = np.empty((rows, *array.shape[1:]), ds.dtype)
        fill, done, n = start - written, 0, len(array)
        while done < n:
            take = min(rows - fill, n - done)
            if fill == 0 and take == rows:  # a whole chunk in the input: no copy
                self._write_chunk(path, array[done : done + rows])
            else:
                held[fill : fill + take] = array[done : done + take]
                if fill + take == rows:
                    self._write_chunk(path, held)
            fill = (fill + take) % rows
            done += take
        self._fill[path] = fill

    def _write_chunk(self, path: str, rows: np.ndarray) -> None:
        """Write rows of ``path`` (a whole chunk, or the last one) after those in the file."""
        at = self._written[path]
        self.space.ensure(
            self.file.id.get_filesize() + self._bytes_needed({path: rows}, at, len(rows))
        )
        self._write(self._datasets[path], rows, at)
        self._written[path] = at + len(rows)

    def finish(self) -> None:
        """Write the rows still held (each dataset's last chunk, partial, written once)."""
        for path, fill in self._fill.items():
            if fill:
                self._write_chunk(path, self._held[path][:fill])
                self._fill[path] = 0
        if self._written:
            self.durable_rows = min(self._written.values())

    @staticmethod
    def _write(ds: h5py.h5d.DatasetID, array: np.ndarray, start: int) -> None:
        n, trailing = len(array), array.shape[1:]
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
        if path not in self._chunking:
            self._chunking[path] = self._chunk_shape(array)
        rows = self._chunking[path][0]
        self._datasets[path] = self.file.create_dataset(
            path,
            shape=(0, *trailing),
            maxshape=(None, *trailing),
            chunks=(rows, *trailing),
            dtype=array.dtype,
            compression=self.compression,
            fletcher32=self._whole,  # a damaged compressed chunk fails its read, named
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

    def mark_complete(self) -> None:
        """Set the ``complete`` attribute (created false with the file) in place."""
        attr = h5py.h5a.open(self.file.id, b"complete")
        try:
            attr.write(np.array(True))
        finally:
            attr.close()

    def fsync(self) -> None:
        fd = _descriptor(self.file)
        if fd is None:  # not a POSIX file driver: flush() is all
            return
        try:
            os.fsync(fd)
        except OSError as err:
            if err.errno != errno.EINVAL:  # EINVAL: this file cannot be synced
                raise

    def freeze(self) -> None:
        """After a write error, point HDF5's descriptor at /dev/null: the file stays exactly as it
        was, and HDF5 can close without failing again (a close that fails crashes h5py later)."""
        fd = _descriptor(self.file)
        if fd is None:
            return
        try:
            null = os.open(os.devnull, os.O_RDWR)
        except OSError:
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
