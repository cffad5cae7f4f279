"""What the benchmark scripts share: the CartPole actor and env constructor."""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn
from torch.distributions import OneHotCategorical


def mlp() -> nn.Module:
    """The 2x64 MLP every benchmark uses: 4 observations -> 2 logits."""
    return nn.Sequential(
        nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2)
    )


class Actor(nn.Module):
    """observation -> one-hot action sampled from OneHotCategorical(logits=mlp(obs))."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return OneHotCategorical(logits=self.net(observation)).sample()


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")
