"""Dataset jobs against the same work without coordination, and rank 0's CPU per frame.

Three ways to write ``--frames`` CartPole frames (random actions, ``--fpb`` frames per batch)
into HDF5 with N collector processes, measured in the same run for each N:

* ``independent``: N single-process collections side by side, each a ``SyncDataCollector``
  writing its own file (``frames / N`` each): the same work with no coordination at all.
* ``reports``: one ``mpiexec -n N+1`` job, a ``DistributedDataCollector`` whose ranks each
  write their shard (``rank_sink``) and send rank 0 reports (``rank_reports=True``), as
  ``python -m hpccollect collect --shards`` does.
* ``batches``: the same job with every batch also sent to rank 0 (``rank_reports=False``), as
  ``collect --shards`` did before.

Frames/s is the frames over the collection window (first process starting its loop to the last
one ending; rank 0's loop for the jobs); start-up is left out of all three. Rank 0's CPU is
``time.process_time()`` over its loop (every thread of the process). Results go to
``benchmarks/results/shards.json``.

    python benchmarks/shards.py --ranks 2 4 8 --frames 160000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import _jobs

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "shards.json"


def _shard(folder: str, rank: int):
    from hpccollect.storage import open_sink

    return open_sink(Path(folder) / f"rank-{rank:04d}.h5", env="CartPole-v1", shard=rank)


def _env():
    import gymnasium as gym

    return gym.make("CartPole-v1")


def _job(args: argparse.Namespace) -> None:
    """Under mpiexec: every rank runs this; rank 0 prints its measurement."""
    from hpccollect import DistributedDataCollector

    collector = DistributedDataCollector(
        _env,
        None,
        frames_per_batch=args.fpb,
        total_frames=args.frames,
        launcher="mpi",
        rank_sink=partial(_shard, args.folder),
        rank_reports=args.job == "reports",
        liveness_timeout=None,
    )
    from hpccollect.collectors.workers.reports import ReportTally, frames_in
    from hpccollect.storage import EpisodeTally

    tally = ReportTally() if args.job == "reports" else EpisodeTally()
    frames, messages = 0, 0
    cpu, start = time.process_time(), time.time()
    for item in collector:
        tally.extend(item)  # what collect --shards does with each
        frames += frames_in(item)
        messages += 1
    end, cpu = time.time(), time.process_time() - cpu
    collector.shutdown()
    print(json.dumps(dict(start=start, end=end, frames=frames, cpu=cpu, messages=messages)))


def _alone(args: argparse.Namespace) -> None:
    """One independent collection: its frames into its own file."""
    from hpccollect import SyncDataCollector

    sink = _shard(args.folder, args.index)
    collector = SyncDataCollector(_env, None, frames_per_batch=args.fpb, total_frames=args.frames)
    start = time.time()
    frames = 0
    for batch in collector:
        sink.extend(batch)
        frames += batch.numel()
    sink.close()
    end = time.time()
    collector.shutdown()
    print(json.dumps(dict(start=start, end=end, frames=frames)))


def _run(cmd: list[str]) -> list[dict]:
    proc = _jobs.run(cmd)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def measure(n: int, args: argparse.Namespace, mpiexec: str) -> dict:
    row: dict = {"ranks": n}
    me = [sys.executable, __file__, "--fpb", str(args.fpb)]
    with tempfile.TemporaryDirectory() as tmp:
        procs = [
            subprocess.Popen(
                [*me, "--alone", str(i), "--folder", tmp, "--frames", str(args.frames // n)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(n)
        ]
        outs = [json.loads(p.communicate(timeout=900)[0].splitlines()[-1]) for p in procs]
        window = max(o["end"] for o in outs) - min(o["start"] for o in outs)
        row["independent_fps"] = sum(o["frames"] for o in outs) / window
    for mode in ("batches", "reports"):
        with tempfile.TemporaryDirectory() as tmp:
            job = [*me, "--job", mode, "--folder", tmp, "--frames", str(args.frames)]
            (out,) = _run([mpiexec, "-n", str(n + 1), *job])
        row[f"{mode}_fps"] = out["frames"] / (out["end"] - out["start"])
        row[f"{mode}_rank0_cpu_us_per_frame"] = 1e6 * out["cpu"] / out["frames"]
        row[f"{mode}_messages"] = out["messages"]
    row["reports_vs_independent"] = row["reports_fps"] / row["independent_fps"]
    row["rank0_cpu_ratio"] = (
        row["batches_rank0_cpu_us_per_frame"] / row["reports_rank0_cpu_us_per_frame"]
    )
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--frames", type=int, default=160_000)
    p.add_argument("--fpb", type=int, default=200)
    p.add_argument("--job", choices=["batches", "reports"], help=argparse.SUPPRESS)
    p.add_argument("--alone", type=int, dest="index", help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.job:
        return _job(args)
    if args.index is not None:
        return _alone(args)
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    if mpiexec is None:
        raise SystemExit("no mpiexec beside this Python: pip install mpich mpi4py")
    rows = []
    for n in args.ranks:
        row = measure(n, args, mpiexec)
        rows.append(row)
        print(
            f"N={n}: independent {row['independent_fps']:,.0f} frames/s, reports "
            f"{row['reports_fps']:,.0f} ({row['reports_vs_independent']:.2f}x), batches "
            f"{row['batches_fps']:,.0f}; rank 0 CPU per frame {row['batches_rank0_cpu_us_per_frame']:.2f}"
            f" -> {row['reports_rank0_cpu_us_per_frame']:.2f} us ({row['rank0_cpu_ratio']:.0f}x less), "
            f"messages {row['batches_messages']} -> {row['reports_messages']}",
            flush=True,
        )  # fmt: skip
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"frames": args.frames, "fpb": args.fpb, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
