"""Worker start-up by start method: a Multi collector's workers spawned (TorchRL's default,
each imports torch for itself) against forked from the collector's own server
(``mp_start_method="forkserver"``: one import, then a fork per worker).

Each measurement is a fresh process that builds a ``MultiSyncDataCollector`` of N CartPole
workers, takes 2 batches of 20 frames a worker and shuts it down. It reports the wall time of
that (construction to shutdown) and the CPU time of every process it started (its reaped
children, the fork server's included), the spawn and fork-server runs interleaved; each figure
is the median of ``--repeats``.

    python benchmarks/worker_start.py
    python benchmarks/worker_start.py --workers 2 4 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "worker_start.json"

_ONE = """
import json, resource, sys, time
from functools import partial

import gymnasium as gym

from hpccollect import MultiSyncDataCollector

if __name__ == "__main__":
    method, n = sys.argv[1], int(sys.argv[2])
    t = time.perf_counter()
    c = MultiSyncDataCollector(
        [partial(gym.make, "CartPole-v1")] * n,
        None,
        frames_per_batch=20 * n,
        total_frames=40 * n,
        mp_start_method=method,
    )
    for _ in c:
        pass
    c.shutdown()
    wall = time.perf_counter() - t
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"wall_s": wall, "children_cpu_s": used.ru_utime + used.ru_stime}))
"""

METHODS = ("spawn", "forkserver")


def one(method: str, n: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _ONE, method, str(n)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    return json.loads(out.splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    rows = []
    for n in args.workers:
        runs: dict[str, list[dict]] = {m: [] for m in METHODS}
        for _ in range(args.repeats):
            for method in METHODS:
                runs[method].append(one(method, n))
        row: dict = {"workers": n}
        for method in METHODS:
            row[f"{method}_wall_s"] = statistics.median(r["wall_s"] for r in runs[method])
            row[f"{method}_cpu_s"] = statistics.median(r["children_cpu_s"] for r in runs[method])
        rows.append(row)
        print(
            f"{n} workers: spawn {row['spawn_wall_s']:.2f} s wall, {row['spawn_cpu_s']:.2f} s "
            f"CPU; forkserver {row['forkserver_wall_s']:.2f} s wall, "
            f"{row['forkserver_cpu_s']:.2f} s CPU",
            flush=True,
        )
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps({"repeats": args.repeats, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
