"""One ``dataset.h5`` over many shards, as HDF5 virtual datasets: the data is not copied.

Episode ids stay unique in the merged view. The shards of one run (one ``run_id``: a job's
per-worker or per-rank shards, whose collectors number trajectories with distinct
``traj_id_offset``/``traj_id_stride``) keep their ids. A shard whose ids collide with those of
an earlier shard (independent runs all number episodes from 0) has its ids shifted by an offset;
then the merged file's ``episode`` and ``collector/traj_ids`` columns are real datasets holding
the shifted ids, and every other column stays virtual. The ``shards`` attribute lists each
shard's metadata and ``id_offset``.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from hpccollect.errors import ArgumentValueError
from hpccollect.storage.hdf5_reader import H5Dataset
from hpccollect.storage.layout import EPISODE
from hpccollect.storage.metadata import ENV_ATTRS
from hpccollect.storage.outputs import (
    check_absent,
    check_final_name,
    check_inputs_kept,
    check_kind,
    check_writable,
)
from hpccollect.storage.spaces_json import describe, space_from_json

__all__ = ["merge_shards"]

_SUMMED = ("committed_steps", "committed_episodes")
_LAYOUT = ("keymap", "squeezed")  # set by a shard's first commit
#: per-file facts: recorded per shard in ``shards``, never copied to the merged file's top level
_PER_FILE = ("run_id", "shard", "created", "complete", "merged_from", "shards", *_SUMMED)
#: the same in every shard (checked), so kept only at the top level
_SHARED = ("keymap", "squeezed", "format_version", "observation_space", "action_space", "env_spec")
#: in the order a difference is reported (the most telling first)
_COMPARED = ("env_id", "observation_space", "action_space", "env_kwargs", "env_spec")
_TRAJ_PATH = "collector/traj_ids"
_BLOCK = 1 << 20  # rows per read when copying shifted ids


def merge_shards(
    shards: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    overwrite: bool = False,
    allow_partial: bool = False,
) -> Path:
    """Write ``out``: every dataset of the shards, committed rows only, shard after shard.

    Shards are referenced by paths relative to ``out``'s folder, so the folder can move as a
    whole. Refused, each with a one-line reason: a file given twice (by any path), ``out``
    itself among the shards, an unfinished (``.partial``) shard unless ``allow_partial``, a
    merged file as a shard, and shards of different envs, spaces or layouts.
    """
    out = Path(out)
    if not shards:
        raise ArgumentValueError("merge needs at least one shard.")
    paths = [Path(s) for s in shards]
    _refuse_duplicates(paths)
    check_final_name(out)
    check_kind(out, folder=False)
    check_inputs_kept(out, paths, "merge")
    check_absent(out, overwrite)
    check_writable(out)
    opened: list[H5Dataset] = []
    try:
        for shard in shards:
            opened.append(H5Dataset(shard))
            _check_shard(opened[-1], allow_partial)
        _check_same_env(opened)
        layout = _common_layout(opened)
        offsets = _id_offsets(opened)
        out.parent.mkdir(parents=True, exist_ok=True)
        rel = [os.path.relpath(ds.path.resolve(), out.parent.resolve()) for ds in opened]
        with h5py.File(out, "w") as f:
            for path, (trailing, dtype) in layout.items():
                if any(offsets) and path in (EPISODE, _TRAJ_PATH):
                    _write_shifted(f, path, trailing, dtype, opened, offsets)
                else:
                    _write_virtual(f, path, trailing, dtype, opened, rel)
            _write_attrs(f, opened, rel, offsets)
    finally:
        for ds in opened:
            ds.close()
    return out


def _refuse_duplicates(paths: list[Path]) -> None:
    """The same file twice (also through another path, a symlink or a hard link) is refused."""
    seen: dict[tuple[int, int], Path] = {}
    for path in paths:
        if not path.exists():
            raise ArgumentValueError(f"shard {path} does not exist.")
        st = path.stat()
        key = (st.st_dev, st.st_ino)
        if key in seen:
            raise ArgumentValueError(
                f"shard {path} is the same file as {seen[key]}; give each shard once."
            )
        seen[key] = path


def _check_shard(ds: H5Dataset, allow_partial: bool) -> None:
    attrs = ds.file.attrs
    if "merged_from" in attrs:
        raise ArgumentValueError(
            f"{ds.path} is itself a merged file; merge the shards it lists (see inspect) instead."
        )
    if not allow_partial and (ds.path.name.endswith(".partial") or not attrs.get("complete")):
        raise ArgumentValueError(
            f"{ds.path} is unfinished (its writer is still running or was killed); repair it "
            f"first (python -m hpccollect repair {ds.path}) or pass --allow-partial to merge "
            "its committed rows."
        )


def _env_fields(ds: H5Dataset) -> dict[str, Any]:
    """What says which env a shard's data came from, decoded for comparison and messages."""
    attrs, out = ds.file.attrs, {}
    for key in ENV_ATTRS:
        value = attrs.get(key)
        if value is not None and key in ("observation_space", "action_space"):
            value = space_from_json(value)
        elif value is not None and key in ("env_spec", "env_kwargs"):
            value = json.loads(value)
        out[key] = value
    return out


