"""Rank 0's look at its links over the mpi4py transport, against the number of links.

Each time rank 0 looks for a batch it looks at every link it waits on (``wait_ready``: each
link's ``poll(0)``). Here the collector ranks send nothing, so every look finds nothing: the
cost of looking alone, in rank 0's CPU per look (the best of three rounds of 20,000 looks).
Run it on another checkout with ``PYTHONPATH`` to compare two versions of the code.

    python benchmarks/link_look.py --ranks 1 2 8 32
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import _jobs

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "link_look.json"
LOOKS = 20000


def _job() -> None:
    """Every rank under mpiexec: rank 0 looks; the others wait, sleeping, for it to finish."""
    from types import SimpleNamespace

    from hpccollect.transport.base import wait_ready
    from hpccollect.transport.mpi4py_group import MPIGroup, mpi4py_comm, quiesce
    from hpccollect.transport.polled import PolledRankChannel

    comm = mpi4py_comm()
    group = MPIGroup(comm, "link-look")
    groups = SimpleNamespace(messages=group, broadcast=None)
    if comm.Get_rank() == 0:
        links = [PolledRankChannel(groups, p) for p in range(1, comm.Get_size())]
        best = float("inf")
        for _ in range(3):
            cpu = time.process_time()
            for _ in range(LOOKS):
                assert not wait_ready(links, 0.0)
            best = min(best, (time.process_time() - cpu) / LOOKS * 1e6)
        print("RESULT " + json.dumps(best), flush=True)
    done = comm.Ibarrier()  # a blocking barrier would spin the waiting ranks' cores
    while not done.Test():
        time.sleep(0.01)
    group.abort()
    quiesce(5.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 8, 32])
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    mpiexec = _jobs.mpiexec()
    rows = []
    for k in args.ranks:
        cmd = [mpiexec, "-n", str(k + 1), sys.executable, __file__, "--job"]
        us = _jobs.result(cmd, timeout=600)
        rows.append({"links": k, "look_us": round(us, 1)})
        print(f"{k:3d} links: {us:6.1f} us of rank 0's CPU a look", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    if "--job" in sys.argv:
        _job()
    else:
        main()
