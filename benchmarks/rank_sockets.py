"""Sockets a gloo job holds against its rank count: each collector rank's, and rank 0's.

A ``DistributedDataCollector`` over N CartPole ranks (``launcher="mp"``, gloo, a policy whose
weights are broadcast at start and once more) is read from ``/proc`` after its first and its
third batch. "lazy" is hpccollect's default, where a pair of ranks connects when it first talks
(``transport/backends._gloo``); "full mesh" is torch's own (``TORCH_GLOO_LAZY_INIT=0``), where
every rank connects to every other rank in both of the job's groups. Both are measured in the
same run, each in a fresh process.

    python benchmarks/rank_sockets.py --ranks 2 8 32
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "rank_sockets.json"
MODES = {"lazy": None, "full mesh": "0"}


def sockets(pid: int) -> int:
    """How many sockets process ``pid`` holds."""
    held = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            held += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return held


def measure(ranks: int) -> dict:
    """One job of ``ranks`` collector ranks (run in this process)."""
    import torch
    from tensordict.nn import TensorDictModule
    from torch import nn

    from hpccollect import DistributedDataCollector, GymEnv

    policy = TensorDictModule(nn.Linear(4, 2), in_keys=["observation"], out_keys=["action"])
    collector = DistributedDataCollector(
        [partial(GymEnv, "CartPole-v1")] * ranks,
        policy,
        frames_per_batch=10 * ranks,
        total_frames=-1,
        launcher="mp",
        sync=True,
    )
    try:
        batches = iter(collector)
        next(batches)
        pids = [channel.pid for channel in collector._pool.channels]
        first = [sockets(pid) for pid in pids]
        with torch.no_grad():
            policy.module.bias.add_(1.0)
        collector.update_policy_weights_()
        next(batches)
        next(batches)
        third = [sockets(pid) for pid in pids]
        rank0 = sockets(os.getpid())
    finally:
        collector.shutdown()
    return {
        "ranks": ranks,
        "rank_max": max(first + third),
        "rank_mean": round(sum(third) / len(third), 1),
        "rank0": rank0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 8, 32])
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: measure, print JSON
    args = p.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one)))
        return
    rows = []
    for ranks in args.ranks:
        for mode, value in MODES.items():
            env = {k: v for k, v in os.environ.items() if k != "TORCH_GLOO_LAZY_INIT"}
            if value is not None:
                env["TORCH_GLOO_LAZY_INIT"] = value
            done = subprocess.run(
                [sys.executable, __file__, "--one", str(ranks)],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
            )
            row = {"mode": mode, **json.loads(done.stdout.strip().splitlines()[-1])}
            rows.append(row)
            print(
                f"{mode:>9} ranks {ranks:3d}: a collector rank holds at most {row['rank_max']:3d} "
                f"sockets (mean {row['rank_mean']:5.1f}), rank 0 {row['rank0']:4d}",
                flush=True,
            )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
