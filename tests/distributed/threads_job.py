"""What rank 0 of ``mpiexec -n N`` runs while it collects (tests/distributed/test_mpi.py): its
threads and the pipes it holds, printed as one JSON line after ``THREADS``; every other rank
runs a collector rank. ``BACKEND`` is the transport (gloo or mpi), heartbeats on."""

from __future__ import annotations

import json
import os
import sys
import threading
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from conftest import CounterEnv, descriptors

from hpccollect import DistributedDataCollector


def main() -> None:
    backend = sys.argv[2]  # argv[1]: the output path run_job passes every job
    collector = DistributedDataCollector(
        partial(CounterEnv, 5),
        frames_per_batch=8,
        total_frames=-1,
        launcher="mpi",
        backend=backend,
        sync=False,
        start_timeout=120,
        liveness_timeout=30,
    )
    ranks = collector.num_workers
    it = iter(collector)
    for _ in range(3 * ranks):  # every rank has sent batches and beats by now
        next(it)
    threads = sorted(t.name for t in threading.enumerate())
    held = descriptors("pipe")
    collector.shutdown()
    print("THREADS " + json.dumps({"ranks": ranks, "threads": threads, "pipes": held}))


if __name__ == "__main__":
    main()
