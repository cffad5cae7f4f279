"""TorchRL 0.14.1 compatibility: what a user switching by changing an import relies on.

Each test pins one behaviour observed on TorchRL 0.14.1 itself (names, keys, errors, keywords).
"""

from __future__ import annotations

import gymnasium as gym
import h5py
import numpy as np
import pytest
import torch
from conftest import CounterEnv
from tensordict.nn import TensorDictModule
from torch import nn
from torch.distributions import OneHotCategorical

from hpccollect import GymEnv, MultiSyncDataCollector, SyncDataCollector
from hpccollect.errors import EnvError, HpcCollectError, PolicyError
from hpccollect.storage import HDF5Writer, export_d4rl, export_minari, open_dataset

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


# ---------------------------------------------------------------------------- item 24: errors
class RaisesAt(nn.Module):
    """Raises ``error`` at call ``at`` (0: the construction-time probe)."""

    def __init__(self, error: Exception, at: int) -> None:
        super().__init__()
        self.error, self.at, self.calls = error, at, 0

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > self.at:
            raise self.error
        return torch.nn.functional.one_hot(torch.zeros((), dtype=torch.long), 2)


@pytest.mark.parametrize("at", [0, 3])
@pytest.mark.parametrize("error", [ValueError("bad value"), KeyError("k"), IndexError("i")])
def test_policy_errors_keep_their_builtin_class(error, at):
    def collect():
        collector = SyncDataCollector(cartpole, RaisesAt(error, at), frames_per_batch=10)
        try:
            next(iter(collector))
        finally:
            collector.shutdown()

    with pytest.raises(type(error)) as info:
        collect()
    assert isinstance(info.value, PolicyError) and isinstance(info.value, HpcCollectError)
    assert f"raised {type(error).__name__}" in str(info.value)
    assert info.value.__cause__ is error


def test_missing_action_key_is_a_key_error():
    policy = TensorDictModule(nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"])
    with pytest.raises(KeyError) as info:
        SyncDataCollector(cartpole, policy, frames_per_batch=10)
    assert isinstance(info.value, PolicyError)
    assert str(info.value).startswith("the policy did not write the action key 'action'")


class FailingStep(gym.Wrapper):
    def step(self, action):
        raise ValueError("env broke")


def test_env_errors_keep_their_builtin_class():
    collector = SyncDataCollector(
        lambda: FailingStep(cartpole()), None, frames_per_batch=10, total_frames=10
    )
    with pytest.raises(ValueError, match="raised ValueError in step") as info:
        next(iter(collector))
    collector.shutdown()
    assert isinstance(info.value, EnvError) and info.value.step == 0


# ---------------------------------------------------------------------------- item 21: pixels
class ImageEnv(gym.Env):
    """A uint8 ``(H, W, 3)`` image observation, as Atari or a rendering wrapper gives."""

    def __init__(self, shape=(6, 5, 3), high=255) -> None:
        self.observation_space = gym.spaces.Box(0, high, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), 1.0, self.t >= 7, False, {}


@pytest.mark.parametrize(
    ("space", "key"),
    [
        (gym.spaces.Box(0, 255, (6, 5, 3), np.uint8), "pixels"),
        (gym.spaces.Box(0.0, 255.0, (6, 5, 3), np.float32), "pixels"),  # TorchRL ignores dtype
        (gym.spaces.Box(0, 255, (6, 5, 4), np.uint8), "observation"),
        (gym.spaces.Box(0, 255, (3, 6, 5), np.uint8), "observation"),
        (gym.spaces.Box(0, 1, (6, 5, 3), np.uint8), "observation"),
        (gym.spaces.Box(0, 255, (2, 6, 5, 3), np.uint8), "observation"),
    ],
)
def test_image_observation_key_is_torchrl_s(space, key):
    env = ImageEnv()
    env.observation_space = space
    assert GymEnv(env).observation_keys == [(key,)]
    assert GymEnv(gym.vector.SyncVectorEnv([lambda: env] * 2)).observation_keys == [(key,)]


def test_pixels_batch_hdf5_and_exports(tmp_path, monkeypatch):
    collector = SyncDataCollector(ImageEnv, None, frames_per_batch=28, total_frames=28)
    (batch,) = list(collector)
    collector.shutdown()
    assert batch["pixels"].shape == (28, 6, 5, 3) and batch["pixels"].dtype == torch.uint8
    assert batch["next", "pixels"].shape == (28, 6, 5, 3) and "observation" not in batch.keys()
    path = tmp_path / "img.h5"
    with HDF5Writer(path, env=ImageEnv()) as writer:
        writer.extend(batch)
    with open_dataset(path) as ds:
        f = ds.file
        assert "pixels" in f and "next_pixels" in f and "observations" not in f
        assert torch.equal(ds[0:28]["pixels"], batch["pixels"])
    with h5py.File(export_d4rl(path, tmp_path / "img.hdf5")) as f:
        assert f["observations"].shape == (28, 6, 5, 3) and f["observations"].dtype == np.uint8
        np.testing.assert_array_equal(f["next_observations"][:], batch["next", "pixels"].numpy())
        assert f.attrs["observation_encoding"] == "continuous"
    minari = pytest.importorskip("minari")
    export_minari(path, tmp_path / "datasets", "hpc/img-v0")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    episode = next(iter(minari.load_dataset("hpc/img-v0").iterate_episodes()))
    assert episode.observations.shape == (8, 6, 5, 3)  # 7 steps + the last next observation
    np.testing.assert_array_equal(episode.observations[:7], batch["pixels"][:7].numpy())
