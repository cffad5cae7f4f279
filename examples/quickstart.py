"""Quick start: collect CartPole-v1 experience with SyncDataCollector, as in TorchRL.

    python examples/quickstart.py

Four CartPoles in a gymnasium SyncVectorEnv, a small MLP actor that samples one-hot actions, and a
replay buffer the batches go to. Prints one line per batch and a summary.
"""

from __future__ import annotations

import time

import gymnasium as gym
import torch
from tensordict.nn import (
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
)
from torch import nn
from torch.distributions import OneHotCategorical

from hpccollect import ReplayBuffer, SyncDataCollector

NUM_ENVS = 4
FRAMES_PER_BATCH = 1_000
TOTAL_FRAMES = 20_000


def make_env() -> gym.vector.VectorEnv:
    return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * NUM_ENVS)


def make_actor() -> ProbabilisticTensorDictSequential:
    net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
    return ProbabilisticTensorDictSequential(
        TensorDictModule(net, in_keys=["observation"], out_keys=["logits"]),
        ProbabilisticTensorDictModule(
            in_keys=["logits"], out_keys=["action"], distribution_class=OneHotCategorical
        ),
    )


def main() -> None:
    torch.manual_seed(0)
    buffer = ReplayBuffer(100_000)
    collector = SyncDataCollector(
        make_env,
        make_actor(),
        frames_per_batch=FRAMES_PER_BATCH,
        total_frames=TOTAL_FRAMES,
        max_frames_per_traj=200,
    )
    collector.set_seed(0)
    returns: list[float] = []
    start = time.perf_counter()
    with collector:
        for i, batch in enumerate(collector):
            buffer.extend(batch)
            done = batch["next", "done"].squeeze(-1)
            # episode returns: sum rewards per trajectory id, keep those that ended here
            ids = batch["collector", "traj_ids"][done]
            for tid in ids.tolist():
                mask = batch["collector", "traj_ids"] == tid
                returns.append(float(batch["next", "reward"][mask].sum()))
            elapsed = time.perf_counter() - start
            print(
                f"batch {i + 1:3d}  shape {list(batch.shape)}  frames {(i + 1) * batch.numel():6d}"
                f"  {(i + 1) * batch.numel() / elapsed:8.0f} frames/s  episodes ended {int(done.sum()):3d}"
            )
    elapsed = time.perf_counter() - start
    print(
        f"collected {TOTAL_FRAMES} frames in {elapsed:.2f} s ({TOTAL_FRAMES / elapsed:.0f} frames/s); "
        f"{len(returns)} episodes ended, mean return {sum(returns) / max(len(returns), 1):.1f}; "
        f"replay buffer holds {len(buffer)} transitions"
    )
    sample = buffer.sample(256)
    keys = sorted("/".join(k) if isinstance(k, tuple) else k for k in sample.keys(True, True))
    print(f"sampled {sample.batch_size[0]} transitions with keys {', '.join(keys)}")


if __name__ == "__main__":
    main()
