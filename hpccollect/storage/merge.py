"""One ``dataset.h5`` over many shards, as HDF5 virtual datasets: no data is copied."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import h5py

from hpccollect.errors import ArgumentValueError
from hpccollect.storage.hdf5_reader import H5Dataset
from hpccollect.storage.layout import EPISODE

__all__ = ["merge_shards"]

_SUMMED = ("committed_steps", "committed_episodes")


def merge_shards(
    shards: Sequence[str | os.PathLike], out: str | os.PathLike, *, overwrite: bool = False
) -> Path:
    """Write ``out``: every dataset of the shards, committed rows only, shard after shard.

    Shards are referenced by paths relative to ``out``'s folder, so the folder can move as a
    whole. Opening the merged file with ``open_dataset`` fails if a shard is missing.
    """
    out = Path(out)
    if not shards:
        raise ArgumentValueError("merge needs at least one shard.")
    if out.exists() and not overwrite:
        raise ArgumentValueError(f"{out} already exists; pass --overwrite to replace it.")
    opened = [H5Dataset(s) for s in shards]
    try:
        layout = _common_layout(opened)
        out.parent.mkdir(parents=True, exist_ok=True)
        rel = [os.path.relpath(ds.path.resolve(), out.parent.resolve()) for ds in opened]
        total = sum(ds.committed_steps for ds in opened)
        with h5py.File(out, "w") as f:
            for path, (trailing, dtype) in layout.items():
                vlayout = h5py.VirtualLayout(shape=(total, *trailing), dtype=dtype)
                offset = 0
                for ds, name in zip(opened, rel, strict=True):
                    n = ds.committed_steps
                    if n:
                        source = h5py.VirtualSource(name, path, shape=ds.file[path].shape)
                        vlayout[offset : offset + n] = source[:n]
                    offset += n
                f.create_virtual_dataset(path, vlayout, fillvalue=None)
            for key, value in opened[0].file.attrs.items():
                f.attrs[key] = value
            for key in _SUMMED:
                f.attrs[key] = sum(int(ds.file.attrs[key]) for ds in opened)
            f.attrs["merged_from"] = json.dumps(rel)
    finally:
        for ds in opened:
            ds.close()
    return out


def _common_layout(shards: list[H5Dataset]) -> dict[str, tuple[tuple[int, ...], object]]:
    """Dataset path -> (trailing shape, dtype), the same in every shard."""

    def layout(ds: H5Dataset) -> dict:
        names = [*ds.keymap, EPISODE] if ds.keymap else []
        return {p: (ds.file[p].shape[1:], ds.file[p].dtype) for p in names}

    first = layout(shards[0])
    for ds in shards[1:]:
        if layout(ds) != first:
            raise ArgumentValueError(
                f"{ds.path} does not have the same datasets, shapes and dtypes as "
                f"{shards[0].path}; only shards of one collection can be merged."
            )
    return first
