"""Rank 0's cost per frame with and without gathering (``MPILauncher(gather=k)``), same run.

A sync trainer (``DistributedDataCollector(sync=True)``, the mpi4py transport, under ``mpiexec``)
over N collector ranks that send pre-made CartPole batches (``scale.py``'s ``Premade``: the ranks
cost almost nothing, so rank 0's own work is what is timed). Without gathering rank 0 takes N
batches a round; with ``gather=k`` the N ranks form groups of ``k``, whose first rank gathers the
others' batches, and rank 0 takes N/k batches a round (of N - N/k ranks' frames). Per case:
rounds/s, rank 0's CPU seconds per round and per thousand frames. Results go to
``benchmarks/results/gather.json``.

    python benchmarks/gather.py --ranks 16 32 --gather 8 --seconds 5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import _jobs

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from scale import _premade_class, env_for  # noqa: E402

RESULTS = HERE / "results" / "gather.json"


def measure(gather: int | None, seconds: float, fpb: int) -> dict:
    """One run, on every rank of the job; rank 0 returns its figures."""
    from hpccollect import DistributedDataCollector
    from hpccollect.launchers import MPILauncher

    launcher = MPILauncher(gather=gather)
    start = time.perf_counter()
    collector = DistributedDataCollector(
        env_for("cartpole"),
        frames_per_batch=fpb,
        total_frames=-1,
        collector_class=_premade_class(),
        launcher=launcher,
        backend="mpi",
        sync=True,
    )
    try:
        it = iter(collector)
        batch = next(it)
        startup = time.perf_counter() - start
        rounds = 0
        cpu0, t0 = time.process_time(), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            next(it)
            rounds += 1
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        return dict(
            startup_s=round(startup, 2),
            collecting_ranks=int(batch.shape[0]),
            frames_per_round=batch.numel(),
            messages_per_round=collector.num_workers,
            rounds_per_s=round(rounds / wall, 1),
            rank0_cpu_ms_per_round=round(1e3 * cpu / rounds, 3),
            rank0_cpu_us_per_kframe=round(1e6 * cpu / rounds / batch.numel() * 1e3, 1),
        )
    finally:
        collector.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[16, 32], help="collector ranks")
    p.add_argument("--gather", type=int, default=8, help="ranks per group")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--fpb", type=int, default=200, help="CartPole frames a rank per round")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # under mpiexec: one run
    args = p.parse_args()
    if args.one is not None:
        gather = None if args.one == "none" else int(args.one)
        ranks = int(os.environ.get("PMI_SIZE") or os.environ["OMPI_COMM_WORLD_SIZE"]) - 1
        collecting = ranks - (0 if gather is None else -(-ranks // gather))
        got = measure(gather, args.seconds, args.fpb * collecting)
        print("RESULT " + json.dumps(got), flush=True)
        return
    mpiexec = _jobs.mpiexec()
    rows = []
    for n in args.ranks:
        for gather in (None, args.gather):
            cmd = [mpiexec, "-n", str(n + 1), sys.executable, __file__, "--one", str(gather)]
            cmd += ["--seconds", str(args.seconds), "--fpb", str(args.fpb)]
            if gather is None:
                cmd[cmd.index("None")] = "none"
            row = dict(ranks=n, gather=gather, **_jobs.result(cmd))
            rows.append(row)
            print(json.dumps(row), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
