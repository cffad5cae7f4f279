"""What a short job costs in CPU, its processes' exit included, against importing torch in the
same run: the processes hpccollect runs itself end without the interpreter's last collection
over torch's objects (``hpccollect/_exit.py``).

Each case runs ``--repeats`` times; each figure is the median CPU time (user and system) of the
whole process tree, and its wall time. The reference rows show what the exit of a process
that imported torch costs: ``import torch`` alone, then the same with ``gc.freeze()`` last.
With ``--old DIR`` (a checkout of an earlier commit, e.g. ``git worktree add /tmp/old HEAD~1``)
the hpccollect rows also run with ``PYTHONPATH=DIR``, that code's hpccollect.

    python benchmarks/process_exit.py --repeats 5 [--old /tmp/old]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "process_exit.json"

#: a user's script: a multi-sync collector whose 2 workers are spawned (TorchRL's default)
SPAWNED = """
from hpccollect import MultiSyncDataCollector
if __name__ == "__main__":
    c = MultiSyncDataCollector(["CartPole-v1"] * 2, None, frames_per_batch=200, total_frames=2000)
    for batch in c:
        pass
    c.shutdown()
"""


def _median(cmd: list[str], repeats: int, cwd: str, pythonpath: str | None) -> tuple[float, float]:
    """(CPU s, wall s) of ``cmd``'s process tree, medians over ``repeats`` runs."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    cpu, wall = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(cmd, cwd=cwd, env=env, timeout=300, check=True, capture_output=True)
        wall.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return statistics.median(cpu), statistics.median(wall)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--old", help="a checkout of earlier code, measured too (PYTHONPATH)")
    args = p.parse_args()
    py = sys.executable
    collect = [py, "-m", "hpccollect", "collect", "--total-frames", "2000", "--quiet"]
    cases = {
        "import torch (reference)": [py, "-c", "import torch"],
        "import torch, then gc.freeze() (reference)": [
            py,
            "-c",
            "import gc, torch; gc.freeze()",
        ],
        "collect --collector single, 2,000 frames": [
            *collect,
            "--collector",
            "single",
            "--out",
            "single.h5",
            "--overwrite",
        ],
        "collect (2 forked workers), 2,000 frames": [*collect, "--out", "multi.h5", "--overwrite"],
        "a script: MultiSyncDataCollector, 2 spawned workers": [py, "spawned.py"],
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "spawned.py").write_text(SPAWNED)
        for case, cmd in cases.items():
            cpu, wall = _median(cmd, args.repeats, tmp, None)
            row = {"case": case, "now_cpu_s": cpu, "now_wall_s": wall}
            if args.old and "reference" not in case:
                row["old_cpu_s"], row["old_wall_s"] = _median(cmd, args.repeats, tmp, args.old)
            rows.append(row)
    print(f"{'case':52s} {'CPU now':>8s} {'CPU old':>8s} {'wall now':>9s} {'wall old':>9s}")
    for row in rows:
        figures = [row.get(key) for key in ("now_cpu_s", "old_cpu_s", "now_wall_s", "old_wall_s")]
        cells = [f"{x:8.2f}" if x is not None else f"{'-':>8s}" for x in figures]
        print(f"{row['case']:52s} {cells[0]} {cells[1]}  {cells[2]}  {cells[3]}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"repeats": args.repeats, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
