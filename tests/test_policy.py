"""Policy wrapping rules, exploration types, weights."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType, TensorDictModule
from torch import nn

from hpccollect import ExplorationType, GymEnv, SyncDataCollector
from hpccollect.errors import ArgumentTypeError, ArgumentValueError, PolicyError
from hpccollect.policy import (
    RandomPolicy,
    load_weights_,
    resolve_exploration_type,
    takes_tensordict,
    to_weights,
    wrap_policy,
)

SPEC = GymEnv("CartPole-v1").action_spec


class TDForward(nn.Module):
    def forward(self, tensordict):
        tensordict["action"] = torch.nn.functional.one_hot(
            (tensordict["observation"][..., 2] > 0).long(), 2
        )
        return tensordict


class Annotated(nn.Module):
    def forward(self, data: TensorDictBase):
        return data


def test_takes_tensordict_rules():
    assert takes_tensordict(TDForward())
    assert takes_tensordict(Annotated())
    assert takes_tensordict(lambda td: td)
    assert not takes_tensordict(nn.Linear(4, 2))
    assert not takes_tensordict(lambda obs, extra: obs)


def test_wrap_rules():
    tdm = TensorDictModule(nn.Linear(4, 2), in_keys=["observation"], out_keys=["action"])
    assert wrap_policy(tdm, [("observation",)], SPEC).module is tdm
    wrapped = wrap_policy(nn.Linear(4, 2), [("observation",)], SPEC)
    assert isinstance(wrapped.module, TensorDictModule)
    assert wrapped.module.in_keys == ["observation"] and wrapped.module.out_keys == ["action"]
    assert wrapped.direct is not None
    dict_keys = wrap_policy(lambda a, b: a, [("position",), ("sensors", "lidar")], SPEC)
    assert dict_keys.module.in_keys == ["position", ("sensors", "lidar")]
    random = wrap_policy(None, [("observation",)], SPEC)
    assert isinstance(random.module, RandomPolicy) and random.weights_module is None
    td = wrap_policy(TDForward(), [("observation",)], SPEC)
    assert td.direct is None
    with pytest.raises(ArgumentTypeError, match="policy must be"):
        wrap_policy(3, [("observation",)], SPEC)


@pytest.mark.parametrize(
    "value,expected",
    [
        (ExplorationType.MODE, InteractionType.MODE),
        ("random", InteractionType.RANDOM),
        ("MEAN", InteractionType.MEAN),
        ("deterministic", InteractionType.DETERMINISTIC),
    ],
)
def test_exploration_type_parsing(value, expected):
    assert resolve_exploration_type(value) is expected


def test_unknown_exploration_type_names_argument():
    with pytest.raises(
        ArgumentValueError, match="exploration_type='greedy'.*ExplorationType.RANDOM"
    ):
        resolve_exploration_type("greedy")
    with pytest.raises(ArgumentValueError, match="exploration_mode"):
        resolve_exploration_type(InteractionType.RANDOM, "nope")
    assert resolve_exploration_type(InteractionType.RANDOM, "mode") is InteractionType.MODE


def test_policy_without_action_key_fails_at_construction():
    bad = TensorDictModule(nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"])
    with pytest.raises(PolicyError, match="did not write the action key 'action'.*logits"):
        SyncDataCollector("CartPole-v1", bad, frames_per_batch=10)


def test_policy_with_wrong_action_shape_fails_at_construction():
    with pytest.raises(PolicyError, match=r"shape \(3,\).*needs shape \(2,\)"):
        SyncDataCollector("CartPole-v1", nn.Linear(4, 3), frames_per_batch=10)


def test_policy_that_raises_fails_at_construction():
    with pytest.raises(PolicyError, match="raised RuntimeError.*observation"):
        SyncDataCollector("CartPole-v1", nn.Linear(5, 2), frames_per_batch=10)


def test_weights_roundtrip_between_forms():
    src, dst = nn.Linear(4, 2), nn.Linear(4, 2)
    for weights in (src, to_weights(src), src.state_dict()):
        dst.reset_parameters()
        load_weights_(dst, weights)
        torch.testing.assert_close(dst.weight, src.weight)
    wrapped = TensorDictModule(src, in_keys=["observation"], out_keys=["action"])
    load_weights_(dst, wrapped)  # a TensorDictModule's weights load into its bare module
    with pytest.raises(ArgumentValueError, match="missing"):
        load_weights_(nn.Linear(4, 3, bias=False), TensorDict({"w": torch.zeros(1)}, []))
    # the same names, another architecture: named with both shapes, nothing copied
    before = dst.weight.clone()
    with pytest.raises(
        ArgumentValueError, match=r"shapes bias: \(3,\) for \(2,\), weight: \(3, 3\) for \(2, 4\)"
    ):
        load_weights_(dst, nn.Linear(3, 3).state_dict())
    assert torch.equal(dst.weight, before)


def test_random_policy_keeps_a_given_generator_seed():
    def draws():
        policy = RandomPolicy(SPEC, generator=torch.Generator().manual_seed(4))
        return torch.stack([policy.sample() for _ in range(32)])

    assert torch.equal(draws(), draws())


def test_policy_error_mid_run_names_the_step():
    class FailsLater(nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, observation):
            self.calls += 1
            if self.calls > 4:
                raise ValueError("policy broke")
            return torch.nn.functional.one_hot(torch.tensor(0), 2)

    collector = SyncDataCollector("CartPole-v1", FailsLater(), frames_per_batch=10)
    with pytest.raises(PolicyError, match="raised ValueError at step 3.*policy broke"):
        next(iter(collector))
    collector.shutdown()


def test_random_policy_without_a_spec_takes_the_collectors_env_spec() -> None:
    """TorchRL's ``RandomPolicy()``: built with no spec, given the env's by the collector."""
    from hpccollect.collectors import RandomPolicy as FromCollectors

    assert FromCollectors is RandomPolicy
    with pytest.raises(ArgumentValueError, match=r"RandomPolicy\(\) has no action spec"):
        RandomPolicy()(TensorDict({}, []))
    collector = SyncDataCollector(
        lambda: GymEnv("CartPole-v1"), RandomPolicy(), frames_per_batch=50, total_frames=50
    )
    try:
        (batch,) = list(collector)
    finally:
        collector.shutdown()
    actions = batch["action"]
    assert actions.shape == (50, 2) and (actions.sum(-1) == 1).all()
    assert len(set(actions.argmax(-1).tolist())) == 2  # both actions drawn
