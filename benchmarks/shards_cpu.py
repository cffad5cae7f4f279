"""Rank 0's CPU per collected frame in a ``--shards`` job, against a collector rank's.

Runs ``mpiexec -n RANKS python -m hpccollect collect --env CartPole-v1 --collector single
--frames-per-batch 100 --shards`` (a long run, stopped at the end), lets it reach steady
collection, then reads the CPU time of rank 0's process and of rank 1's from ``/proc/PID/stat``
over ``--seconds`` s. Rank 1 collects ``1 / (RANKS - 1)`` of the frames, so the ratio of rank
0's CPU per frame to rank 1's is ``cpu0 / ((RANKS - 1) * cpu1)``: the frames cancel out.

    python benchmarks/shards_cpu.py                      # 5 ranks, 20 s
    PYTHONPATH=/path/to/other/checkout python benchmarks/shards_cpu.py   # another version

Prints one JSON line (``--out`` appends it to a file too), with the clock ticks of each of rank
0's threads over the window (Python's threads are all called ``python``; torch's own threads,
such as gloo's ``gloo_tcp_loop``, have their names).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User and system CPU of process ``pid`` so far, in s."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_ticks(pid: int) -> dict[str, int]:
    """CPU clock ticks of each thread of process ``pid`` so far, by ``name:tid``."""
    ticks = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name, rest = task.joinpath("stat").read_text().rsplit(")", 1)
        except OSError:  # the thread ended
            continue
        fields = rest.split()
        ticks[f"{name.split('(', 1)[1]}:{task.name}"] = int(fields[11]) + int(fields[12])
    return ticks


def rank_pids(job: int, ranks: int, deadline: float) -> dict[int, int]:
    """The pid of each rank of the job under launcher ``job`` (by ``PMI_RANK`` in its
    environment), once all are there."""
    found: dict[int, int] = {}
    while len(found) < ranks:
        if time.monotonic() > deadline:
            raise TimeoutError(f"found ranks {sorted(found)} of {ranks}")
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"hpccollect" not in cmdline or b"collect" not in cmdline:
                continue
            for var in environ:
                if var.startswith(b"PMI_RANK="):
                    found[int(var[9:])] = int(entry.name)
        time.sleep(0.2)
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=5)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--warmup", type=float, default=10.0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or "mpiexec"
    work = Path(tempfile.mkdtemp(prefix="shards-cpu-"))
    cmd = [
        mpiexec, "-n", str(args.ranks), sys.executable, "-m", "hpccollect", "collect",
        "--env", "CartPole-v1", "--collector", "single", "--frames-per-batch", "100",
        "--shards", "--total-frames", "100000000", "--out", str(work / "run.h5"),
    ]  # fmt: skip
    job = subprocess.Popen(cmd, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        pids = rank_pids(job.pid, args.ranks, time.monotonic() + 120)
        time.sleep(args.warmup)
        before = {r: cpu_seconds(pids[r]) for r in (0, 1)}
        threads_before = thread_ticks(pids[0])
        time.sleep(args.seconds)
        after = {r: cpu_seconds(pids[r]) for r in (0, 1)}
        threads = thread_ticks(pids[0])
    finally:
        job.send_signal(signal.SIGTERM)
        try:
            job.wait(60)
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    cpu0, cpu1 = (after[r] - before[r] for r in (0, 1))
    result = {
        "ranks": args.ranks,
        "seconds": args.seconds,
        "rank0_cpu_s": round(cpu0, 3),
        "rank1_cpu_s": round(cpu1, 3),
        "rank0_per_frame_over_rank1": round(cpu0 / ((args.ranks - 1) * cpu1), 5),
        # where rank 0's CPU went: each thread's clock ticks over the window, by name:tid
        "rank0_thread_ticks": {
            name: ticks - threads_before.get(name, 0)
            for name, ticks in sorted(threads.items())
            if ticks > threads_before.get(name, 0)
        },
    }
    print(json.dumps(result))
    if args.out is not None:
        with args.out.open("a") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
