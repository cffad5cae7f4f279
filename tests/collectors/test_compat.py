"""TorchRL 0.14.1 compatibility: what a user switching by changing an import relies on.

Each test pins one behaviour observed on TorchRL 0.14.1 itself (names, keys, errors, keywords).
"""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from conftest import CounterEnv
from torch import nn
from torch.distributions import OneHotCategorical

from hpccollect import MultiSyncDataCollector, SyncDataCollector

pytestmark = pytest.mark.timeout(120)


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


class SamplingActor(nn.Module):
    """observation -> one-hot action sampled from the global torch generator."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 2)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return OneHotCategorical(logits=self.net(observation)).sample()


# ---------------------------------------------------------------------------- item 22: seeds
def _multisync_actions(seed: int) -> torch.Tensor:
    collector = MultiSyncDataCollector(
        [cartpole, cartpole], SamplingActor(), frames_per_batch=100, total_frames=200
    )
    try:
        collector.set_seed(seed)
        return torch.cat([b["action"] for b in collector], 1)
    finally:
        collector.shutdown()


@pytest.mark.slow
def test_multisync_set_seed_makes_a_stochastic_actor_reproducible():
    first, again, other = (_multisync_actions(s) for s in (7, 7, 8))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


# ---------------------------------------------------------------------------- item 20: split names
def counter_vec(n: int, length: int):
    return lambda: gym.vector.SyncVectorEnv([lambda: CounterEnv(length)] * n)


@pytest.mark.parametrize(
    ("make", "shape", "names"),
    [
        (lambda: CounterEnv(3), (4, 3), [None, "time"]),  # one env: [T] -> [None, "time"]
        (counter_vec(2, 3), (4, 3), [None, None]),  # padded split of [N, T]: unnamed
        (counter_vec(2, 50), (2, 6), [None, "time"]),  # every trajectory spans T: kept as is
    ],
)
def test_split_trajs_names_match_torchrl(make, shape, names):
    collector = SyncDataCollector(make, None, frames_per_batch=12, split_trajs=True)
    batch = next(iter(collector))
    collector.shutdown()
    assert tuple(batch.batch_size) == shape
    assert batch.names == names
    assert batch["collector", "mask"].shape == shape


@pytest.mark.slow
def test_multisync_split_trajs_names_time():
    collector = MultiSyncDataCollector(
        [counter_vec(2, 3)] * 2, None, frames_per_batch=24, total_frames=24, split_trajs=True
    )
    (batch,) = list(collector)
    collector.shutdown()
    assert batch.names == [None, "time"] and batch["collector", "mask"].sum() == 24
