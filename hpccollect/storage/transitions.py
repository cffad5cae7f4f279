"""``TransitionDataset``: a dataset file as a ``torch.utils.data.Dataset`` of transitions, for a
``DataLoader`` (docs/datasets.md's recipe)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from hpccollect._compat import register_tensordict_collate
from hpccollect.storage.hdf5_reader import H5Dataset

__all__ = ["TransitionDataset"]

# its minibatches go through DataLoader's default collate_fn, in every worker process too (a
# spawned worker imports this module to unpickle the dataset)
register_tensordict_collate()


class TransitionDataset(torch.utils.data.Dataset):
    """A ``torch.utils.data.Dataset`` of transitions (one TensorDict row each).

    A ``DataLoader`` with a ``batch_size`` calls ``__getitems__`` with the whole minibatch, which
    reads it with one HDF5 read per dataset (``H5Dataset.read_rows``) into one TensorDict; keep
    the default ``collate_fn`` (``collate_fn=torch.stack`` would re-stack it row by row). The file
    is opened lazily in each process, so ``num_workers > 0`` works. ``in_memory=True`` loads the
    committed rows into memory once per process: for files that fit in RAM, the fastest.
    """

    def __init__(self, path: str | os.PathLike, *, in_memory: bool = False) -> None:
        self.path = Path(path)
        with H5Dataset(self.path) as ds:
            self._len = len(ds)
        self.in_memory = in_memory
        self._ds: H5Dataset | TensorDict | None = None
        self._pid: int | None = None

    def __len__(self) -> int:
        return self._len

    def _source(self) -> H5Dataset | TensorDict:
        if self._ds is None or self._pid != os.getpid():
            ds = H5Dataset(self.path)
            if self.in_memory:
                with ds:
                    ds = ds[: self._len]
            self._ds, self._pid = ds, os.getpid()
        return self._ds

    def __getitem__(self, index: int) -> TensorDict:
        return self._source()[index]

    def __getitems__(self, indices: list[int]) -> TensorDict:
        source = self._source()
        if isinstance(source, TensorDict):
            return source[torch.as_tensor(indices, dtype=torch.long)]
        return source.read_rows(indices)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_ds": None, "_pid": None}  # each process opens its own
