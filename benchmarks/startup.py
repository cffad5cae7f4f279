"""Start-up: what a fresh process, a collector worker and an MPI rank cost before they collect.

Each row is measured twice in the same run, in fresh processes: "eager" with
``HPCCOLLECT_EAGER_DYNAMO=1`` (tensordict's import imports ``torch._dynamo``, as it did before
hpccollect deferred it) and "deferred" (the default; see ``hpccollect/_startup.py``). The
variable reaches every worker and rank the measured process starts. Rows:

* ``import``: ``python -c "import hpccollect, tensordict"``, wall time of the whole process
  (``import hpccollect`` alone imports neither torch nor tensordict).
* ``2 workers``: a ``MultiSyncDataCollector`` of two CartPole workers, construction to its
  first batch (the workers' start-up is most of it), measured inside the process.
* ``mpiexec -n 3``: ``python -m hpccollect collect`` of 2 x 200 CartPole frames under
  ``mpiexec -n 3``, wall time of the whole job (three ranks start side by side).

Each figure is the median of ``--repeats`` runs, eager and deferred runs interleaved.

    python benchmarks/startup.py --repeats 5
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


def _env(eager: bool) -> dict[str, str]:
    return {**os.environ, "HPCCOLLECT_EAGER_DYNAMO": "1" if eager else "0"}


def _wall(cmd: list[str], eager: bool, cwd: str) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, env=_env(eager), cwd=cwd, check=True, timeout=300, capture_output=True)
    return time.perf_counter() - t


def _workers(script: str, eager: bool, cwd: str) -> float:
    out = subprocess.run(
        [sys.executable, script],
        env=_env(eager),
        cwd=cwd,
        check=True,
        timeout=300,
        capture_output=True,
        text=True,
    ).stdout
    return float(out.split()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "workers.py")
        Path(script).write_text(_WORKERS)
        cases = {
            "import": lambda eager: _wall(
                [sys.executable, "-c", "import hpccollect, tensordict"], eager, tmp
            ),
            "2 workers": lambda eager: _workers(script, eager, tmp),
        }
        if mpiexec:
            collect = [mpiexec, "-n", "3", sys.executable, "-m", "hpccollect", "collect",
                       "--frames-per-batch", "200", "--total-frames", "400", "--quiet"]  # fmt: skip
            cases["mpiexec -n 3"] = lambda eager: _wall(
                [*collect, "--out", os.path.join(tmp, f"d{time.monotonic_ns()}.h5")], eager, tmp
            )
        else:
            print("no mpiexec beside this Python: the rank row is left out", file=sys.stderr)
        for name, measure in cases.items():
            times: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(args.repeats):
                for eager in (True, False):
                    times[eager].append(measure(eager))
            row = {
                "case": name,
                "eager_s": statistics.median(times[True]),
                "deferred_s": statistics.median(times[False]),
            }
            row["saved"] = 1 - row["deferred_s"] / row["eager_s"]
            rows.append(row)
            print(f"{name:>14}: eager {row['eager_s']:.2f} s, deferred {row['deferred_s']:.2f} s "
                  f"({row['saved']:.0%} less)", flush=True)  # fmt: skip
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"repeats": args.repeats, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
