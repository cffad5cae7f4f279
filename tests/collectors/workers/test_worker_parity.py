"""A collector in a worker process runs the policy exactly as the same collector in the calling
process (issue 7, item 19): same call path from the step loop to the policy (the direct tensor
call for a plain module, tensordict's dispatch for a TensorDict module), gradients off, and the
torch thread count the collector was asked for. Nothing here is timed: ``benchmarks/
worker_throughput.py`` measures the speed; these tests pin what the speed depends on.

The actor classes are defined inside functions so that cloudpickle sends them to the workers by
value, as it does for classes defined in a user's script (``__main__``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from tensordict.nn import (
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
)
from tensordict.nn.probabilistic import interaction_type  # tensordict.nn has it from 0.15 only
from torch import nn
from torch.distributions import OneHotCategorical

from hpccollect import MultiSyncDataCollector, SyncDataCollector, aSyncDataCollector

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

#: where the step loop calls the policy (``StepLoop``'s policy side, ``StepPolicy``)
STEP_LOOP = "hpccollect.collectors.loops.step_policy"


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def record_call(out_dir: str) -> None:
    """Write, once per process, how the step loop reached the caller (a policy's forward)."""
    path = Path(out_dir) / f"{os.getpid()}.json"
    frame = sys._getframe(2)  # the caller's caller: the first frame that is not the probe
    chain = []
    while frame is not None:
        module = frame.f_globals.get("__name__", "?")
        chain.append(f"{module}:{getattr(frame.f_code, 'co_qualname', frame.f_code.co_name)}")
        if module == STEP_LOOP:
            break
        frame = frame.f_back
    if chain[-1].endswith("_probe_policy") or path.exists():
        return  # the construction-time check call goes another way; record a collection step
    path.write_text(
        json.dumps(
            {
                "chain": chain,
                "threads": torch.get_num_threads(),
                "grad": torch.is_grad_enabled(),
                "interaction": str(interaction_type()),
            }
        )
    )


def module_actor(out_dir: str) -> nn.Module:
    class ProbeActor(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))

        def forward(self, observation: torch.Tensor) -> torch.Tensor:
            record_call(out_dir)
            return OneHotCategorical(logits=self.net(observation)).sample()

    return ProbeActor()


def td_actor(out_dir: str) -> ProbabilisticTensorDictSequential:
    class ProbeMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))

        def forward(self, observation: torch.Tensor) -> torch.Tensor:
            record_call(out_dir)
            return self.net(observation)

    return ProbabilisticTensorDictSequential(
        TensorDictModule(ProbeMLP(), in_keys=["observation"], out_keys=["logits"]),
        ProbabilisticTensorDictModule(
            in_keys=["logits"], out_keys=["action"], distribution_class=OneHotCategorical
        ),
    )


def records(out_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out_dir.glob("*.json"))]


def collect(collector, batches: int = 2) -> None:
    try:
        for i, _ in enumerate(collector):
            if i + 1 == batches:
                break
    finally:
        collector.shutdown()


@pytest.mark.parametrize("make_actor", [module_actor, td_actor], ids=["module", "td"])
def test_workers_call_the_policy_as_this_process_does(tmp_path, make_actor):
    here, one, two = (tmp_path / name for name in ("here", "async", "multisync"))
    for d in (here, one, two):
        d.mkdir()
    collect(SyncDataCollector(cartpole, make_actor(str(here)), frames_per_batch=16))
    collect(aSyncDataCollector(cartpole, make_actor(str(one)), frames_per_batch=16))
    collect(
        MultiSyncDataCollector(
            [cartpole, cartpole], make_actor(str(two)), frames_per_batch=32, num_sub_threads=2
        )
    )
    (local,), (worker,), workers = records(here), records(one), records(two)
    assert len(workers) == 2
    assert local["chain"][-1].startswith(STEP_LOOP)
    if make_actor is module_actor:  # a plain module is called directly on the tensors
        assert local["chain"][-1].endswith("StepPolicy._act"), local["chain"]
    for remote in [worker, *workers]:
        assert remote["chain"] == local["chain"]
        assert remote["grad"] is False and local["grad"] is False
        assert remote["interaction"] == local["interaction"]
    assert worker["threads"] == 1  # num_sub_threads default
    assert [w["threads"] for w in workers] == [2, 2]
