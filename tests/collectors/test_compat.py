"""TorchRL 0.14.1 compatibility: what a user switching by changing an import relies on.

Each test pins one behaviour observed on TorchRL 0.14.1 itself (names, keys, errors, keywords).
"""

from __future__ import annotations

import multiprocessing as mp
import time

import gymnasium as gym
import h5py
import numpy as np
import pytest
import torch
from conftest import CounterEnv
from tensordict.nn import TensorDictModule
from torch import nn
from torch.distributions import OneHotCategorical

from hpccollect import (
    DistributedDataCollector,
    GymEnv,
    MultiaSyncDataCollector,
    MultiSyncDataCollector,
    SyncDataCollector,
)
from hpccollect._compat import pad_keeps_names
from hpccollect.errors import (
    ArgumentTypeError,
    ArgumentValueError,
    EnvError,
    HpcCollectError,
    PolicyError,
    WorkerError,
)
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
        # one env: [T] -> [None, "time"] (unnamed on tensordict 0.14, whose pad drops names)
        (lambda: CounterEnv(3), (4, 3), [None, "time" if pad_keeps_names() else None]),
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


# ---------------------------------------------------------------------------- item 23: keywords
class TakesData(nn.Module):
    """Reads and writes a TensorDict, but its argument's name does not say so."""

    def forward(self, data):
        data.set("action", torch.nn.functional.one_hot(data["observation"][..., 0].long() * 0, 2))
        return data


def test_sync_keywords_and_attributes_as_torchrl():
    def make(**kw):
        return SyncDataCollector(cartpole, None, frames_per_batch=10, total_frames=20, **kw)

    # the attribute values TorchRL 0.14.1 gives for the same arguments
    for kw, expected in [
        ({}, (None, None, None, 0, False)),
        ({"device": "cpu"}, ("cpu", "cpu", "cpu", 0, False)),
        ({"env_device": "cpu", "max_frames_per_traj": -3}, (None, None, "cpu", -3, False)),
        ({"env_device": "cpu", "policy_device": "cpu"}, ("cpu", "cpu", "cpu", 0, False)),
        ({"max_frames_per_traj": 50, "reset_at_each_iter": True}, (None, None, None, 50, True)),
    ]:
        collector = make(**kw)
        got = (
            collector.storing_device,
            collector.policy_device,
            collector.env_device,
            collector.max_frames_per_traj,
            collector.reset_at_each_iter,
        )
        collector.shutdown()
        assert got == tuple(torch.device(v) if isinstance(v, str) else v for v in expected)
    for use_buffers in (True, False, None):  # no effect on the output
        collector = make(use_buffers=use_buffers)
        assert next(iter(collector)).batch_size == (10,)
        collector.shutdown()
    collector = make(track_traj_ids=False)
    batch = next(iter(collector))
    collector.shutdown()
    assert "collector" not in batch.keys() and ("next", "reward") in batch.keys(True)
    with pytest.raises(ValueError, match="split_trajs=True needs the trajectory ids"):
        make(track_traj_ids=False, split_trajs=True)
    with pytest.raises(PolicyError):  # wrapped over the observation, it gets a tensor
        SyncDataCollector(cartpole, TakesData(), frames_per_batch=10)
    collector = SyncDataCollector(cartpole, TakesData(), frames_per_batch=10, trust_policy=True)
    assert collector.trust_policy and next(iter(collector))["action"].shape == (10, 2)
    collector.shutdown()


def slow_cartpole() -> gym.Env:
    return SlowStep(gym.make("CartPole-v1"))


class SlowStep(gym.Wrapper):
    def step(self, action):
        time.sleep(0.02)
        return self.env.step(action)


@pytest.mark.slow
@pytest.mark.parametrize("cat_results", ["stack", -1])
def test_multisync_preemptive_threshold(cat_results):
    collector = MultiSyncDataCollector(
        [cartpole, slow_cartpole],
        None,
        frames_per_batch=200,
        total_frames=400,
        preemptive_threshold=0.5,
        cat_results=cat_results,
    )
    batches = list(collector)
    collector.shutdown()
    real = 0
    for batch in batches:
        ids = batch["collector", "traj_ids"]
        if cat_results == "stack":
            assert batch.batch_size == (2, 100) and batch.names == [None, "time"]
            mask = batch["collector", "mask"]
            assert torch.equal(mask, ids != -1) and mask[0].all() and not mask[1].all()
            assert (batch["observation"][~mask] == 0).all()  # padding is zeros
            real += int(mask.sum())
        else:
            assert batch.batch_dims == 1 and 100 < batch.numel() < 200  # padding left out
            assert "mask" not in batch["collector"].keys() and (ids != -1).all()
            real += batch.numel()
    # only real frames count: more rounds than total_frames / frames_per_batch
    assert len(batches) > 2 and real >= 400


