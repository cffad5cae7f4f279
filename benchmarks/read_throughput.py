"""Reading random minibatches for training, against plain h5py fancy indexing of the same rows.

A CartPole dataset (8 envs, random actions) is written to a temporary file. Then random
minibatches of 256 rows are read from disk, the same batches for every reader:

1. plain h5py: every dataset of the file read at the batch's sorted unique rows into numpy;
2. the docs' recipe (docs/datasets.md): ``DataLoader(TransitionDataset(path), batch_size=256, shuffle=True)``
   (here with a sampler that yields the same rows);
3. ``H5Dataset.read_rows`` directly, and the old per-row recipe (``collate_fn=torch.stack``).

Rows/s are the best of ``--repeats``, all in one run.

    python benchmarks/read_throughput.py

Target (issue 7 item 13): the DataLoader recipe >= 0.5x plain h5py.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import h5py
import numpy as np
import torch

from hpccollect import SyncDataCollector
from hpccollect.storage import HDF5Writer, TransitionDataset, open_dataset


def write_dataset(path: Path, frames: int) -> None:
    make = lambda: gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 8)  # noqa: E731
    collector = SyncDataCollector(make, None, frames_per_batch=4000, total_frames=frames)
    collector.set_seed(0)
    with HDF5Writer(path, env="CartPole-v1", expected_rows=frames) as writer:
        for batch in collector:
            writer.extend(batch)
    collector.shutdown()


def plain(path: Path, batches: list[np.ndarray]) -> float:
    with h5py.File(path, "r") as f:
        names: list[str] = []
        f.visititems(
            lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None
        )
        datasets = [f[name] for name in names]
        start = time.perf_counter()
        for rows in batches:
            rows = np.unique(rows)
            out = [d[rows] for d in datasets]
        elapsed = time.perf_counter() - start
    assert len(out) == len(datasets)
    return elapsed


def loader(
    path: Path,
    batches: list[np.ndarray],
    kind: type[TransitionDataset],
    collate: Callable | None = None,
) -> float:
    order = [int(i) for rows in batches for i in rows]
    data = kind(path)
    loader = torch.utils.data.DataLoader(
        data, batch_size=len(batches[0]), sampler=order, collate_fn=collate
    )
    start = time.perf_counter()
    for batch in loader:
        assert batch.shape[0] == len(batches[0])
    return time.perf_counter() - start


def read_rows(path: Path, batches: list[np.ndarray]) -> float:
    with open_dataset(path) as ds:
        start = time.perf_counter()
        for rows in batches:
            ds.read_rows(rows)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=200_000, help="rows in the dataset")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches", type=int, default=200, help="minibatches per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, args.frames, args.batch_size) for _ in range(args.batches)]
    rows = args.batch_size * args.batches
    results: dict[str, list[float]] = {"plain": [], "loader": [], "read_rows": [], "old": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.h5"
        write_dataset(path, args.frames)
        for _ in range(args.repeats):
            results["plain"].append(rows / plain(path, batches))
            took = loader(path, batches, TransitionDataset)
            results["loader"].append(rows / took)
            results["read_rows"].append(rows / read_rows(path, batches))
            few = batches[:3]  # the old per-row recipe is slow: a few batches are enough
            took = loader(path, few, _RowByRow, torch.stack)
            results["old"].append(args.batch_size * len(few) / took)
    best = {name: max(values) for name, values in results.items()}
    ratio = best["loader"] / best["plain"]
    print(f"dataset: {args.frames:,} CartPole rows on disk; minibatches of {args.batch_size}")
    print(f"plain h5py fancy indexing (sorted unique rows) {best['plain']:10,.0f} rows/s")
    print(
        f"DataLoader(TransitionDataset) recipe          {best['loader']:10,.0f} rows/s   "
        f"ratio {ratio:.2f}x ({'meets' if ratio >= 0.5 else 'BELOW'} the 0.5x target)"
    )
    print(f"H5Dataset.read_rows                           {best['read_rows']:10,.0f} rows/s")
    print(f"old recipe (one row at a time, torch.stack)   {best['old']:10,.0f} rows/s")


class _RowByRow(TransitionDataset):
    """The old recipe: no ``__getitems__``, so the DataLoader reads one row at a time."""

    __getitems__ = None


if __name__ == "__main__":
    main()
