"""HDF5 sink throughput, against plain h5py appends and against collection without a sink.

1. Write: ``HDF5Writer.extend`` on pre-collected CartPole batches (8 envs) against plain h5py
   appends of the same arrays into datasets with the same dtypes and chunking (both sized by
   ``chunk_rows`` for the number of frames written). Both are equally
   durable (a flush after every append, an fsync at close), so the ratio measures the writer's
   episode bookkeeping. Files in a temporary folder, same run, best of ``--repeats``.
2. Collection: a SyncDataCollector over a SyncVectorEnv of 8 CartPoles with a 2x64 MLP actor,
   frames/s with ``writer.extend(batch)`` on every batch against the same loop without it.

    python benchmarks/hdf5_throughput.py
    python benchmarks/hdf5_throughput.py --compression gzip   # or lzf: both sides compress

Targets (issue 4): writer >= 0.8x plain h5py; collection with the sink >= 0.9x without it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import h5py
import numpy as np
import torch
from _common import Actor

from hpccollect import SyncDataCollector
from hpccollect.storage import HDF5Writer
from hpccollect.storage.hdf5_writer import chunk_rows
from hpccollect.storage.layout import SQUEEZED, keymap_for


def make_env() -> gym.vector.VectorEnv:
    return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 8)


def collector(total: int, fpb: int) -> SyncDataCollector:
    c = SyncDataCollector(make_env, Actor(), frames_per_batch=fpb, total_frames=total)
    c.set_seed(0)
    return c


def write_ours(batches, path: Path, compression: str | None = None) -> float:
    start = time.perf_counter()
    frames = sum(b.numel() for b in batches)
    kw = {"fsync_every": 1 << 30, "expected_rows": frames, "compression": compression}
    with HDF5Writer(path, **kw) as writer:
        for batch in batches:
            writer.extend(batch)
    return time.perf_counter() - start


def write_plain(batches, path: Path, compression: str | None = None) -> float:
    """The same arrays appended batch by batch with h5py, same dtypes, chunk sizes and
    compression."""
    keys = [k if isinstance(k, tuple) else (k,) for k in batches[0].keys(True, True)]
    keymap = keymap_for(keys)
    frames = sum(b.numel() for b in batches)
    start = time.perf_counter()
    with h5py.File(path, "w") as f:
        datasets, n = {}, 0
        for batch in batches:
            flat = batch.reshape(-1)
            for name, key in [*keymap.items(), ("episode", ("collector", "traj_ids"))]:
                array = flat.get(key).numpy()
                if name in SQUEEZED:
                    array = array.reshape(len(array))
                if name not in datasets:
                    row = max(1, int(np.prod(array.shape[1:])) * array.dtype.itemsize)
                    chunk = chunk_rows(row, frames)
                    datasets[name] = f.create_dataset(
                        name,
                        shape=(0, *array.shape[1:]),
                        maxshape=(None, *array.shape[1:]),
                        chunks=(chunk, *array.shape[1:]),
                        dtype=array.dtype,
                        compression=compression,
                    )
                ds = datasets[name]
                ds.resize(n + len(array), axis=0)
                ds[n:] = array
            n += flat.shape[0]
            f.flush()
        os.fsync(f.id.get_vfd_handle())
    return time.perf_counter() - start


def collect(total: int, fpb: int, path: Path | None) -> float:
    c = collector(total, fpb)
    writer = HDF5Writer(path, fsync_every=8) if path is not None else None
    start = time.perf_counter()
    frames = 0
    for batch in c:
        if writer is not None:
            writer.extend(batch)
        frames += batch.numel()
    if writer is not None:
        writer.close()
    elapsed = time.perf_counter() - start
    c.shutdown()
    return frames / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--frames", type=int, default=200_000, help="frames written per measurement"
    )
    parser.add_argument("--frames-per-batch", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compression", choices=["gzip", "lzf"], default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    fpb = args.frames_per_batch
    batches = [b.clone() for b in collector(args.frames // fpb * fpb, fpb)]
    frames = sum(b.numel() for b in batches)
    ours, plain, sink, bare = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            z = args.compression
            plain.append(frames / write_plain(batches, Path(tmp) / f"plain{i}.h5", z))
            ours.append(frames / write_ours(batches, Path(tmp) / f"ours{i}.h5", z))
            total = min(args.frames, 100_000) // fpb * fpb
            bare.append(collect(total, fpb, None))
            sink.append(collect(total, fpb, Path(tmp) / f"sink{i}.h5"))
    w, p, s, b = max(ours), max(plain), max(sink), max(bare)
    print(
        f"write   HDF5Writer {w:10,.0f} frames/s   plain h5py {p:10,.0f} frames/s   "
        f"ratio {w / p:.2f}x ({'meets' if w / p >= 0.8 else 'BELOW'} the 0.8x target)"
    )
    print(
        f"collect with sink  {s:10,.0f} frames/s   without    {b:10,.0f} frames/s   "
        f"ratio {s / b:.2f}x ({'meets' if s / b >= 0.9 else 'BELOW'} the 0.9x target)"
    )


if __name__ == "__main__":
    main()
