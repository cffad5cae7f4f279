"""The job tests/distributed/test_liveness.py stops parts of: a ``DistributedDataCollector``
with two collector ranks and ``liveness_timeout=3``, run as one process (``--launcher mp``) or
under ``mpiexec -n 3`` (``--launcher mpi``).

Rank 0 writes ``OUT.ranks`` (rank 0's pid, then each collector rank's) once it has collected
``--warmup`` batches, then collects on. What came of it goes to ``OUT.result`` as JSON:
``{"error": text, "at": time}`` when the collector raised, or ``{"lost": ranks, "at": time,
"batches_after": n}`` once ``on_worker_failure="continue"`` let a rank go and ``--after``
more batches came; ``{"timeout": n}`` when nothing happened within ``--limit`` s.
``--pause S``: rank 0 sleeps S s between batches (a trainer busy for longer than the timeout);
``--slow S``: each env step sleeps S s (a batch takes longer than the timeout); ``--hold``:
once a rank is lost, write ``OUT.detected`` and shut down only once ``OUT.resume`` exists (the
test lets the lost rank go on first), or after 30 s. ``--weights N``: the ranks act with
``BiasPolicy`` carrying N more float parameters, and rank 0 sends its weights after every batch
(a broadcast larger than the sockets' buffers, which a stopped rank holds). ``--leave``: rank 0
writes its result and leaves its script with the collector open (its exit hooks end it).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
from conftest import BiasPolicy, CounterEnv
from tensordict.nn import TensorDictModule

from hpccollect import DistributedDataCollector
from hpccollect.errors import WorkerError


class Ballasted(BiasPolicy):
    """``BiasPolicy`` with ``n`` more parameters that its actions do not use."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.ballast = torch.nn.Parameter(torch.zeros(n))


class Slow(CounterEnv):
    def __init__(self, n: int, pause: float) -> None:
        super().__init__(n)
        self.pause = pause

    def step(self, action):
        time.sleep(self.pause)
        return super().step(action)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--launcher", default="mp")
    p.add_argument("--backend", default="gloo")
    p.add_argument("--sync", type=int, default=0)
    p.add_argument("--failure", default="raise")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--after", type=int, default=10)
    p.add_argument("--limit", type=float, default=40.0)
    p.add_argument("--pause", type=float, default=0.0)
    p.add_argument("--slow", type=float, default=0.0)
    p.add_argument("--hold", action="store_true")
    p.add_argument("--weights", type=int, default=0)
    p.add_argument("--leave", action="store_true")
    a = p.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's stacks on a hang
    env = partial(Slow, 5, a.slow) if a.slow else partial(CounterEnv, 5)
    policy = None
    if a.weights:
        policy = TensorDictModule(Ballasted(a.weights), ["observation"], ["action"])
    collector = DistributedDataCollector(
        env if a.launcher == "mpi" else [env, env],
        policy,
        frames_per_batch=10 if a.slow else 40,
        total_frames=-1,
        launcher=a.launcher,
        backend=a.backend,
        sync=bool(a.sync),
        on_worker_failure=a.failure,
        liveness_timeout=3,
    )
    out = Path(a.out)
    result: dict = {}
    n = after = 0
    start = time.monotonic()
    try:
        for _ in collector:
            n += 1
            if n == a.warmup:
                pids = [os.getpid(), *(c.pid for c in collector._pool.channels)]
                part = out.with_suffix(".ranks-part")  # renamed: never seen half written
                part.write_text(json.dumps(pids))
                part.rename(out.with_suffix(".ranks"))
            if collector.lost_ranks:
                result.setdefault("at", time.time())
                after += 1
                if after >= a.after:
                    result.update(lost=collector.lost_ranks, batches_after=after)
                    break
            if time.monotonic() - start > a.limit:
                result = {"timeout": n}
                break
            time.sleep(a.pause)
            if a.weights:
                collector.update_policy_weights_()
    except WorkerError as err:
        result = {"error": str(err), "at": time.time()}
    finally:
        if a.hold:
            hold(out)
        if not a.leave:
            collector.shutdown()
    part = out.with_suffix(".result-part")
    part.write_text(json.dumps(result))
    part.rename(out.with_suffix(".result"))


def hold(out: Path) -> None:
    out.with_suffix(".detected").write_text("")
    deadline = time.monotonic() + 30
    while not out.with_suffix(".resume").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


if __name__ == "__main__":
    main()
