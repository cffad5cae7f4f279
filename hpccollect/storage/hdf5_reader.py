"""Reading HDF5 shards and merged files back as TensorDicts, lazily, and checking them.

torch and tensordict are imported when rows are first read as tensors: opening, describing
and checking a dataset (``inspect``, ``repair``, ``merge``) needs only h5py and numpy.

Only committed rows are visible: a file cut short by a crash shows every whole episode it
committed and nothing else. Files are opened without HDF5's file lock, so a file still being
written (``*.partial``) can be read: an open ``H5Dataset`` shows the rows committed when it was
opened; reopen it to see newer ones.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from hpccollect.errors import ArgumentValueError
from hpccollect.storage.layout import EPISODE, Key, keymap_from_json
from hpccollect.storage.spaces_json import space_from_json

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

__all__ = ["H5Dataset", "open_dataset"]


@functools.cache
def _torch() -> tuple[Any, Any]:
    """``(torch, TensorDict)``, imported when rows are first read as tensors; TensorDict
    batches then pass through DataLoader's default ``collate_fn`` too."""
    import torch
    from tensordict import TensorDict

    from hpccollect._compat import register_tensordict_collate

    register_tensordict_collate()
    return torch, TensorDict


def _as_array(index: Any, torch: Any) -> np.ndarray:
    """``index`` (a tensor too, on any device) as a numpy array."""
    return np.asarray(index.cpu() if isinstance(index, torch.Tensor) else index)


def _open(path: Path) -> h5py.File:
    """Open for reading without taking HDF5's lock (the writer of a ``.partial`` holds it)."""
    if not path.exists():
        raise ArgumentValueError(f"{path} does not exist.")
    if path.is_dir():
        raise ArgumentValueError(f"{path} is a directory; give a dataset file in it.")
    live = path.name.endswith(".partial")
    for attempt in range(3 if live else 1):
        try:
            return h5py.File(path, "r", locking=False)
        except OSError as err:
            first = err
        try:  # this process has it open already (a writer): HDF5 shares that handle
            return h5py.File(path, "r")
        except OSError:
            pass
        if live and attempt < 2:
            time.sleep(0.2)  # caught its writer mid-flush: look again
    hint = "; if its run is over, python -m hpccollect repair may recover its committed rows"
    raise ArgumentValueError(
        f"{path} is not a readable HDF5 file: {first}{hint if live else ''}"
    ) from first


