"""TorchRL 0.14.1 compatibility: what a user switching by changing an import relies on.

Each test pins one behaviour observed on TorchRL 0.14.1 itself (names, keys, errors, keywords).
"""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from torch import nn
from torch.distributions import OneHotCategorical

from hpccollect import MultiSyncDataCollector

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