def _check_same_env(shards: list[H5Dataset]) -> None:
    first = _env_fields(shards[0])
    for ds in shards[1:]:
        fields = _env_fields(ds)
        for key in _COMPARED:
            a, b = first[key], fields[key]
            if a == b:
                continue
            if key == "env_spec" and a is not None and b is not None:
                field = next(k for k in sorted({*a, *b}) if a.get(k) != b.get(k))
                what = f"env spec {field}: {a.get(field)!r} vs {b.get(field)!r}"
            else:
                what = f"{key}: {_short(a)} vs {_short(b)}"
            raise ArgumentValueError(
                f"cannot merge {ds.path} with {shards[0].path}: different {what}; only shards "
                "of one env can be merged."
            )


def _short(value: Any) -> str:
    return "none recorded" if value is None else repr(value)[:200]


def _common_layout(shards: list[H5Dataset]) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Dataset path -> (trailing shape, dtype), the same in every shard that has rows (a shard
    whose writer committed nothing has no datasets yet, and adds no rows)."""

    def layout(ds: H5Dataset) -> dict:
        return {p: (ds.file[p].shape[1:], ds.file[p].dtype) for p in [*ds.keymap, EPISODE]}

    laid_out = [ds for ds in shards if ds.keymap]
    if not laid_out:
        return {}
    first = layout(laid_out[0])
    for ds in laid_out[1:]:
        if layout(ds) != first:
            raise ArgumentValueError(
                f"{ds.path} does not have the same datasets, shapes and dtypes as "
                f"{laid_out[0].path}; only shards of one collection can be merged."
            )
    return first


def _id_offsets(shards: list[H5Dataset]) -> list[int]:
    """Per shard, what to add to its episode ids so that no id is used by two shards.

    Shards of one run with disjoint ids move together (often by 0); a run, or a shard, whose
    ids meet ids already taken moves above every id taken so far.
    """
    ids = [np.unique(ds.episode_ids) for ds in shards]
    runs: dict[str, list[int]] = {}
    for i, ds in enumerate(shards):
        runs.setdefault(str(ds.file.attrs.get("run_id", f"no-run-id-{i}")), []).append(i)
    units: list[list[int]] = []
    for members in runs.values():
        joined = np.concatenate([ids[m] for m in members])
        if len(np.unique(joined)) == len(joined):
            units.append(members)
        else:  # one run_id but overlapping ids: not numbered as one run, each shard alone
            units.extend([m] for m in members)
    offsets, taken, next_free = [0] * len(shards), np.zeros(0, np.int64), 0
    for unit in units:
        unit_ids = np.concatenate([ids[m] for m in unit])
        if not len(unit_ids):
            continue
        offset = 0
        if np.intersect1d(unit_ids, taken, assume_unique=True).size:
            offset = next_free - int(unit_ids.min())
        for m in unit:
            offsets[m] = offset
        taken = np.union1d(taken, unit_ids + offset)
        next_free = max(next_free, int(unit_ids.max()) + offset + 1)
    return offsets


def _write_virtual(f: h5py.File, path: str, trailing, dtype, shards, rel) -> None:
    total = sum(ds.committed_steps for ds in shards)
    vlayout = h5py.VirtualLayout(shape=(total, *trailing), dtype=dtype)
    offset = 0
    for ds, name in zip(shards, rel, strict=True):
        n = ds.committed_steps
        if n:
            source = h5py.VirtualSource(name, path, shape=ds.file[path].shape)
            vlayout[offset : offset + n] = source[:n]
        offset += n
    f.create_virtual_dataset(path, vlayout, fillvalue=None)


def _write_shifted(f: h5py.File, path: str, trailing, dtype, shards, offsets) -> None:
    """A real dataset: each shard's committed ids plus its offset."""
    total = sum(ds.committed_steps for ds in shards)
    out = f.create_dataset(path, shape=(total, *trailing), dtype=dtype, chunks=True)
    row = 0
    for ds, offset in zip(shards, offsets, strict=True):
        source = ds.file[path] if ds.committed_steps else None
        for start in range(0, ds.committed_steps, _BLOCK):
            stop = min(start + _BLOCK, ds.committed_steps)
            out[row + start : row + stop] = source[start:stop] + np.asarray(offset, dtype)
        row += ds.committed_steps


def _write_attrs(f: h5py.File, shards: list[H5Dataset], rel: list[str], offsets) -> None:
    """Attributes equal in every shard at the top level; every shard's own in ``shards``."""
    laid_out = [ds for ds in shards if ds.keymap] or shards  # a shard without rows has no layout
    for key, value in laid_out[0].file.attrs.items():
        among = laid_out if key in _LAYOUT else shards
        if key not in _PER_FILE and all(
            key in ds.file.attrs and _same(ds.file.attrs[key], value) for ds in among
        ):
            f.attrs[key] = value
    for key in _SUMMED:
        f.attrs[key] = np.int64(sum(int(ds.file.attrs[key]) for ds in shards))
    f.attrs["created"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
    f.attrs["complete"] = True
    f.attrs["merged_from"] = json.dumps(rel)
    entries = []
    for ds, name, offset in zip(shards, rel, offsets, strict=True):
        meta = {k: v for k, v in ds.metadata.items() if k not in _SHARED}
        entries.append({"path": name, "id_offset": int(offset), **meta})
    f.attrs["shards"] = describe(entries)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    except (TypeError, ValueError):
        return False
