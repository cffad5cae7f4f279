"""A distributed job on a TorchRL env, with the policy built on each rank by ``policy_factory``:
run under ``mpiexec -n 3`` (``launcher="mpi"``) or as one process (``launcher="mp"``, or
``"submitit"`` on submitit's local executor) by
tests/collectors/test_torchrl_envs.py. Rank 0 saves, to OUT, the keys, shapes and dtypes of a
batch, and the actions of each batch (new weights are sent after the second)."""

from __future__ import annotations

import os
import sys
import warnings

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from conftest import BiasPolicy

from hpccollect.collectors.distributed import DistributedCollector

warnings.filterwarnings("ignore")


def cartpole():
    from torchrl.envs import Compose, DoubleToFloat, GymEnv, StepCounter, TransformedEnv

    return TransformedEnv(GymEnv("CartPole-v1"), Compose(StepCounter(), DoubleToFloat()))


def bias_policy() -> TensorDictModule:
    return TensorDictModule(BiasPolicy(), ["observation"], ["action"])


def main(out: str, launcher: str, backend: str) -> None:
    collector = DistributedCollector(
        [cartpole, cartpole],
        policy_factory=bias_policy,
        frames_per_batch=20,
        total_frames=-1,
        launcher=launcher,
        backend=backend,
        sync=True,
        # submitit: its local executor, jobs' logs next to OUT
        slurm_kwargs={"cluster": "local", "folder": out + ".jobs"}
        if launcher == "submitit"
        else None,
        start_timeout=120.0,
    )
    batches = []
    try:
        for i, batch in enumerate(collector):
            batches.append(batch.clone())
            if i == 1:
                flipped = TensorDict({"module": {"bias": torch.tensor([0.0, 1.0])}}, [])
                collector.update_policy_weights_(flipped)
            if i == 4:
                break
    finally:
        collector.shutdown()
    first = batches[0]
    layout = {
        str(k): (tuple(first.get(k).shape), str(first.get(k).dtype)) for k in first.keys(True, True)
    }
    actions = [b["action"].argmax(-1) for b in batches]
    torch.save({"layout": layout, "names": first.names, "actions": actions}, out)


if __name__ == "__main__":
    main(*sys.argv[1:4])
