"""GymEnv: keys, dtypes, shapes and specs as TorchRL's gym wrapper gives them; vector autoreset."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import CounterEnv

from hpccollect.envs import (
    Binary,
    Bounded,
    Categorical,
    GymEnv,
    MultiCategorical,
    MultiOneHot,
    OneHot,
    make_env,
)
from hpccollect.errors import ArgumentTypeError, ArgumentValueError, EnvError


def test_cartpole_specs_and_td_api():
    env = GymEnv("CartPole-v1")
    assert env.batch_size == torch.Size([])
    obs_spec = env.observation_spec["observation"]
    assert (
        isinstance(obs_spec, Bounded) and obs_spec.shape == (4,) and obs_spec.dtype == torch.float32
    )
    assert isinstance(env.action_spec, OneHot) and env.action_spec.shape == (2,)
    assert env.action_spec.dtype == torch.int64 and env.action_spec.n == 2
    assert env.reward_spec.shape == (1,) and env.reward_spec.dtype == torch.float32
    assert set(env.done_spec.keys()) == {"done", "terminated", "truncated"}
    td = env.reset(seed=0)
    assert td["observation"].shape == (4,) and td["done"].shape == (1,) and not td["done"].any()
    td = env.step(env.rand_action(td))
    assert td["next", "reward"].dtype == torch.float32 and td["next", "reward"].shape == (1,)
    for key in ("done", "terminated", "truncated"):
        assert td["next", key].dtype == torch.bool and td["next", key].shape == (1,)
    env.close()
    env.close()  # twice is fine


def test_pendulum_box_action_bounds():
    env = GymEnv("Pendulum-v1")
    spec = env.action_spec
    assert isinstance(spec, Bounded) and spec.shape == (1,)
    assert float(spec.low) == -2.0 and float(spec.high) == 2.0
    for _ in range(20):
        assert spec.is_in(spec.rand())
    env.close()


def test_categorical_encoding_and_discrete_observation():
    env = GymEnv("FrozenLake-v1", categorical_action_encoding=True)
    assert isinstance(env.action_spec, Categorical) and env.action_spec.shape == ()
    assert isinstance(env.observation_spec["observation"], Categorical)
    onehot = GymEnv("FrozenLake-v1")
    obs = onehot.reset(seed=0)["observation"]
    assert isinstance(onehot.observation_spec["observation"], OneHot)
    assert obs.shape == (16,) and obs.dtype == torch.int64 and obs.sum() == 1 and obs[0] == 1
    for e in (env, onehot):
        e.close()


def test_multidiscrete_and_multibinary():
    class MultiEnv(gym.Env):
        observation_space = gym.spaces.MultiBinary(3)
        action_space = gym.spaces.MultiDiscrete([3, 2], start=[1, 0])

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return np.array([1, 0, 1], np.int8), {}

        def step(self, action):
            assert self.action_space.contains(action), action
            return np.array([0, 1, 0], np.int8), 0.0, False, False, {}

    env = GymEnv(MultiEnv())
    assert isinstance(env.action_spec, MultiOneHot) and env.action_spec.shape == (5,)
    assert isinstance(env.observation_spec["observation"], Binary)
    td = env.step(env.rand_action(env.reset()))
    assert td["next", "observation"].tolist() == [0, 1, 0]
    assert env.action_codec.decode(np.array([0, 0, 1, 1, 0])).tolist() == [3, 0]
    cat = GymEnv(MultiEnv(), categorical_action_encoding=True)
    assert isinstance(cat.action_spec, MultiCategorical) and cat.action_spec.shape == (2,)
    assert cat.action_codec.decode(np.array([0, 1])).tolist() == [1, 1]


def test_dict_observation_keys_at_root_and_nested():
    env = GymEnv("hpccollect-test/DictObs-v0")
    td = env.reset(seed=1)
    assert set(td.keys(True, True)) >= {"position", "velocity", ("sensors", "lidar")}
    assert "observation" not in td.keys()
    td = env.step(env.rand_action(td))
    assert td["next", "sensors", "lidar"].shape == (3,)
    assert env.observation_spec["sensors", "lidar"].shape == (3,)


def test_vector_env_specs_have_batch_dims():
    env = GymEnv("CartPole-v1", num_envs=4)
    assert env.batch_size == torch.Size([4])
    assert env.action_spec.shape == (4, 2)
    assert env.observation_spec["observation"].shape == (4, 4)
    td = env.reset(seed=3)
    assert td["observation"].shape == (4, 4) and td["done"].shape == (4, 1)
    assert env.rand_action(td)["action"].shape == (4, 2)
    env.close()


def test_set_seed_returns_last_and_is_reproducible():
    a, b = GymEnv("CartPole-v1", num_envs=3), GymEnv("CartPole-v1", num_envs=3)
    assert a.set_seed(10) == 12
    assert b.set_seed(10) == 12
    assert a.set_seed(10, static_seed=True) == 10
    b.set_seed(10, static_seed=True)
    torch.testing.assert_close(a.reset(seed=5)["observation"], b.reset(seed=5)["observation"])


@pytest.mark.parametrize(
    "mode",
    [
        gym.vector.AutoresetMode.NEXT_STEP,
        gym.vector.AutoresetMode.SAME_STEP,
        gym.vector.AutoresetMode.DISABLED,
    ],
)
@pytest.mark.parametrize("vector_cls", [gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv])
def test_vector_autoreset_modes_report_true_final_obs(mode, vector_cls):
    """Whatever the autoreset mode, the step loop sees final obs at done and reset obs after."""
    lengths = [2, 3, 5]
    fns = [lambda n=n: CounterEnv(n) for n in lengths]
    venv = vector_cls(fns, autoreset_mode=mode)
    env = GymEnv(venv)
    root = env.reset_arrays()
    for _ in range(12):
        action = env.action_spec.rand().numpy()
        nobs, _, term, trunc = env.step_arrays(action)
        done = np.asarray(term) | np.asarray(trunc)
        obs = nobs[("observation",)][:, 0]
        expected_next = root[("observation",)][:, 0] + 1
        np.testing.assert_array_equal(obs, expected_next)
        np.testing.assert_array_equal(done, obs == np.array(lengths))
        root = env.reset_arrays(mask=done, current=nobs) if done.any() else nobs
        np.testing.assert_array_equal(root[("observation",)][:, 0], np.where(done, 0, obs))
    env.close()


def test_make_env_accepts_every_form():
    for fn in (
        "CartPole-v1",
        gym.make("CartPole-v1"),
        lambda: gym.make("CartPole-v1"),
        lambda: GymEnv("CartPole-v1"),
    ):
        env = make_env(fn)
        assert isinstance(env, GymEnv) and env.batch_size == torch.Size([])
        env.close()
    vec = make_env([lambda: CounterEnv(2), lambda: CounterEnv(3)])
    assert vec.batch_size == torch.Size([2])
    kw = make_env(lambda length: CounterEnv(length), {"length": 7})
    assert kw.env.length == 7


def test_make_env_errors_name_the_argument():
    with pytest.raises(ArgumentValueError, match="create_env_fn.*NoSuchEnv-v0"):
        make_env("NoSuchEnv-v0")
    with pytest.raises(ArgumentTypeError, match="create_env_fn"):
        make_env(42)
    with pytest.raises(ArgumentTypeError, match="create_env_fn returned int"):
        make_env(lambda: 3)
    with pytest.raises(EnvError, match="create_env_fn raised ZeroDivisionError"):
        make_env(lambda: 1 / 0)
    with pytest.raises(ArgumentValueError, match="not supported"):
        GymEnv(_TupleEnv())


class _TupleEnv(gym.Env):
    observation_space = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(3)))
    action_space = gym.spaces.Discrete(2)
