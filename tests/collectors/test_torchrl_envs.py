"""TorchRL envs in hpccollect's collectors, checked against torchrl's own collectors.

These run in the second test environment (torchrl 0.14.1 installed next to hpccollect); without
torchrl they skip, unless HPCCOLLECT_REQUIRE_TORCHRL=1 (CI's torchrl run), where they fail.
"""

from __future__ import annotations

import os
import time
import warnings

import pytest
import torch

if os.environ.get("HPCCOLLECT_REQUIRE_TORCHRL") != "1":
    pytest.importorskip("torchrl")

from conftest import alive, descendants
from layouts import leaves
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.collectors import Collector as TorchRLCollector
from torchrl.collectors import MultiSyncCollector as TorchRLMultiSync
from torchrl.data import Bounded, Composite, Unbounded
from torchrl.envs import (
    CatFrames,
    Compose,
    DoubleToFloat,
    EnvBase,
    EnvCreator,
    GymEnv,
    InitTracker,
    ObservationNorm,
    RewardSum,
    SerialEnv,
    StepCounter,
    TransformedEnv,
)
from torchrl.modules import MLP, LSTMModule, OneHotCategorical, ProbabilisticActor

import hpccollect
from hpccollect.errors import ArgumentValueError, PolicyError

pytestmark = [
    pytest.mark.torchrl,
    pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning"),
]


class StepCountingEnv(EnvBase):
    """Counts its steps: ``count`` (int64) and ``nested/x`` (its float copy) at the root,
    reward ``action + 1``, done after ``length`` steps. Deterministic, any batch size."""

    def __init__(self, length: int = 7, batch_size: tuple = ()) -> None:
        super().__init__(batch_size=batch_size)
        self.length = length
        shape = (*batch_size, 1)
        self.observation_spec = Composite(
            count=Unbounded(shape, dtype=torch.int64),
            nested=Composite(x=Unbounded((*batch_size, 2)), shape=batch_size),
            shape=batch_size,
        )
        self.action_spec = Bounded(-1, 1, shape)
        self.reward_spec = Unbounded(shape)
        self.count = torch.zeros(shape, dtype=torch.int64)

    def _observe(self, **extra: torch.Tensor) -> TensorDict:
        x = self.count.float().expand(*self.batch_size, 2).clone()
        return TensorDict(
            count=self.count.clone(), nested={"x": x}, batch_size=self.batch_size, **extra
        )

    def _reset(self, tensordict: TensorDict | None) -> TensorDict:
        if tensordict is not None and "_reset" in tensordict.keys():
            self.count[tensordict["_reset"]] = 0
        else:
            self.count.zero_()
        done = torch.zeros_like(self.count, dtype=torch.bool)
        return self._observe(done=done, terminated=done.clone())

    def _step(self, tensordict: TensorDict) -> TensorDict:
        self.count += 1
        done = self.count >= self.length
        reward = tensordict["action"].float() + 1
        return self._observe(reward=reward, done=done, terminated=done.clone())

    def _set_seed(self, seed: int | None) -> None:
        pass


def cartpole() -> TransformedEnv:
    """The env of TorchRL's tutorials: CartPole with a step counter, as float32."""
    return TransformedEnv(GymEnv("CartPole-v1"), Compose(StepCounter(), DoubleToFloat()))


def cartpole_transformed() -> TransformedEnv:
    transforms = Compose(
        InitTracker(),
        StepCounter(40),
        ObservationNorm(in_keys=["observation"], loc=0.5, scale=2.0),
        CatFrames(3, dim=-1, in_keys=["observation"]),
        DoubleToFloat(),
        RewardSum(),
    )
    return TransformedEnv(GymEnv("CartPole-v1"), transforms)


def serial_cartpoles() -> SerialEnv:
    return SerialEnv(3, cartpole)


def counting() -> StepCountingEnv:
    return StepCountingEnv()


def counting_batched() -> StepCountingEnv:
    return StepCountingEnv(5, (4,))


def stochastic_actor(env: EnvBase) -> ProbabilisticActor:
    torch.manual_seed(1)
    n_obs = env.observation_spec["observation"].shape[-1]
    net = MLP(in_features=n_obs, out_features=2, num_cells=[64, 64])
    logits = TensorDictModule(net, in_keys=["observation"], out_keys=["logits"])
    return ProbabilisticActor(
        logits,
        in_keys=["logits"],
        out_keys=["action"],
        distribution_class=OneHotCategorical,
        spec=env.action_spec,
        return_log_prob=True,
    )


