"""What a short job costs in CPU, its processes' exit included, against importing torch in the
same run: the processes hpccollect runs itself end without the interpreter's last collection
over torch's objects (``hpccollect/_exit.py``).

Each case runs ``--repeats`` times (with ``--old``, the two codes alternating); each figure is
the median CPU time (user and system) of the whole process tree, and its wall time. The reference rows show what the exit of a process
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


def _once(cmd: list[str], cwd: str, pythonpath: str | None) -> tuple[float, float]:
    """(CPU s, wall s) of one run of ``cmd``'s process tree."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, timeout=300, check=True, capture_output=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


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
        "collect (2 workers from its fork server), 2,000 frames": [
            *collect,
            "--out",
            "multi.h5",
            "--overwrite",
        ],
        "a script: MultiSyncDataCollector, 2 spawned workers": [py, "spawned.py"],
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "spawned.py").write_text(SPAWNED)
        for case, cmd in cases.items():
            codes = [None] if not args.old or "reference" in case else [None, args.old]
            runs: dict = {code: [] for code in codes}
            for _ in range(args.repeats):  # the codes alternate, so drift weighs on both
                for code in codes:
                    runs[code].append(_once(cmd, tmp, code))
            row = {"case": case}
            for code, name in zip(codes, ("now", "old"), strict=False):
                row[f"{name}_cpu_s"] = statistics.median(cpu for cpu, _ in runs[code])
                row[f"{name}_wall_s"] = statistics.median(wall for _, wall in runs[code])
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
