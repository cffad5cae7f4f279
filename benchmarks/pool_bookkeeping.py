"""Rank 0's Python per batch that does not grow with its ranks: a batch that another wait took in
is found for the cost of a few kept replies, not of a look at every rank's inbox.

When rank 0 looks at its ranks' links it takes in every batch that came (``WorkerPool.wait_any``)
and keeps all but one (``_keep``); the next waits find them there (``_from_inbox``). This times
that find at 32, 1,000 and 10,000 workers waited on (a set of indices, as the gatherings pass),
with the kept batch from the last worker: no channel is touched, so it is the bookkeeping alone.
Before, each find walked every index waited on (and ``_wait_batch`` sorted them first): 3.3, 45
and 375 us at 32, 1,000 and 10,000 workers on this 2-core machine (eb7bc78).

    python benchmarks/pool_bookkeeping.py
"""

from __future__ import annotations

import argparse
import json
import timeit
from pathlib import Path

from hpccollect.collectors.workers.pool import WorkerPool
from hpccollect.protocol import Reply

RESULTS = Path(__file__).resolve().parent / "results" / "pool_bookkeeping.json"


def find_us(workers: int, rounds: int = 2000) -> float:
    """us to keep a batch of the last of ``workers`` and find it again (best of five)."""
    pool = WorkerPool([None] * workers)  # no channel is used: nothing to shut down
    pool._closed = True
    waited = set(range(workers))
    last = workers - 1

    def one() -> None:
        pool._keep(last, (Reply.BATCH, None))
        if pool.wait_any(waited, Reply.BATCH, 1.0)[0] != last:
            raise AssertionError("the kept batch was not found")

    return min(timeit.repeat(one, number=rounds, repeat=5)) / rounds * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[32, 1000, 10000])
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    rows = []
    for n in args.workers:
        us = find_us(n)
        rows.append({"workers": n, "find_us": round(us, 2)})
        print(f"{n:6d} workers: {us:6.2f} us to find a batch another wait took in", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