@pytest.mark.slow
def test_multi_num_threads_reset_and_threshold_one():
    before = torch.get_num_threads()
    collector = MultiSyncDataCollector(
        lambda: CounterEnv(1000),
        None,
        num_workers=2,
        frames_per_batch=10,
        preemptive_threshold=1.0,  # nobody is ever stopped: no mask, as TorchRL
        num_threads=1,
    )
    try:
        assert torch.get_num_threads() == 1
        batches = iter(collector)
        first = next(batches)
        assert "mask" not in first["collector"].keys()
        assert first["observation"][:, 0, 0].tolist() == [0, 0]
        collector.reset(reset_idx=[True, False])
        second = next(batches)
        assert second["observation"][:, 0, 0].tolist() == [0, 5]  # worker 0 starts over
        assert second["collector", "traj_ids"][0, 0] not in first["collector", "traj_ids"][0]
        collector.reset()
        assert next(batches)["observation"][:, 0, 0].tolist() == [0, 0]
    finally:
        collector.shutdown()
    assert torch.get_num_threads() == before
    collector = MultiaSyncDataCollector(
        [cartpole], None, frames_per_batch=10, total_frames=10, preemptive_threshold=0.5
    )
    assert torch.get_num_threads() == max(1, before - 1)  # TorchRL's default
    collector.shutdown()
    assert torch.get_num_threads() == before


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        # checked here, before a worker or rank starts, as the Sync collector checks them
        (lambda: MultiSyncDataCollector([cartpole] * 2, 5, frames_per_batch=10), ArgumentTypeError,
         "policy must be a TensorDictModule, an nn.Module, a callable or None; got int"),
        (lambda: MultiSyncDataCollector([cartpole] * 2, None, frames_per_batch=10,
                                        create_env_kwargs=5),
         ArgumentTypeError, "create_env_kwargs must be a dict of keyword arguments"),
        (lambda: MultiaSyncDataCollector([cartpole] * 2, None, frames_per_batch=10,
                                         create_env_kwargs=[{}, [1]]),
         ArgumentTypeError, r"create_env_kwargs must be .*got \[1\]"),
        (lambda: MultiaSyncDataCollector([cartpole], None, frames_per_batch=10,
                                         update_at_each_batch="yes"),
         ArgumentTypeError, "update_at_each_batch"),
        (lambda: DistributedDataCollector([cartpole], 5, frames_per_batch=10, launcher="mp"),
         ArgumentTypeError, "policy must be a TensorDictModule"),
        (lambda: SyncDataCollector(cartpole, None, frames_per_batch=10, create_env_kwargs=[1]),
         ArgumentTypeError, "create_env_kwargs must be a dict"),
        # an env given built cannot take them: refused, not dropped (as for TorchRL's envs)
        (lambda: SyncDataCollector(cartpole(), None, frames_per_batch=10,
                                   create_env_kwargs={"render_mode": "rgb_array"}),
         ArgumentValueError, "create_env_kwargs were given, but create_env_fn is an env instance"),
        (lambda: SyncDataCollector(GymEnv("CartPole-v1"), None, frames_per_batch=10,
                                   create_env_kwargs={"render_mode": "rgb_array"}),
         ArgumentValueError, "env instance of type GymEnv that cannot take them"),
    ],
    ids=["multi-policy", "multi-kwargs", "multi-kwargs-list", "update_at_each_batch",
         "distributed-policy", "sync-kwargs", "gym-instance-kwargs", "gymenv-instance-kwargs"],
)  # fmt: skip
def test_policy_and_env_kwargs_mistakes_are_refused_before_any_process(make, error, message):
    with pytest.raises(error, match=message) as refused:
        make()
    assert not isinstance(refused.value, WorkerError)  # not a worker's report of it
    assert not mp.active_children()


def test_multi_keywords_refused_before_any_process():
    with pytest.raises(ValueError, match="only MultiSyncDataCollector concatenates"):
        MultiaSyncDataCollector([cartpole], None, frames_per_batch=10, cat_results=-1)
    with pytest.raises(ValueError, match="preemptive_threshold must be a number between 0.0"):
        MultiSyncDataCollector([cartpole], None, frames_per_batch=10, preemptive_threshold=1.5)
    with pytest.raises(ValueError, match="num_threads"):
        MultiSyncDataCollector([cartpole], None, frames_per_batch=10, num_threads=0)
