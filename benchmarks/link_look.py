"""Rank 0's wait for its links over the mpi4py transport, against the number of links.

Each time rank 0 looks for a batch it waits on the links of the ranks it asked. Here the
collector ranks send nothing, so every wait finds nothing: the cost of looking alone, in rank
0's CPU per wait with a timeout of 0 (the best of three rounds of 20,000 waits), and the share
of a core rank 0 spends in waits of 1 s while nothing comes (3 s of them), two ways in the
same job:

- ``each``: a look at each link (``wait_ready``: each link's ``poll(0)``, two probes), the only
  way until the links shared a look, and still the way where they do not;
- ``look``: a wait through the links' shared ``LinkLook``, as the pool waits from
  ``LinkLook.least`` (128) links: two probes for a message from any rank (and one for a goodbye
  every millisecond), whatever the links.

    python benchmarks/link_look.py --ranks 1 2 8 32 64
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


def _best(wait: object) -> float:
    """Rank 0's CPU per call of ``wait`` (us), the best of three rounds."""
    best = float("inf")
    for _ in range(3):
        cpu = time.process_time()
        for _ in range(LOOKS):
            assert not wait()
        best = min(best, (time.process_time() - cpu) / LOOKS * 1e6)
    return best


def _idle(wait: object, seconds: float = 3.0) -> float:
    """The share of a core that ``wait`` (a wait of 1 s that finds nothing) takes meanwhile."""
    cpu, start = time.process_time(), time.monotonic()
    while time.monotonic() - start < seconds:
        assert not wait()
    return (time.process_time() - cpu) / (time.monotonic() - start)


def _job() -> None:
    """Every rank under mpiexec: rank 0 waits; the others wait, sleeping, for it to finish."""
    from types import SimpleNamespace

    from hpccollect.transport.base import wait_ready
    from hpccollect.transport.mpi4py_group import MPIGroup, mpi4py_comm, quiesce
    from hpccollect.transport.polled import PolledRankChannel

    comm = mpi4py_comm()
    group = MPIGroup(comm, "link-look")
    groups = SimpleNamespace(messages=group, broadcast=None)
    if comm.Get_rank() == 0:
        links = [PolledRankChannel(groups, p) for p in range(1, comm.Get_size())]
        shared = links[0].look
        index_of = {id(link): i for i, link in enumerate(links)}
        everyone = set(range(len(links)))

        def look(timeout: float) -> list:  # as the pool waits (``WorkerPool._ready``)
            return shared.wait(timeout, lambda c: index_of.get(id(c)) in everyone)

        each = _best(lambda: wait_ready(links, 0.0))
        at_once = _best(lambda: look(0.0))
        each_idle = _idle(lambda: wait_ready(links, 1.0))
        look_idle = _idle(lambda: look(1.0))
        print("RESULT " + json.dumps([each, at_once, each_idle, look_idle]), flush=True)
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
        each, look, each_idle, look_idle = _jobs.result(cmd, timeout=600)
        rows.append(
            {
                "links": k,
                "each_us": round(each, 1),
                "look_us": round(look, 1),
                "each_idle_core": round(each_idle, 3),
                "look_idle_core": round(look_idle, 3),
            }
        )
        print(
            f"{k:3d} links: a wait looking at each link {each:6.1f} us of rank 0's CPU, "
            f"{each_idle:5.1%} of a core while nothing comes; through the links' look "
            f"{look:5.1f} us, {look_idle:5.1%}",
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    if "--job" in sys.argv:
        _job()
    else:
        main()
