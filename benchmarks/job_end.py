"""How long an MPI job of ``python -m hpccollect collect --shards`` takes to end once its
launcher is told to stop, as a scheduler or Ctrl-C tells it: from the signal to the launcher's
exit, and to the end of the job's last process.

Each round starts ``LAUNCHER -n 3 python -m hpccollect collect`` (rank 0 and 2 collector ranks,
CartPole, 100 frames a batch, no end to the frames), waits for its first progress line, sends
the launcher the signal and follows every process the launcher started until none is left.
A launcher that does not pass the signal on (Intel MPI's ``mpirun`` script, which dies of it)
leaves the ranks to notice they were orphaned (``hpccollect/launchers/launcher_watch.py``):
then the launcher's exit comes at once and the job's end is the figure that counts.

    python benchmarks/job_end.py                       # MPICH's mpiexec beside this Python
    python benchmarks/job_end.py --launcher .mpi/impi/bin/mpirun \\
        --libmpi .mpi/impi/lib/libmpi.so.12            # Intel MPI's mpirun (tests/all.sh's)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _jobs

from hpccollect._launchers import alive, descendants

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "job_end.json"
_PROGRESS = re.compile(r"\] [1-9]\d*/100000000 frames")
_START_LIMIT = 180.0  # s a job may take to print its first progress line
_END_LIMIT = 120.0  # s a job may take to end once stopped; past it the round fails


def one(launcher: str, stop: signal.Signals, env: dict[str, str], folder: Path) -> dict:
    """One job, stopped at its first progress line: seconds from the signal to the launcher's
    exit and to the end of the job's last process."""
    cmd = [launcher, "-n", "3", *_oversubscribe(launcher), sys.executable, "-m", "hpccollect"]
    cmd += ["collect", "--env", "CartPole-v1", "--collector", "single"]
    cmd += ["--frames-per-batch", "100", "--total-frames", "100000000"]
    cmd += ["--out", "run.h5", "--overwrite", "--shards"]
    log = folder / "job.log"
    with open(log, "w") as err, open(folder / "job.out", "w") as out:
        proc = subprocess.Popen(
            cmd, cwd=folder, env=env, stdout=out, stderr=err, start_new_session=True
        )
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + _START_LIMIT
        while not _PROGRESS.search(log.read_text()):
            seen |= set(descendants(proc.pid))
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{' '.join(cmd)} did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.05)
        seen |= set(descendants(proc.pid))
        stopped = time.monotonic()
        proc.send_signal(stop)
        proc.wait(_END_LIMIT)
        launcher_s = time.monotonic() - stopped
        while any(alive(p) for p in seen):
            if time.monotonic() - stopped > _END_LIMIT:
                raise SystemExit(f"the job did not end {_END_LIMIT:g} s after {stop.name}")
            time.sleep(0.01)
        job_s = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in seen:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    if "stopped early by" not in (folder / "job.out").read_text():
        raise SystemExit(f"the job did not stop as asked:\n{log.read_text()[-2000:]}")
    return {"launcher_s": launcher_s, "job_s": job_s}


def _oversubscribe(launcher: str) -> list[str]:
    """Open MPI's launchers refuse more ranks than cores unless told."""
    return ["--oversubscribe"] if "ompi_info" in os.listdir(os.path.dirname(launcher)) else []


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--launcher", default=None, help="mpiexec or mpirun (default: MPICH's)")
    p.add_argument("--libmpi", default=None, help="the MPI library mpi4py loads (MPI4PY_LIBMPI)")
    p.add_argument("--signal", default="SIGTERM", choices=["SIGTERM", "SIGINT", "SIGUSR1"])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    launcher = os.path.abspath(args.launcher) if args.launcher else _jobs.mpiexec()
    env = {**os.environ, "PATH": os.path.dirname(launcher) + os.pathsep + os.environ["PATH"]}
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if args.libmpi:
        env["MPI4PY_LIBMPI"] = os.path.abspath(args.libmpi)
    stop = signal.Signals[args.signal]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            row = one(launcher, stop, env, Path(tmp))
            rows.append(row)
            print(
                f"round {i + 1}: launcher exited {row['launcher_s']:5.2f} s, "
                f"job ended {row['job_s']:5.2f} s after {stop.name}",
                flush=True,
            )
    ends = [r["job_s"] for r in rows]
    print(f"job's end: median {statistics.median(ends):.2f} s, {min(ends):.2f}-{max(ends):.2f} s")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps({"launcher": launcher, "signal": stop.name, "rows": rows}, indent=1)
    )


if __name__ == "__main__":
    main()
