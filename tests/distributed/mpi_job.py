"""The script every rank of ``mpiexec -n 3`` runs in tests/distributed/test_mpi.py (and, run
as one plain process with ``--launcher mp``, the reference it is compared with).

Each rank writes its pid to ``OUT.pid<rank>`` first; rank 0 saves the batches it collected and
the policy versions to ``OUT``, with the addresses the job's processes listen on (besides the
sockets hydra's proxy hands every rank). ``--mode``: ``collect`` (plain), ``weights`` (new weights after
the second batch), ``raise-before`` (rank 2 raises before constructing the collector),
``raise-env`` (rank 2's env raises), ``wait`` (collect slowly until killed), ``branch`` (ranks 1..N call ``serve()`` themselves and go on), ``idle`` (envs that
sleep: rank 0 mostly waits; its CPU time over its wall time is saved as ``busy``), ``linger``
(rank 0 finalises MPI itself once done, takes a second more, then writes ``OUT.exited``),
``stream`` (no end to the frames: rank 0 takes 20 batches and shuts the ranks down while they
collect, as a trainer does, with no policy: the ranks' random actions; the shutdown's seconds are
saved as ``shutdown_s``), ``long-batch`` (the same, but a batch takes a rank 3 s and rank 0
stops after the first), ``leave`` (as ``stream``, but rank 0 never calls ``shutdown()``: its
exit hooks stop the ranks), ``wide`` (large batches, kept as yielded: no ``clone()``), ``narrow``
(small ones, kept so).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from pathlib import Path

import finalized_note  # noqa: F401 - its exit hook first, so that it runs after hpccollect's

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
from conftest import BiasPolicy, CounterEnv, WideCounter, listening_addresses
from tensordict.nn import TensorDictModule

from hpccollect import DistributedDataCollector


class Failing(CounterEnv):
    def step(self, action):
        note_raise()
        raise KeyError("rank 2's env fails on purpose")


def note_raise() -> None:
    """When this process raised (``OUT.raised``): the test measures how long the job took to
    end from there."""
    Path(os.environ["MPI_JOB_OUT"] + ".raised").write_text(repr(time.time()))


class Slow(CounterEnv):
    pause = 0.01

    def step(self, action):
        time.sleep(self.pause)
        return super().step(action)


class Sleepy(Slow):
    pause = 0.05


class LongSteps(Slow):
    pause = 0.25  # a rank's 12-step batch takes 3 s: a stop waits that long


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--launcher", default="mpi")
    p.add_argument("--backend", default="gloo")
    p.add_argument("--sync", type=int, default=1)
    p.add_argument("--mode", default="collect")
    a = p.parse_args()
    rank = int(os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or 0)
    with open(f"{a.out}.pid{rank}", "w") as f:
        f.write(str(os.getpid()))
    os.environ["MPI_JOB_OUT"] = a.out  # the ranks' envs inherit it
    if a.mode == "raise-before" and rank == 2:
        note_raise()
        raise RuntimeError("rank 2 fails before the collector exists")
    if a.mode == "branch" and rank != 0:
        from hpccollect.distributed import serve

        serve(timeout=60)
        Path(f"{a.out}.served{rank}").write_text("returned")
        return
    slow = {"wait": Slow, "idle": Sleepy, "wide": WideCounter, "long-batch": LongSteps}
    slow["narrow"] = partial(WideCounter, width=4)
    kept = a.mode in ("wide", "narrow")
    second = {"raise-env": Failing, **slow}.get(a.mode, CounterEnv)
    first = slow.get(a.mode, CounterEnv)
    policy = TensorDictModule(BiasPolicy(), ["observation"], ["action"])
    collector = DistributedDataCollector(
        [partial(first, 3), partial(second, 4)],
        None if a.mode in ("stream", "leave") else policy,  # no weights: no thread waits
        frames_per_batch=24,
        total_frames=-1 if a.mode in ("wait", "stream", "long-batch", "leave") else 240,
        launcher=a.launcher,
        backend=a.backend,
        sync=bool(a.sync),
        start_timeout=60,
        worker_timeout=60,
        track_policy_version=a.mode == "weights",
    )
    collector.set_seed(7)
    batches = []
    wall, cpu = time.perf_counter(), time.process_time()
    for i, batch in enumerate(collector):
        batches.append(batch if kept else batch.clone())
        if i == 0:
            open(f"{a.out}.started", "w").close()
            pids = [
                int(Path(f"{a.out}.pid{r}").read_text())
                for r in range(3 if a.launcher == "mpi" else 1)
            ]
            pids += [c.pid for c in collector._pool.channels if c.pid is not None]
            addresses = listening_addresses(sorted(set(pids)), besides=os.getppid())
        if a.mode == "weights" and i == 1:
            with torch.no_grad():
                policy.module.bias.copy_(torch.tensor([0.0, 1.0]))
            collector.update_policy_weights_()
        if (a.mode in ("stream", "leave") and i == 19) or (a.mode == "long-batch" and i == 0):
            break
    busy = (time.process_time() - cpu) / (time.perf_counter() - wall)
    versions = list(collector.policy_versions)
    stop = time.perf_counter()
    if a.mode != "leave":
        collector.shutdown()
    shutdown_s = time.perf_counter() - stop
    torch.save(
        {
            "batches": [b.to_dict() for b in batches],
            "versions": versions,
            "busy": busy,
            "listening": addresses,
            "shutdown_s": shutdown_s,
        },
        a.out,
    )
    print("rank 0 done", flush=True)
    if a.mode == "linger":
        from mpi4py import MPI

        from hpccollect.transport.mpi4py_group import quiesce

        quiesce()
        MPI.Finalize()  # the collector ranks leave now
        time.sleep(1.0)
        Path(f"{a.out}.exited").write_text("rank 0 ended by itself")


if __name__ == "__main__":
    main()
