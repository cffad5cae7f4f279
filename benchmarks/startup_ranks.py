"""Start-up against ranks: how long a ``DistributedDataCollector`` job takes from its launch to
its first batch, and to its end, as collector ranks are added, per launcher.

Each figure is one fresh job, timed from the moment it is launched (the benchmark hands the
launch time to the job in ``HPCCOLLECT_BENCH_LAUNCHED``), so every launcher pays its own Python
and torch imports: rank 0's, and the ranks' wherever they import for themselves. The job
collects CartPole, ``100`` frames per rank and batch, and shuts down after its first batch.

Launchers (``--launchers``):

* ``mp-spawn``: ``launcher=MPLauncher("spawn")``, every rank a fresh interpreter (the default
  before ranks forked from a server);
* ``mp``: ``launcher="mp"``, the ranks fork from the job's own server, which imported torch
  and hpccollect once (``hpccollect/collectors/workers/fork_server.py``);
* ``mpiexec``: ``mpiexec -n N+1`` with ``launcher="mpi"`` (gloo between the ranks);
* ``submitit``: ``launcher="submitit_delayed"`` on submitit's local executor (one job whose
  tasks are the ranks).

    python benchmarks/startup_ranks.py --ranks 1 2 4 8 16 32 64
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import _jobs

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "startup_ranks.json"

_JOB = """
import os, sys, time
from hpccollect import DistributedDataCollector, GymEnv
from hpccollect.launchers.mp import MPLauncher

def make():
    return GymEnv("CartPole-v1")

if __name__ == "__main__":
    launcher, ranks, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    kwargs = {}
    if launcher == "mpiexec":
        envs, kwargs["launcher"] = make, "mpi"
    else:
        envs = [make] * ranks
        kwargs["launcher"] = {"mp-spawn": MPLauncher("spawn"), "mp": "mp"}.get(launcher, launcher)
        if launcher == "submitit_delayed":
            kwargs["slurm_kwargs"] = {"cluster": "local", "folder": folder}
    collector = DistributedDataCollector(
        envs, None, frames_per_batch=100 * ranks, total_frames=-1, **kwargs
    )
    next(iter(collector))
    first = time.time() - float(os.environ["HPCCOLLECT_BENCH_LAUNCHED"])
    collector.shutdown()
    print("FIRST", first, flush=True)
"""


def one(launcher: str, ranks: int, script: str, folder: str, mpiexec: str | None) -> dict:
    """One job: seconds from launch to the first batch, and to the job's end."""
    python = [sys.executable, script]
    if launcher == "mpiexec":
        cmd = [mpiexec, "-n", str(ranks + 1), *python, launcher, str(ranks), folder]
    else:
        name = "submitit_delayed" if launcher == "submitit" else launcher
        cmd = [*python, name, str(ranks), folder]
    env = {**os.environ, "HPCCOLLECT_BENCH_LAUNCHED": repr(time.time())}
    start = time.perf_counter()
    out = _jobs.run(cmd, env=env, cwd=folder)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}:\n{out.stderr[-3000:]}")
    first = float(next(x for x in out.stdout.splitlines() if x.startswith("FIRST")).split()[1])
    return {"launcher": launcher, "ranks": ranks, "first_batch_s": first, "job_s": wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--launchers", nargs="+", default=["mp-spawn", "mp", "mpiexec", "submitit"])
    args = p.parse_args()
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "job.py")
        Path(script).write_text(_JOB)
        for ranks in args.ranks:
            for launcher in args.launchers:
                if launcher == "mpiexec" and mpiexec is None:
                    print("no mpiexec beside this Python: skipped", file=sys.stderr)
                    continue
                row = one(launcher, ranks, script, tmp, mpiexec)
                rows.append(row)
                print(
                    f"{launcher:>9} ranks {ranks:3d}: first batch {row['first_batch_s']:6.1f} s, "
                    f"whole job {row['job_s']:6.1f} s",
                    flush=True,
                )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
