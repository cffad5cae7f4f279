"""How long ``python -m hpccollect`` takes for what needs no torch: ``--help``, a mistake on
its command line (alone and on every rank of an ``mpiexec`` job), and ``inspect`` of a dataset,
against importing torch in the same run.

These import nothing heavy: the package's names load on first use
(``hpccollect._lazy.lazy_exports``), and reading a dataset's description needs h5py and numpy
only. The reference is what every such command paid before: ``python -c "import torch"``.
With ``--old DIR`` (a checkout of an earlier commit, e.g. ``git worktree add /tmp/old
070980f``) the same commands also run with ``PYTHONPATH=DIR``, that code's hpccollect.

Each figure is the median wall time of ``--repeats`` fresh runs.

    python benchmarks/cli_start.py --repeats 5 [--old /tmp/old] [--ranks 8]
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
RESULTS = HERE / "results" / "cli_start.json"
MISTAKE = ["-m", "hpccollect", "collect", "--total-frames", "-5"]


def _median_wall(cmd: list[str], repeats: int, cwd: str, pythonpath: str | None) -> float:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(cmd, cwd=cwd, env=env, timeout=300, capture_output=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--ranks", type=int, default=8, help="ranks of the mpiexec rows")
    p.add_argument("--old", help="a checkout of earlier code, measured too (PYTHONPATH)")
    args = p.parse_args()
    py = sys.executable
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(py))
    cases = {
        "import torch (reference)": [py, "-c", "import torch"],
        "--help": [py, "-m", "hpccollect", "--help"],
        "collect --total-frames -5": [py, *MISTAKE],
    }
    if mpiexec is not None:
        n = ["-n", str(args.ranks)]
        cases[f"mpiexec -n {args.ranks}: import torch (reference)"] = [
            mpiexec,
            *n,
            py,
            "-c",
            "import torch",
        ]
        cases[f"mpiexec -n {args.ranks}: collect --total-frames -5"] = [mpiexec, *n, py, *MISTAKE]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        collect = ["collect", "--total-frames", "2000", "--out", "run.h5", "--quiet"]
        subprocess.run(
            [py, "-m", "hpccollect", *collect],
            cwd=tmp,
            check=True,
            timeout=300,
            capture_output=True,
        )
        cases["inspect run.h5 (2,000 CartPole frames)"] = [
            py,
            "-m",
            "hpccollect",
            "inspect",
            "run.h5",
        ]
        for case, cmd in cases.items():
            row = {"case": case, "now_s": _median_wall(cmd, args.repeats, tmp, None)}
            if args.old and "reference" not in case:
                row["old_s"] = _median_wall(cmd, args.repeats, tmp, args.old)
            rows.append(row)
    print(f"{'case':48s} {'now (s)':>8s} {'old (s)':>8s}")
    for row in rows:
        old = f"{row['old_s']:8.2f}" if "old_s" in row else f"{'':8s}"
        print(f"{row['case']:48s} {row['now_s']:8.2f} {old}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"repeats": args.repeats, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
