"""TorchRL envs whose batches fit no fixed buffers (dynamic specs, heterogeneous lazy-stacked
specs, non-tensor entries): lazy stacks as torchrl gives them, in this process and from worker
processes, where those batches travel by value.

These run in the second test environment (torchrl 0.14.1); without torchrl they skip, unless
HPCCOLLECT_REQUIRE_TORCHRL=1 (CI's torchrl run), where they fail.
"""

from __future__ import annotations

import os

import pytest
import torch

if os.environ.get("HPCCOLLECT_REQUIRE_TORCHRL") != "1":
    pytest.importorskip("torchrl")

from tensordict import LazyStackedTensorDict, NonTensorData, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.data import Bounded, Composite, NonTensor, Unbounded
from torchrl.envs import EnvBase, GymEnv, StepCounter, Transform
from torchrl.modules import RandomPolicy
from torchrl.testing.mocking_classes import (
    HeterogeneousCountingEnv,
    HeterogeneousCountingEnvPolicy,
)

from hpccollect.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
from hpccollect.collectors.distributed import DistributedCollector
from hpccollect.errors import ArgumentValueError

pytestmark = [
    pytest.mark.torchrl,
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning"),
]


class GrowingEnv(EnvBase):
    """Observation ``[t + 1, 2]`` at step ``t`` (a dynamic dim); ends after 4 steps."""

    def __init__(self) -> None:
        super().__init__(batch_size=())
        self.observation_spec = Composite(observation=Unbounded(shape=(-1, 2)))
        self.action_spec = Bounded(low=-1, high=1, shape=(1,))
        self.reward_spec = Unbounded(shape=(1,))
        self.t = 0

    def _reset(self, tensordict: TensorDictBase | None) -> TensorDictBase:
        self.t = 0
        out = self.full_done_spec.zero()
        out["observation"] = torch.zeros(1, 2)
        return out

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self.t += 1
        out = self.full_done_spec.zero()
        out["observation"] = torch.full((self.t + 1, 2), float(self.t))
        out["reward"] = torch.ones(1)
        out["done"][:] = out["terminated"][:] = self.t >= 4
        return out

    def _set_seed(self, seed: int | None) -> None:
        pass


class StepText(Transform):
    """Adds ``text``, a string naming the step count (a non-tensor entry)."""

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        return next_tensordict.set("text", f"step {next_tensordict['step_count'].item()}")

    def _reset(self, tensordict: TensorDictBase, reset: TensorDictBase) -> TensorDictBase:
        return reset.set("text", NonTensorData("reset"))

    def transform_observation_spec(self, spec: Composite) -> Composite:
        spec["text"] = NonTensor(shape=())
        return spec


def text_env() -> EnvBase:
    return GymEnv("CartPole-v1").append_transform(StepCounter()).append_transform(StepText())


def growing_policy():
    return RandomPolicy(GrowingEnv().action_spec)


def _check_growing(batch: TensorDictBase) -> None:
    assert isinstance(batch, LazyStackedTensorDict) and batch.names[-1] == "time"
    for step in batch.unbind(-1) if batch.ndim == 1 else batch.reshape(-1).unbind(0):
        length = step["observation"].shape[0]
        assert (step["observation"] == length - 1).all()
        assert step["next", "observation"].shape[0] == min(length + 1, 5) or step["next", "done"]


def test_dynamic_specs_give_lazy_stacks_in_this_process() -> None:
    c = Collector(GrowingEnv, growing_policy(), frames_per_batch=10, total_frames=20)
    try:
        batches = list(c)
    finally:
        c.shutdown()
    assert len(batches) == 2
    for batch in batches:
        _check_growing(batch)
        assert batch.batch_size == (10,)


@pytest.mark.slow
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_dynamic_specs_from_worker_processes(cls) -> None:
    c = cls(
        [GrowingEnv, GrowingEnv],
        growing_policy(),
        frames_per_batch=20,
        total_frames=60,
        cat_results="stack" if cls is MultiSyncCollector else None,
    )
    try:
        batches = list(c)
    finally:
        c.shutdown()
    assert sum(b.numel() for b in batches) == 60
    for batch in batches:
        _check_growing(batch)


@pytest.mark.slow
def test_heterogeneous_specs_from_worker_processes() -> None:
    env = HeterogeneousCountingEnv(max_steps=3, batch_size=(4,))
    policy = HeterogeneousCountingEnvPolicy(env.input_spec["full_action_spec"])
    ours = Collector(env, policy, frames_per_batch=16, total_frames=16)
    local = next(iter(ours))
    ours.shutdown()
    c = MultiAsyncCollector(
        [lambda: HeterogeneousCountingEnv(max_steps=3, batch_size=(4,))] * 2,
        policy,
        frames_per_batch=16,
        total_frames=32,
    )
    try:
        remote = list(c)
    finally:
        c.shutdown()
    for batch in [local, *remote]:
        assert batch.batch_size == (4, 4)
        for i in range(env.n_nested_dim):  # agents of different shapes, each acting
            assert (batch["lazy"][..., i]["action"] == 1).all()
            assert batch["lazy"][..., i][f"tensor_{i}"].shape[2:] == (1, 2, 3)[: i + 1]


@pytest.mark.slow
@pytest.mark.parametrize("cls", [Collector, MultiSyncCollector])
def test_non_tensor_entries_reach_the_batch(cls) -> None:
    kwargs = {"cat_results": "stack"} if cls is MultiSyncCollector else {}
    fns = text_env if cls is Collector else [text_env, text_env]
    c = cls(fns, None, frames_per_batch=20, total_frames=40, **kwargs)
    try:
        batches = list(c)
    finally:
        c.shutdown()
    for batch in batches:
        for traj in batch.unbind(0) if batch.ndim == 2 else [batch]:
            texts, counts = traj["text"], traj["step_count"].squeeze(-1).tolist()
            nexts = traj["next", "text"]
            for t, count in enumerate(counts):
                assert texts[t] == ("reset" if count == 0 else f"step {count}")
                assert nexts[t] == f"step {count + 1}"


@pytest.mark.slow
def test_a_rank_refuses_batches_that_fit_no_buffers() -> None:
    with pytest.raises(ArgumentValueError, match="fit no fixed buffers"):
        DistributedCollector(
            [GrowingEnv], growing_policy(), frames_per_batch=10, total_frames=20, launcher="mp"
        )


class _DeviceSpy(TensorDictModuleBase):
    """Writes a zero action and remembers the device of each TensorDict it is given."""

    in_keys = ["observation"]
    out_keys = ["action"]

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        self.seen.add(str(td.device))
        return td.set("action", torch.zeros(*td.batch_size, 7))


@pytest.mark.parametrize("env_has", [None, "cpu"])
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"env_device": "cpu"},
        {"policy_device": "cpu"},
        {"device": "cpu"},
        {"env_device": "cpu", "policy_device": "cpu"},
        {"storing_device": "cpu"},
    ],
    ids=["none", "env", "policy", "device", "env+policy", "storing"],
)
def test_devices_the_policy_and_the_batch_get_are_torchrls(kwargs, env_has) -> None:
    from torchrl.collectors import Collector as TorchRLCollector
    from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv

    seen = []
    for cls in (TorchRLCollector, Collector):
        spy = _DeviceSpy()
        c = cls(
            ContinuousActionVecMockEnv(device=env_has),
            spy,
            frames_per_batch=4,
            total_frames=8,
            **kwargs,
        )
        batches = list(c)
        c.shutdown()
        seen.append((sorted(spy.seen), [str(b.device) for b in batches]))
    assert seen[1] == seen[0]
