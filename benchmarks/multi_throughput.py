"""Frames/s of MultiSync/MultiaSync with 2 workers against one SyncDataCollector, same run.

CartPole-v1, one env per worker, a 2x64 MLP actor sampling one-hot actions from
OneHotCategorical. Process start-up is excluded: each measurement starts after a first batch.

    python benchmarks/multi_throughput.py
    python benchmarks/multi_throughput.py --frames 40000 --repeats 3

Target (issue 3): MultiSync with 2 workers >= 1.6x the frames/s of one SyncDataCollector.
"""

from __future__ import annotations

import argparse
import time

import torch
from _common import Actor, cartpole

from hpccollect import MultiaSyncDataCollector, MultiSyncDataCollector, SyncDataCollector


def measure(collector, frames: int) -> float:
    """frames/s over ``frames`` frames, after one warm-up batch."""
    it = iter(collector)
    next(it)
    n, start = 0, time.perf_counter()
    while n < frames:
        n += next(it).numel()
    rate = n / (time.perf_counter() - start)
    collector.shutdown()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=30_000, help="frames per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="repeats (best kept)")
    parser.add_argument("--frames-per-batch", type=int, default=1000, help="per worker")
    args = parser.parse_args()
    torch.set_num_threads(1)
    fpb = args.frames_per_batch
    rates: dict[str, float] = {"sync": 0.0, "multisync": 0.0, "multiasync": 0.0}
    for _ in range(args.repeats):
        rates["sync"] = max(
            rates["sync"],
            measure(SyncDataCollector(cartpole, Actor(), frames_per_batch=fpb), args.frames),
        )
        rates["multisync"] = max(
            rates["multisync"],
            measure(
                MultiSyncDataCollector([cartpole] * 2, Actor(), frames_per_batch=2 * fpb),
                args.frames,
            ),
        )
        rates["multiasync"] = max(
            rates["multiasync"],
            measure(
                MultiaSyncDataCollector([cartpole] * 2, Actor(), frames_per_batch=fpb), args.frames
            ),
        )
    sync = rates["sync"]
    print(f"SyncDataCollector (1 env)          {sync:9.0f} frames/s")
    for name in ("multisync", "multiasync"):
        ratio = rates[name] / sync
        print(f"{name:10s} (2 workers x 1 env)   {rates[name]:9.0f} frames/s  {ratio:.2f}x sync")
    verdict = "meets" if rates["multisync"] / sync >= 1.6 else "BELOW"
    print(f"target: MultiSync >= 1.6x sync ({verdict})")


if __name__ == "__main__":
    main()
