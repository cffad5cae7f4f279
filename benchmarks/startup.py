"""Start-up: what a fresh process, a collector worker and an MPI rank cost before they collect.

Each row is measured in fresh processes with this checkout's Python and, given ``--old-python``,
with another environment's Python whose hpccollect is another checkout (a venv of its own: a
spawned worker or rank imports the package its interpreter finds), runs interleaved. Rows:

* ``import``: ``python -c "import hpccollect, tensordict"``, wall time of the whole process
  (``import hpccollect`` alone imports neither torch nor tensordict).
* ``2 workers``: a ``MultiSyncDataCollector`` of two CartPole workers, construction to its
  first batch (the workers' start-up is most of it), measured inside the process.
* ``mpiexec -n 3``: ``python -m hpccollect collect`` of 2 x 200 CartPole frames under
  ``mpiexec -n 3``, wall time of the whole job (three ranks start side by side).

Each figure is the median of ``--repeats`` runs.

    python benchmarks/startup.py --repeats 5 [--old-python /tmp/oldvenv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "startup.json"

_WORKERS = """
import time
t = time.perf_counter()
from hpccollect import GymEnv, MultiSyncDataCollector

def make():
    return GymEnv("CartPole-v1")

if __name__ == "__main__":
    c = MultiSyncDataCollector([make, make], None, frames_per_batch=100, total_frames=100)
    next(iter(c))
    print(time.perf_counter() - t)
    c.shutdown()
"""


def _wall(cmd: list[str], cwd: str) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, timeout=300, capture_output=True)
    return time.perf_counter() - t


def _workers(python: str, script: str, cwd: str) -> float:
    done = subprocess.run(
        [python, script], cwd=cwd, check=True, timeout=300, capture_output=True, text=True
    )
    return float(done.stdout.split()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--old-python", help="another environment's Python, measured alike")
    args = p.parse_args()
    pythons = {"now": sys.executable, **({"old": args.old_python} if args.old_python else {})}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "workers.py")
        Path(script).write_text(_WORKERS)
        cases = {
            "import": lambda py: _wall([py, "-c", "import hpccollect, tensordict"], tmp),
            "2 workers": lambda py: _workers(py, script, tmp),
        }
        if shutil.which("mpiexec", path=os.path.dirname(sys.executable)):

            def collect(py: str) -> float:
                mpiexec = shutil.which("mpiexec", path=os.path.dirname(py))
                out = os.path.join(tmp, f"d{time.monotonic_ns()}.h5")
                return _wall([mpiexec, "-n", "3", py, "-m", "hpccollect", "collect",
                              "--frames-per-batch", "200", "--total-frames", "400", "--quiet",
                              "--out", out], tmp)  # fmt: skip

            cases["mpiexec -n 3"] = collect
        else:
            print("no mpiexec beside this Python: the rank row is left out", file=sys.stderr)
        for name, measure in cases.items():
            times: dict[str, list[float]] = {side: [] for side in pythons}
            for _ in range(args.repeats):
                for side, python in pythons.items():
                    times[side].append(measure(python))
            row = {"case": name, **{f"{s}_s": statistics.median(t) for s, t in times.items()}}
            rows.append(row)
            print(f"{name:>14}: " + ", ".join(f"{s} {row[f'{s}_s']:.2f} s" for s in pythons),
                  flush=True)  # fmt: skip
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"repeats": args.repeats, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