class H5Dataset:
    """A dataset file opened for reading: index it for TensorDicts of transitions.

    ``ds[i]``, ``ds[a:b]`` or ``ds[index_tensor]`` read only those rows; ``ds.episodes()``
    yields one TensorDict per episode; ``ds.to_tensordict()`` loads everything.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.file = _open(self.path)
        attrs = self.file.attrs
        if "committed_steps" not in attrs:
            self.file.close()
            raise ArgumentValueError(
                f"{self.path} is not an hpccollect dataset (no committed_steps)."
            )
        self._check_shards()
        self.keymap: dict[str, Key] = keymap_from_json(attrs["keymap"]) if "keymap" in attrs else {}
        self.squeezed = set(attrs.get("squeezed", []))
        self.committed_steps = int(attrs["committed_steps"])
        self.committed_episodes = int(attrs["committed_episodes"])
        self._episode_ids: np.ndarray | None = None
        self._readers: dict[str, tuple[h5py.Dataset, tuple[int, ...], np.ndarray]] = {}

    @property
    def files(self) -> list[Path]:
        """The files its rows are read from: this one, and a merged view's shards."""
        return [self.path, *(self.path.parent / s for s in self._shard_names())]

    def _shard_names(self) -> list[str]:
        """A merged view's shards, relative to it (none for a file of its own)."""
        return json.loads(self.file.attrs.get("merged_from", "[]"))

    def _check_shards(self) -> None:
        shards = self._shard_names()
        missing = [s for s in shards if not (self.path.parent / s).exists()]
        if missing:
            self.file.close()
            raise ArgumentValueError(
                f"{self.path} is a merged view but its shard(s) {missing} are missing; restore "
                "them next to it (paths are relative to the merged file)."
            )

    # ------------------------------------------------------------------ metadata
    @property
    def metadata(self) -> dict[str, Any]:
        """Every file attribute, JSON ones decoded."""
        out: dict[str, Any] = {}
        for key, value in self.file.attrs.items():
            if isinstance(value, bytes):
                value = value.decode()
            if isinstance(value, str) and value[:1] in "{[":
                with contextlib.suppress(json.JSONDecodeError):
                    value = json.loads(value)
            out[key] = value.item() if isinstance(value, np.generic) else value
        return out

    @property
    def observation_space(self):
        text = self.file.attrs.get("observation_space")
        return None if text is None else space_from_json(text)

    @property
    def action_space(self):
        text = self.file.attrs.get("action_space")
        return None if text is None else space_from_json(text)

    @property
    def complete(self) -> bool:
        """False for a file still being written, or left by a run that crashed (``.partial``)."""
        return bool(self.file.attrs.get("complete")) and not self.path.name.endswith(".partial")

    @property
    def written_steps(self) -> int:
        """Rows physically present (more than committed after a crash, until repaired)."""
        return int(self.file[EPISODE].shape[0]) if EPISODE in self.file else 0

    # ------------------------------------------------------------------ rows
    def __len__(self) -> int:
        return self.committed_steps

    def keys(self) -> list[Key]:
        return list(self.keymap.values())

    def __getitem__(self, index: Any) -> TensorDict:
        torch, TensorDict = _torch()
        rows = self._rows(index, torch)
        single = isinstance(rows, (int, np.integer))
        out = TensorDict({}, batch_size=[] if single else [_count(rows, self.committed_steps)])
        for path, key in self.keymap.items():
            value = torch.from_numpy(np.asarray(_read(self.file[path], rows)))
            out.set(key, value.unsqueeze(-1) if path in self.squeezed else value)
        return out

    def read_rows(self, rows: Any) -> TensorDict:
        """Rows in any order, repeats allowed, in one read per dataset: the fast minibatch path.

        Each dataset is read once at the sorted unique rows, as an HDF5 point selection (a few
        times faster than h5py's fancy indexing for small rows), then the rows are put back in
        the order asked.
        """
        torch, TensorDict = _torch()
        rows = _as_array(rows, torch).astype(np.int64, copy=False)
        n = self.committed_steps
        if rows.ndim != 1:
            raise IndexError(f"read_rows takes a 1-d list of row numbers, got shape {rows.shape}")
        if rows.size and (rows.min() < -n or rows.max() >= n):
            raise IndexError(f"rows out of range for {n} committed rows")
        rows = np.where(rows < 0, rows + n, rows)
        unique, inverse = np.unique(rows, return_inverse=True)
        same = len(unique) == len(rows) and bool((unique == rows).all())
        out: dict = {}
        for path, key in self.keymap.items():
            value = self._read_points(path, unique)
            if not same:
                value = value[inverse]
            if path in self.squeezed:
                value = value[:, None]
            _put(out, key, torch.from_numpy(value))
        return TensorDict(out, batch_size=[len(rows)])

    def _read_points(self, path: str, rows: np.ndarray) -> np.ndarray:
        """``file[path][rows]`` for sorted unique ``rows``."""
        reader = self._readers.get(path)
        if reader is None:
            ds = self.file[path]
            trailing = ds.shape[1:]
            if trailing:
                inner = np.indices(trailing).reshape(len(trailing), -1).T.astype(np.uint64)
            else:  # one value per row
                inner = np.zeros((1, 0), dtype=np.uint64)
            self._readers[path] = reader = (ds, trailing, inner)
        ds, trailing, inner = reader
        if not len(rows) or len(inner) > _POINTS_PER_ROW:
            return ds[rows] if len(rows) else ds[:0]
        coords = np.empty((len(rows) * len(inner), 1 + len(trailing)), dtype=np.uint64)
        coords[:, 0] = np.repeat(rows, len(inner))
        coords[:, 1:] = np.tile(inner, (len(rows), 1))
        space = ds.id.get_space()
        space.select_elements(coords)
        out = np.empty((len(rows), *trailing), dtype=ds.dtype)
        ds.id.read(h5py.h5s.create_simple(out.shape), space, out)
        return out

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> TensorDict:
        """``batch_size`` rows drawn uniformly with replacement (``generator`` for repeatability)."""
        if len(self) == 0:
            raise IndexError(f"{self.path} has no committed rows to sample from")
        torch, _ = _torch()
        rows = torch.randint(len(self), (batch_size,), generator=generator)
        return self.read_rows(rows)

    def _rows(self, index: Any, torch: Any) -> Any:
        n = self.committed_steps
        if isinstance(index, (int, np.integer)):
            if not -n <= index < n:
                raise IndexError(f"row {index} is out of range for {n} committed rows")
            return int(index) % n
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                return np.arange(start, stop, step)
            return slice(start, stop)
        rows = _as_array(index, torch)
        if rows.ndim == 0:  # a 0-d tensor or array: one row
            return self._rows(int(rows), torch)
        if rows.dtype == bool:
            rows = np.flatnonzero(rows)
        rows = np.where(rows < 0, rows + n, rows)
        if rows.size and (rows.min() < 0 or rows.max() >= n):
            raise IndexError(f"rows out of range for {n} committed rows")
        order = np.argsort(rows, kind="stable")  # h5py wants increasing indices
        sorted_rows = rows[order]
        if (
            len(np.unique(sorted_rows)) != len(sorted_rows)
            or (order != np.arange(len(order))).any()
        ):
            return _Gather(rows)
        return sorted_rows

    def to_tensordict(self) -> TensorDict:
        """Every committed row, in memory."""
        return self[:]

    # ------------------------------------------------------------------ episodes
    @property
    def episode_ids(self) -> np.ndarray:
        if self._episode_ids is None:
            self._episode_ids = (
                self.file[EPISODE][: self.committed_steps]
                if EPISODE in self.file
                else np.zeros(0, dtype=np.int64)  # nothing written yet
            )
        return self._episode_ids

    def episode_bounds(self) -> list[tuple[int, int]]:
        """(start, stop) rows of each episode, in file order."""
        ids = self.episode_ids
        if not len(ids):
            return []
        starts = [0, *(np.flatnonzero(ids[1:] != ids[:-1]) + 1)]
        return list(zip(starts, [*starts[1:], len(ids)], strict=True))

    def episodes(self) -> Iterator[TensorDict]:
        """One TensorDict ``[T]`` per episode, in file order."""
        for start, stop in self.episode_bounds():
            yield self[start:stop]

    def episode_lengths(self) -> np.ndarray:
        """The number of steps of each episode, in file order."""
        return np.array([stop - start for start, stop in self.episode_bounds()], dtype=np.int64)

    def episode_ends(self) -> dict[str, int]:
        """How the episodes ended: ``terminated`` and ``truncated`` counts (by their last step)."""
        ends = [stop - 1 for _, stop in self.episode_bounds()]
        out = {}
        for name, path in (("terminated", "terminals"), ("truncated", "timeouts")):
            if ends and path in self.file:
                flags = self.file[path][: self.committed_steps].reshape(self.committed_steps, -1)
                out[name] = int(flags[ends].any(axis=-1).sum())
            else:
                out[name] = 0
        return out

    def returns(self) -> np.ndarray:
        """The sum of rewards of each episode."""
        bounds = self.episode_bounds()
        if not bounds or "rewards" not in self.file:
            return np.zeros(0)
        rewards = self.file["rewards"][: self.committed_steps].astype(np.float64)
        return np.add.reduceat(rewards, [s for s, _ in bounds])

    def check(self) -> list[str]:
        """Integrity problems found (an empty list when the file is sound). Every committed
        row is read."""
        problems = []
        for path in [*self.keymap, EPISODE] if self.keymap else []:
            if path not in self.file:
                problems.append(f"dataset {path!r} named in keymap is missing")
            elif self.file[path].shape[0] < self.committed_steps:
                problems.append(
                    f"dataset {path!r} has {self.file[path].shape[0]} rows, fewer than committed"
                )
        if problems:
            return problems
        problems += self._unreadable()
        if problems:
            return problems
        bounds = self.episode_bounds()
        if len(bounds) != self.committed_episodes:
            problems.append(f"{len(bounds)} episodes found, {self.committed_episodes} committed")
        if len({int(self.episode_ids[s]) for s, _ in bounds}) != len(bounds):
            problems.append("an episode id appears in two places: episodes are not contiguous")
        ends = [stop - 1 for _, stop in bounds]
        if ends and "next_done" in self.file:
            done = self.file["next_done"][: self.committed_steps].reshape(-1)
            if not done[ends].all():
                problems.append("some episodes do not end with next/done")
            inner = np.ones(self.committed_steps, dtype=bool)
            inner[ends] = False
            if done[inner].any():
                problems.append("next/done is set inside an episode")
        return problems

    def _unreadable(self, block_bytes: int = 64 << 20) -> list[str]:
        """Every committed row of every dataset, read in blocks: the parts that fail (a damaged
        compressed chunk fails its decompression or its checksum)."""
        problems = []
        for path in [*self.keymap, EPISODE] if self.keymap else []:
            ds = self.file[path]
            rows = max(1, block_bytes // max(1, ds.dtype.itemsize * int(np.prod(ds.shape[1:]))))
            for start in range(0, self.committed_steps, rows):
                stop = min(start + rows, self.committed_steps)
                try:
                    ds[start:stop]
                except (OSError, RuntimeError) as err:
                    problems.append(
                        f"dataset {path!r}: rows {start}-{stop - 1} cannot be read ({err})"
                    )
                    break
        return problems

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> H5Dataset:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"H5Dataset({str(self.path)!r}, steps={self.committed_steps}, "
            f"episodes={self.committed_episodes})"
        )


