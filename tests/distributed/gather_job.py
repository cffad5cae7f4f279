"""The script every rank of ``mpiexec -n N`` runs in tests/distributed/test_gather.py (and
tests/slurm/test_nodes.py): a trainer on rank 0 over collector ranks split into groups of
``--gather`` ranks, or one group a node (``node``) (``MPILauncher(gather=...)``).

Each rank writes its pid to ``OUT.pid<rank>`` first. Collecting rank ``r`` (a world rank) runs a
``CounterEnv`` whose episodes last ``r`` steps, so the largest observation of a batch row names
the rank that collected it. Rank 0 takes ``--batches`` batches of ``--per-rank`` frames a rank,
flips the policy's bias after the first and sends it (``update_policy_weights_``), and saves the
batches to ``OUT``. ``--mode raise``: the last collecting rank's env raises in its first batch;
``buffer``: the collector extends a replay buffer, whose extends are saved; ``wait``: the ranks step slowly,
without end (``OUT.started`` once the first batch is in).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from conftest import BiasPolicy, CounterEnv
from tensordict.nn import TensorDictModule

from hpccollect import DistributedDataCollector
from hpccollect.launchers import MPILauncher
from hpccollect.launchers.mpi_gather import gather_groups


class Extends(list):
    """A replay buffer that keeps the batch of each ``extend`` whole, as given (a storage that
    extends along the first dim, as TorchRL's do)."""

    def extend(self, batch):
        self.append(batch.clone())


class Slow(CounterEnv):
    def step(self, action):
        time.sleep(0.01)
        return super().step(action)


class Failing(CounterEnv):
    def step(self, action):
        raise KeyError("the last collecting rank's env fails on purpose")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--gather", default="4", help="'node' or a group size")
    p.add_argument("--backend", default="mpi")
    p.add_argument("--per-rank", type=int, default=16)
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--mode", default="collect")
    p.add_argument("--sync", type=int, default=1)
    p.add_argument("--liveness", type=float, default=30.0)
    a = p.parse_args()
    rank = int(os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or 0)
    size = int(os.environ.get("PMI_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or 1)
    with open(f"{a.out}.pid{rank}", "w") as f:
        f.write(str(os.getpid()))
    gather = a.gather if a.gather == "node" else int(a.gather)
    hosts = [""] * size
    if gather == "node":
        from mpi4py import MPI

        hosts = MPI.COMM_WORLD.allgather(socket.gethostname())
    collecting = sorted(r for group in gather_groups(gather, hosts) for r in group[1:])
    fns = [partial(CounterEnv, r) for r in collecting]
    if a.mode == "raise":
        fns[-1] = partial(Failing, collecting[-1])
    if a.mode == "wait":  # every rank steps slowly, for ever: the test stops one
        fns = [partial(Slow, r) for r in collecting]
    policy = TensorDictModule(BiasPolicy(), ["observation"], ["action"])
    buffer = Extends() if a.mode == "buffer" else None
    collector = DistributedDataCollector(
        fns,
        policy,
        frames_per_batch=a.per_rank * len(collecting),
        total_frames=-1 if a.mode == "wait" else a.batches * a.per_rank * len(collecting),
        launcher=MPILauncher(gather=gather),
        backend=a.backend,
        sync=bool(a.sync),
        start_timeout=120,
        worker_timeout=120,
        liveness_timeout=a.liveness,
        replay_buffer=buffer,
    )
    batches = []
    for i, batch in enumerate(collector):
        if buffer is not None:  # the collector extends it: nothing is yielded
            assert batch is None
            continue
        batches.append(batch.clone())
        if a.mode == "wait":
            open(f"{a.out}.started", "w").close()
        if i == 0:
            with torch.no_grad():
                policy.module.bias.copy_(torch.tensor([0.0, 1.0]))
            collector.update_policy_weights_()
    versions = list(collector.policy_versions)
    collector.shutdown()
    torch.save(
        {
            "batches": [b.to_dict() for b in batches],
            "collecting": collecting,
            "versions": versions,
            "buffer": None if buffer is None else [b.to_dict() for b in buffer],
        },
        a.out,
    )
    print("rank 0 done", flush=True)


if __name__ == "__main__":
    main()