def greedy_actor(env: EnvBase) -> TensorDictModule:
    """Deterministic: one-hot argmax of a fixed linear map."""
    torch.manual_seed(0)
    n_obs = env.observation_spec["observation"].shape[-1]
    linear = torch.nn.Linear(n_obs, 2)

    def act(observation: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(linear(observation).argmax(-1), 2)

    return TensorDictModule(act, in_keys=["observation"], out_keys=["action"])


def lstm_actor(env: EnvBase) -> TensorDictSequential:
    """Recurrent: reads is_init and its LSTM state, which the env must provide."""
    torch.manual_seed(0)
    n_obs = env.observation_spec["observation"].shape[-1]
    lstm = LSTMModule(input_size=n_obs, hidden_size=8, in_key="observation", out_key="h")
    head = torch.nn.Linear(8, 2)

    def act(h: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(head(h).argmax(-1), 2)

    return TensorDictSequential(lstm, TensorDictModule(act, in_keys=["h"], out_keys=["action"]))


class _Bias(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(()), requires_grad=False)

    def forward(self, count: torch.Tensor) -> torch.Tensor:
        return (count.float() * 0 + self.bias).clamp(-1.0, 1.0)


def counting_bias_policy() -> TensorDictModule:
    """Action = its one weight, whatever the count (0 until weights arrive)."""
    return TensorDictModule(_Bias(), in_keys=["count"], out_keys=["action"])


def counting_policy(env: EnvBase) -> TensorDictModule:
    return TensorDictModule(
        lambda c: (c.float() * 0.1).clamp(max=1.0), in_keys=["count"], out_keys=["action"]
    )


def _collect(collector_class: type, make, policy_fn, **kwargs) -> tuple[list, dict]:
    env = make()
    env.set_seed(0)
    torch.manual_seed(0)
    policy = None if policy_fn is None else policy_fn(env)
    torch.manual_seed(0)
    kwargs = {"frames_per_batch": 30, "total_frames": 90, **kwargs}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collector = collector_class(env, policy, **kwargs)
        collector.set_seed(0)
        batches = [b.clone() for b in collector]
        state = collector.state_dict()
        collector.shutdown()
    return batches, state


def assert_same_batches(ours: list, theirs: list) -> None:
    """Key by key: keys, shapes, dtypes, names and values."""
    assert len(ours) == len(theirs)
    for mine, ref in zip(ours, theirs):
        assert set(mine.keys(True, True)) == set(ref.keys(True, True))
        assert mine.batch_size == ref.batch_size and mine.names == ref.names
        for key in ref.keys(True, True):
            a, b = mine.get(key), ref.get(key)
            assert a.dtype == b.dtype and a.shape == b.shape, key
            assert torch.equal(a, b), key


CASES = {
    "tutorial cartpole, greedy": (cartpole, greedy_actor, {}),
    "tutorial cartpole, stochastic actor": (cartpole, stochastic_actor, {}),
    "transforms: init, step count, norm, frame stack, reward sum": (
        cartpole_transformed,
        stochastic_actor,
        {},
    ),
    "SerialEnv of 3": (serial_cartpoles, greedy_actor, {}),
    "EnvBase subclass, nested keys": (counting, counting_policy, {}),
    "EnvBase subclass, batch [4]": (counting_batched, counting_policy, {}),
    "max_frames_per_traj adds a StepCounter": (
        counting,
        counting_policy,
        {"max_frames_per_traj": 3},
    ),
    "split_trajs": (counting, counting_policy, {"split_trajs": True}),
    "split_trajs, batch [4]": (counting_batched, counting_policy, {"split_trajs": True}),
    "reset_at_each_iter": (counting, counting_policy, {"reset_at_each_iter": True}),
    "set_truncated": (counting, None, {"set_truncated": True, "max_frames_per_traj": 4}),
    "return_same_td": (counting, counting_policy, {"return_same_td": True}),
    "random policy": (cartpole, None, {}),
    "init_random_frames": (counting, counting_policy, {"init_random_frames": 30}),
    "compact_obs": (cartpole, greedy_actor, {"compact_obs": True}),
    "compact_obs, nested keys": (counting, counting_policy, {"compact_obs": True}),
    "track_policy_version": (cartpole, greedy_actor, {"track_policy_version": True}),
    "auto_register_policy_transforms, LSTM": (
        cartpole,
        lstm_actor,
        {"auto_register_policy_transforms": True},
    ),
    "trajs_per_batch, padded": (
        cartpole,
        greedy_actor,
        {"trajs_per_batch": 2, "traj_format": "padded", "total_frames": 300},
    ),
    "trajs_per_batch, cat, SerialEnv of 3": (
        serial_cartpoles,
        greedy_actor,
        {"trajs_per_batch": 3, "traj_format": "cat", "total_frames": 300},
    ),
    "trajs_per_batch, batch [4], truncated": (
        counting_batched,
        counting_policy,
        {"trajs_per_batch": 3, "max_frames_per_traj": 3, "traj_format": "padded"},
    ),
    "trajs_per_batch, reset_at_each_iter": (
        counting,
        counting_policy,
        {"trajs_per_batch": 2, "reset_at_each_iter": True, "frames_per_batch": 10},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sync_collector_gives_torchrl_batches(case: str) -> None:
    make, policy_fn, kwargs = CASES[case]
    ours, our_state = _collect(hpccollect.Collector, make, policy_fn, **kwargs)
    theirs, their_state = _collect(TorchRLCollector, make, policy_fn, **kwargs)
    assert_same_batches(ours, theirs)
    assert set(our_state) == set(their_state)
    assert int(our_state["traj_pool"]["traj_id"]) == int(their_state["traj_pool"]["traj_id"])


def test_env_state_dict_holds_the_transforms_state() -> None:
    env = TransformedEnv(GymEnv("CartPole-v1"), ObservationNorm(in_keys=["observation"]))
    env.transform.init_stats(20)
    collector = hpccollect.Collector(env, None, frames_per_batch=10, total_frames=10)
    state = collector.state_dict()["env_state_dict"]
    assert {"loc", "scale"} <= set(state)
    loc = state["loc"].clone()
    env.transform.loc.add_(1.0)
    collector.load_state_dict({"env_state_dict": state | {"loc": loc}, "frames": 0, "iter": 0})
    assert torch.equal(env.transform.loc, loc)
    collector.shutdown()


@pytest.mark.parametrize(
    "create_env_fn",
    [cartpole, EnvCreator(cartpole), [cartpole]],
    ids=["callable", "EnvCreator", "list of one"],
)
def test_every_form_of_create_env_fn(create_env_fn) -> None:
    collector = hpccollect.SyncDataCollector(
        create_env_fn, None, frames_per_batch=10, total_frames=10
    )
    (batch,) = list(collector)
    collector.shutdown()
    assert batch["step_count"].shape == (10, 1) and batch.names == ["time"]


def test_create_env_kwargs_on_an_instance_need_a_batched_env() -> None:
    with pytest.raises(ArgumentValueError, match="create_env_kwargs"):
        hpccollect.SyncDataCollector(
            counting(), None, frames_per_batch=10, create_env_kwargs={"length": 3}
        )


def test_max_frames_per_traj_on_an_env_that_counts_steps_is_refused() -> None:
    with pytest.raises(ArgumentValueError, match="step_count"):
        hpccollect.SyncDataCollector(cartpole(), None, frames_per_batch=10, max_frames_per_traj=5)


def test_a_policy_that_writes_no_action_is_named() -> None:
    """As in TorchRL the collector is built (a warning says it will fail) and the first batch
    fails, naming the action."""
    wrong = TensorDictModule(lambda c: c.float(), in_keys=["count"], out_keys=["other"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = hpccollect.SyncDataCollector(counting(), wrong, frames_per_batch=10)
    assert any("did not write the env's action 'action'" in str(w.message) for w in caught)
    try:
        with pytest.raises(PolicyError, match="did not write the env's action 'action'"):
            next(iter(c))
    finally:
        c.shutdown()


def test_plain_module_named_after_the_observation() -> None:
    class Policy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 2)

        def forward(self, observation: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.one_hot(self.linear(observation).argmax(-1), 2)

    def make_policy(env: EnvBase) -> Policy:
        torch.manual_seed(3)
        return Policy()

    def make_env() -> TransformedEnv:  # torchrl passes every observation to such a policy
        return TransformedEnv(GymEnv("CartPole-v1"), DoubleToFloat())

    ours, _ = _collect(hpccollect.Collector, make_env, make_policy)
    theirs, _ = _collect(TorchRLCollector, make_env, make_policy)
    assert_same_batches(ours, theirs)


def test_plain_module_with_unknown_parameter_names_is_refused() -> None:
    with pytest.raises(TypeError, match="observation spec"):
        hpccollect.Collector(cartpole(), torch.nn.Linear(4, 2), frames_per_batch=10)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "collector_class",
    [hpccollect.MultiSyncDataCollector, hpccollect.MultiaSyncDataCollector],
)
@pytest.mark.parametrize("make", [cartpole_transformed, serial_cartpoles, counting_batched])
def test_multi_collectors_layout_matches_torchrl(collector_class, make) -> None:
    """Worker processes build the TorchRL env; batches have torchrl's keys, dtypes and shapes
    (MultiSync's against torchrl's MultiSyncCollector; MultiaSync's are one worker's batch)."""
    kwargs = {"frames_per_batch": 60, "total_frames": 120}
    collector = collector_class([make, EnvCreator(make)], None, **kwargs)
    collector.set_seed(0)
    ours = list(collector)
    collector.shutdown()
    assert len(ours) == 2
    single = TorchRLCollector(make(), None, frames_per_batch=60, total_frames=60)
    one = next(iter(single))
    single.shutdown()
    if collector_class is hpccollect.MultiSyncDataCollector:
        reference = TorchRLMultiSync([make, make], None, **kwargs)
        ref = next(iter(reference))
        reference.shutdown()
    else:
        ref = one
    for batch in ours:
        assert set(batch.keys(True, True)) == set(ref.keys(True, True))
        assert batch.batch_size == ref.batch_size and batch.names == ref.names
        for key in ref.keys(True, True):
            assert batch.get(key).dtype == ref.get(key).dtype, key
    ids = torch.cat([b["collector", "traj_ids"].reshape(-1) for b in ours])
    assert ids.min() >= 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_multi_sync_whole_trajectories_match_torchrl() -> None:
    """MultiSync with trajs_per_batch: the same trajectories as torchrl's MultiSyncCollector
    (workers' ids differ: compared by content), in the same layout."""
    kwargs = dict(frames_per_batch=40, total_frames=120, trajs_per_batch=3, traj_format="padded")
    out = {}
    for name, cls in (("ours", hpccollect.MultiSyncCollector), ("theirs", TorchRLMultiSync)):
        collector = cls([counting_batched, counting_batched], counting_policy(counting()), **kwargs)
        out[name] = [b.clone() for b in collector]
        collector.shutdown()
    assert len(out["ours"]) == len(out["theirs"]) > 0
    for mine, ref in zip(out["ours"], out["theirs"], strict=True):
        assert set(mine.keys(True, True)) == set(ref.keys(True, True))
        assert mine.batch_size == ref.batch_size and mine.names == ref.names
        for key in ref.keys(True, True):
            assert mine.get(key).dtype == ref.get(key).dtype, key
            if key != ("collector", "traj_ids"):
                assert torch.equal(mine.get(key), ref.get(key)), key


def test_a_torchrl_policy_version_is_kept_in_step() -> None:
    from torchrl.envs.llm.transforms.policy_version import PolicyVersion

    tracker = PolicyVersion(version_type=int)
    env = cartpole()
    collector = hpccollect.Collector(
        env, greedy_actor(env), frames_per_batch=4, track_policy_version=tracker
    )
    it = iter(collector)
    next(it)
    collector.update_policy_weights_()
    batch = next(it)
    collector.shutdown()
    assert tracker.version == collector.policy_version == 1
    assert batch["next", "policy_version"].tolist() == [1] * 4
    with pytest.raises(TypeError, match="int version"):
        hpccollect.Collector(
            cartpole(), None, frames_per_batch=4, track_policy_version=PolicyVersion("uuid")
        )


def test_missing_policy_transforms_are_named_as_torchrl_names_them() -> None:
    """auto_register_policy_transforms left at None: the env is left as it is, with TorchRL's
    FutureWarning; False: silent."""
    env = cartpole()
    with pytest.warns(FutureWarning, match="InitTracker"):
        collector = hpccollect.Collector(env, greedy_actor(env), frames_per_batch=4)
    assert "is_init" not in next(iter(collector)).keys()
    collector.shutdown()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        hpccollect.Collector(
            env, greedy_actor(env), frames_per_batch=4, auto_register_policy_transforms=False
        ).shutdown()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_workers_append_the_policy_transforms_too() -> None:
    env = cartpole()
    collector = hpccollect.MultiSyncCollector(
        [cartpole, cartpole],
        lstm_actor(env),
        frames_per_batch=20,
        total_frames=20,
        auto_register_policy_transforms=True,
    )
    (batch,) = list(collector)
    collector.shutdown()
    assert {"is_init", "recurrent_state_h", "recurrent_state_c"} <= set(batch.keys())


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_weight_sync_schemes_for_the_policy() -> None:
    """TorchRL's default scheme (with a policy here, never pickled, and a factory for the
    workers): updates reach every worker; NoWeightSyncScheme: the workers keep their weights."""
    from torchrl.weight_update import NoWeightSyncScheme, SharedMemWeightSyncScheme

    def make_policy() -> TensorDictModule:
        return counting_bias_policy()

    class Unpicklable(_Bias):
        def __reduce_ex__(self, protocol: int) -> None:
            raise RuntimeError("this policy stays in the trainer's process")

    def actions(collector) -> set:
        batch = next(iter(collector))
        return set(batch["action"].reshape(-1).tolist())

    results = {}
    for name, scheme in (("shared", SharedMemWeightSyncScheme()), ("none", NoWeightSyncScheme())):
        collector = hpccollect.MultiSyncCollector(
            [counting, counting],
            TensorDictModule(Unpicklable(), in_keys=["count"], out_keys=["action"]),
            policy_factory=make_policy,
            frames_per_batch=14,
            weight_sync_schemes={"policy": scheme},
        )
        try:
            before = actions(collector)
            collector.update_policy_weights_(TensorDict({"bias": torch.tensor(0.5)}, []))
            results[name] = (before, actions(collector))
        finally:
            collector.shutdown()
    assert results["shared"] == ({0.0}, {0.5})
    assert results["none"] == ({0.0}, {0.0})


def test_what_torchrl_own_tests_pass_in() -> None:
    """Cases found by running torchrl's collector tests against hpccollect: a RandomPolicy()
    made without a spec, an action shape the env broadcasts, a policy's extra outputs during
    init_random_frames, an input cast to policy_device, set_truncated on an env whose done
    flags have dims of their own."""
    from torchrl.envs import InitTracker
    from torchrl.modules import RandomPolicy
    from torchrl.testing.mocking_classes import (
        ContinuousActionVecMockEnv,
        CountingEnv,
        NestedCountingEnv,
    )

    policy = RandomPolicy()
    collector = hpccollect.Collector(
        ContinuousActionVecMockEnv(), policy, frames_per_batch=10, total_frames=10
    )
    assert next(iter(collector))["action"].shape == (10, 7) and policy.action_spec is not None
    collector.shutdown()

    def ones(td: TensorDict) -> TensorDict:
        return td.set("action", torch.ones(td.shape, dtype=torch.int))  # spec shape (1,)

    collector = hpccollect.Collector(CountingEnv(max_steps=8), ones, frames_per_batch=12)
    assert next(iter(collector))["observation"].reshape(-1).tolist() == [*range(9), 0, 1, 2]
    collector.shutdown()

    env = ContinuousActionVecMockEnv()
    two = TensorDictModule(
        lambda o: (o[..., :7].tanh(), o.clone()), ["observation"], ["action", "hidden"]
    )
    collector = hpccollect.Collector(
        env, two, frames_per_batch=20, total_frames=40, init_random_frames=20
    )
    assert all("hidden" in batch.keys() for batch in collector)
    collector.shutdown()

    seen = []

    def on_cpu(td: TensorDict) -> TensorDict:
        seen.append(td.device)
        return td.set("action", torch.zeros((*td.shape, 7)))

    collector = hpccollect.Collector(
        ContinuousActionVecMockEnv(device=None), on_cpu, policy_device="cpu", frames_per_batch=2
    )
    next(iter(collector))
    collector.shutdown()
    assert set(seen) == {torch.device("cpu")}  # the input is cast to policy_device

    env = TransformedEnv(NestedCountingEnv(), InitTracker()).add_truncated_keys()
    collector = hpccollect.Collector(
        env, env.rand_action, frames_per_batch=20, set_truncated=True, trust_policy=True
    )
    batch = next(iter(collector))
    collector.shutdown()
    assert batch[..., -1]["next", "data", "truncated"].all()
    assert not batch[..., 0]["next", "data", "truncated"].any()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_workers_run_envs_that_start_processes_and_write_their_own_part() -> None:
    """A ParallelEnv inside a worker (workers are not daemonic, as in TorchRL), and a TorchRL
    replay buffer extended with the worker's part, as TorchRL's workers extend it: a [2 envs,
    16 steps] part is 2 items of a 1-D storage, as torchrl's Collector writes it. (One worker:
    each process here imports torchrl, 3 s; the buffer tests write several workers' parts.)"""
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.modules import RandomPolicy

    buffer = ReplayBuffer(storage=LazyTensorStorage(256))
    collector = hpccollect.MultiSyncCollector(
        [_parallel_mock],
        RandomPolicy(),  # the worker gives it its env's action spec
        frames_per_batch=32,
        total_frames=64,
        replay_buffer=buffer,
    )
    sizes = [len(buffer) for _ in collector]
    collector.shutdown()
    assert sizes == [2, 4]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_rank_runs_an_env_that_starts_processes_and_leaves_none_behind() -> None:
    """A ParallelEnv on a collector rank of ``launcher="mp"`` (ranks are not daemonic, as in
    TorchRL; TorchRL's own single-machine example does this): its batches are the two envs'
    steps, and after ``shutdown()`` neither the rank nor the env's processes are left."""
    from torchrl.modules import RandomPolicy

    collector = hpccollect.DistributedCollector(
        [_parallel_mock], RandomPolicy(), frames_per_batch=32, total_frames=96, launcher="mp"
    )
    try:
        rank = collector._pool.channels[0].pid
        batches = list(collector)
        started = descendants(rank)
    finally:
        collector.shutdown()
    assert [b.batch_size for b in batches] == [torch.Size([2, 16])] * 3
    assert len(started) >= 2  # the ParallelEnv's two workers
    deadline = time.monotonic() + 10
    while any(alive(p) for p in [rank, *started]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in [rank, *started] if alive(p)]


def _parallel_mock():
    from torchrl.envs import ParallelEnv
    from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv

    return ParallelEnv(2, ContinuousActionVecMockEnv)


def test_import_does_not_load_torchrl_for_a_gymnasium_user() -> None:
    import subprocess
    import sys

    code = "import hpccollect, sys; c = hpccollect.Collector('CartPole-v1', None, "
    code += "frames_per_batch=8, total_frames=8); list(c); print('torchrl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


KEYWORD_PAIRS = [
    ("Collector", "SyncDataCollector"),
    ("MultiSyncCollector", "MultiSyncDataCollector"),
    ("MultiAsyncCollector", "MultiaSyncDataCollector"),
    ("AsyncCollector", "aSyncDataCollector"),
]


def _keywords(cls: type) -> set[str]:
    from hpccollect.distributed.arguments import accepted_kwargs

    return set(accepted_kwargs(cls) or ()) - {"self", "args", "kwargs"}


@pytest.mark.parametrize(("theirs", "ours"), KEYWORD_PAIRS)
def test_every_torchrl_keyword_is_accepted(theirs: str, ours: str) -> None:
    import torchrl.collectors

    mine = _keywords(getattr(hpccollect, ours))
    if ours == "aSyncDataCollector":
        mine |= {"num_workers", "policy_factory", "track_policy_version"}
    missing = _keywords(getattr(torchrl.collectors, theirs)) - mine
    assert not missing, f"{ours} lacks TorchRL's {sorted(missing)}"


@pytest.mark.parametrize(
    "theirs", ["DistributedCollector", "DistributedSyncCollector", "RPCCollector"]
)
def test_every_distributed_keyword_is_accepted(theirs: str) -> None:
    import torchrl.collectors.distributed

    from hpccollect.collectors import distributed

    cls = getattr(torchrl.collectors.distributed, theirs)
    missing = _keywords(cls) - _keywords(getattr(distributed, theirs))
    assert not missing, f"{theirs} lacks TorchRL's {sorted(missing)}"


TORCHRL_MODULES = [
    "collectors",
    "collectors.distributed",
    "collectors.distributed.default_configs",
]


@pytest.mark.parametrize("module", TORCHRL_MODULES)
def test_every_public_torchrl_name_imports_from_the_same_path(module: str) -> None:
    import importlib
    import inspect

    theirs = importlib.import_module(f"torchrl.{module}")
    ours = importlib.import_module(f"hpccollect.{module}")
    names = getattr(theirs, "__all__", None) or ["DEFAULT_SLURM_CONF", "DEFAULT_SLURM_CONF_MAIN"]
    missing = [name for name in names if not hasattr(ours, name)]
    assert not missing, f"hpccollect.{module} lacks {missing}"
    for name in names:  # callables take TorchRL's parameters by name
        theirs_obj, ours_obj = getattr(theirs, name), getattr(ours, name)
        if not callable(theirs_obj) or name in ("Collector", "SyncDataCollector"):
            continue  # (the collectors' keywords: test_every_torchrl_keyword_is_accepted)
        try:
            wanted = set(inspect.signature(theirs_obj).parameters)
        except (TypeError, ValueError):
            continue
        if "Collector" in name or "Evaluator" in name:
            continue
        have = set(inspect.signature(ours_obj).parameters)
        if not {"args", "kwargs"} & have:
            assert wanted - {"self"} <= have, f"{name} lacks {sorted(wanted - have)}"


def test_vanilla_weight_updater_writes_what_torchrls_writes() -> None:
    from torchrl.collectors import VanillaWeightUpdater as Theirs

    from hpccollect.collectors import VanillaWeightUpdater as Ours

    results = []
    for cls in (Theirs, Ours):
        torch.manual_seed(0)
        policy = torch.nn.Linear(3, 2)
        server = torch.nn.Linear(3, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            updater = cls(
                weight_getter=lambda server=server: TensorDict.from_module(server).data,
                policy_weights=TensorDict.from_module(policy),
            )
        with torch.no_grad():  # as the collectors call it (TorchRL's own writes in place)
            updater.push_weights()
        results.append(torch.cat([policy.weight.flatten(), policy.bias]).detach())
        assert torch.equal(results[-1], torch.cat([server.weight.flatten(), server.bias]))
    assert torch.equal(*results)


def _rank_job(launcher: str, backend: str, tmp_path) -> dict:
    import signal
    import subprocess
    import sys
    from pathlib import Path

    job = Path(__file__).with_name("torchrl_rank_job.py")
    out = tmp_path / "out.pt"
    cmd = [sys.executable, str(job), str(out), launcher, backend]
    if launcher == "mpi":
        import mpirun

        if mpirun.skip_reason():
            pytest.skip(mpirun.skip_reason())
        cmd = mpirun.command(3, *cmd)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, output[-3000:]
    return torch.load(out, weights_only=False)


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("launcher", "backend"),
    [
        ("mp", "gloo"),
        ("submitit", "gloo"),
        pytest.param("mpi", "gloo", marks=pytest.mark.mpi),
        pytest.param("mpi", "mpi", marks=pytest.mark.mpi),
    ],
)
def test_distributed_collector_on_a_torchrl_env_with_policy_factory(launcher, backend, tmp_path):
    """Every rank builds the TorchRL env and its policy; the batch is laid out as torchrl's
    Collector lays out one rank's, stacked over the 2 ranks; weights sent reach both ranks."""
    saved = _rank_job(launcher, backend, tmp_path)
    reference = TorchRLCollector(cartpole(), None, frames_per_batch=10, total_frames=10)
    one = next(iter(reference))
    reference.shutdown()
    expected = {
        str(k): ((2, *one.get(k).shape), str(one.get(k).dtype)) for k in one.keys(True, True)
    }
    assert saved["layout"] == expected
    assert saved["names"] == [None, "time"]
    acts = saved["actions"]
    assert (acts[0] == 0).all() and (acts[1] == 0).all()
    assert (acts[-1] == 1).all()  # both ranks act on the weights sent after the second batch


def _rpc_batches(cls: type) -> list:
    import socket

    with socket.socket() as probe:  # TorchRL's RPC agent needs a port named in advance
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collector = cls(
            [cartpole, cartpole], None, frames_per_batch=100, total_frames=200, sync=True,
            launcher="mp", tcp_port=port,
        )  # fmt: skip
        try:
            return list(collector)
        finally:
            collector.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_rpc_collector_gives_torchrls_rpc_batches() -> None:
    """The same RPC collector call, TorchRL's and hpccollect's: the same rounds, each both
    ranks' batches concatenated (keys, shapes, dtypes); each half one rank's steps."""
    from torchrl.collectors.distributed import RPCCollector as Theirs

    from hpccollect.collectors.distributed import RPCCollector as Ours

    theirs, ours = _rpc_batches(Theirs), _rpc_batches(Ours)
    assert len(ours) == len(theirs) == 2

    for mine, their in zip(ours, theirs, strict=True):
        assert leaves(mine) == leaves(their)
        assert mine.batch_size == their.batch_size == torch.Size([100])
        for half in (mine[:50], mine[50:]):  # one rank's steps: counts rise by one in an episode
            counts = half["next", "step_count"].squeeze(-1)
            ends = half["next", "done"].squeeze(-1)
            rises = counts[1:] == counts[:-1] + 1
            assert (rises | ends[:-1]).all()


def fixed_policy() -> TensorDictModule:
    """CartPole's action 0 (one-hot) until its bias is flipped; the ranks build it too."""
    layer = nn.Linear(4, 2)
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.copy_(torch.tensor([1.0, 0.0]))
    return TensorDictModule(layer, in_keys=["observation"], out_keys=["action"])


def _distributed_sync_batches(cls: type) -> list:
    import socket

    with socket.socket() as probe:  # TorchRL's ranks are told the port in advance
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    policy = fixed_policy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collector = cls(
            [cartpole, cartpole], policy, policy_factory=fixed_policy, frames_per_batch=40,
            total_frames=160, launcher="mp", tcp_port=port, update_interval=1,
            collector_kwargs=[{"device": "cpu"}, {"device": "cpu", "storing_device": "cpu"}],
        )  # fmt: skip
        batches = []
        try:
            for batch in collector:
                batches.append(batch.clone())
                with torch.no_grad():  # no update call: update_interval pushes it
                    policy.module.bias.copy_(torch.tensor([0.0, 1.0]))
        finally:
            collector.shutdown()
    return batches


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_distributed_sync_collector_as_torchrls_with_a_factory_and_update_interval() -> None:
    """The same ``DistributedSyncCollector`` call, TorchRL's and hpccollect's (a policy and a
    ``policy_factory``, ``collector_kwargs`` per rank, ``update_interval=1``): the same
    batches (keys, shapes, dtypes), the first with the ranks' own weights, and the policy's
    new weights reach every rank without a call. TorchRL's ranks collect on while its weights
    travel, so they use them one or two batches later; hpccollect's, from the next batch."""
    from torchrl.collectors.distributed import DistributedSyncCollector as Theirs

    from hpccollect.collectors.distributed import DistributedSyncCollector as Ours

    theirs, ours = _distributed_sync_batches(Theirs), _distributed_sync_batches(Ours)
    assert len(ours) == len(theirs) == 4

    for mine, their in zip(ours, theirs, strict=True):
        assert leaves(mine) == leaves(their)
        assert mine.batch_size == their.batch_size == torch.Size([2, 20])
    for batches in (ours, theirs):
        acts = [batch["action"].argmax(-1) for batch in batches]
        assert (acts[0] == 0).all() and any((a == 1).all() for a in acts[1:])
    assert [int(batch["action"].argmax(-1).min()) for batch in ours] == [0, 1, 1, 1]


def pendulum_vecnorm() -> TransformedEnv:
    from torchrl.envs import VecNorm

    norm = VecNorm(in_keys=["observation"], decay=0.99)
    return TransformedEnv(GymEnv("Pendulum-v1"), Compose(DoubleToFloat(), norm))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_env_creator_shares_its_state_with_every_worker() -> None:
    """As in TorchRL, an EnvCreator's shared state (VecNorm's running statistics) is one for
    the caller and every worker: the workers' steps move the caller's counts."""
    creator = EnvCreator(pendulum_vecnorm)
    count = next(v for v in creator.state_dict().values())["observation_count"]
    before = float(count)
    collector = hpccollect.MultiSyncDataCollector(
        [creator, creator], None, frames_per_batch=200, total_frames=400
    )
    list(collector)
    collector.shutdown()
    assert float(count) > before + 50


_MAIN_ENV_SCRIPT = """
import torch
from tensordict import TensorDict
from torchrl.data import Composite, Unbounded
from torchrl.envs import EnvBase
from torchrl.modules import RandomPolicy
from hpccollect.collectors import {cls}


class DefinedInMain(EnvBase):
    def __init__(self):
        super().__init__()
        self.observation_spec = Composite(observation=Unbounded((1,)))
        self.action_spec = Unbounded((1,))
        self.reward_spec = Unbounded((1,))

    def _reset(self, tensordict, **kwargs):
        return self.full_observation_spec.zero().update(self.full_done_spec.zero())

    def _step(self, tensordict, **kwargs):
        out = self.full_observation_spec.zero().update(self.full_done_spec.zero())
        return out.update(self.full_reward_spec.zero())

    def _set_seed(self, seed):
        return seed


if __name__ == "__main__":
    c = {cls}([DefinedInMain], RandomPolicy(DefinedInMain().action_spec), frames_per_batch=5,
             total_frames=10)
    print("frames", sum(batch.numel() for batch in c))
    c.shutdown()
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("cls", ["MultiSyncCollector", "MultiAsyncCollector"])
def test_an_env_class_defined_in_main_reaches_spawned_workers(cls):
    """An EnvBase subclass defined in ``python -c`` (or a notebook) goes to the workers by value,
    as with TorchRL (a worker cannot import ``__main__``'s classes by name)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _MAIN_ENV_SCRIPT.format(cls=cls)],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "frames 10" in out.stdout