#: rows with more values than this are read with h5py's fancy indexing instead of points
_POINTS_PER_ROW = 256


class _Gather:
    """Rows in any order (with repeats): read sorted unique rows, then reorder."""

    def __init__(self, rows: np.ndarray) -> None:
        self.unique, self.inverse = np.unique(rows, return_inverse=True)

    def __len__(self) -> int:
        return len(self.inverse)


def _read(ds: h5py.Dataset, rows: Any) -> np.ndarray:
    if isinstance(rows, _Gather):
        return ds[rows.unique][rows.inverse]
    return ds[rows]


def _put(tree: dict, key: Key, value: torch.Tensor) -> None:
    for part in key[:-1]:
        tree = tree.setdefault(part, {})
    tree[key[-1]] = value


def _count(rows: Any, n: int) -> int:
    if isinstance(rows, slice):
        return len(range(*rows.indices(n)))
    return len(rows)


def open_dataset(path: str | os.PathLike) -> H5Dataset:
    """Open an HDF5 dataset for reading (lazily: rows are read when indexed).

    Args:
        path: a shard, a merged file, or a ``.partial`` file still being written.

    Returns:
        The dataset: ``ds[i:j]`` gives a TensorDict of those rows, ``ds.episodes()`` one per
        episode, ``len(ds)`` the rows committed when it was opened.
    """
    return H5Dataset(path)
