"""Policies: TorchRL's wrapping rules, ``RandomPolicy``, exploration types, weights as TensorDicts.

Wrapping (as in TorchRL's collectors):

* a ``TensorDictModuleBase`` is used as is;
* a module or callable whose ``forward`` takes one TensorDict (named ``tensordict`` or ``td``, or
  annotated as a ``TensorDictBase``) is called with the TensorDict;
* any other module or callable becomes ``TensorDictModule(policy, in_keys=<observation keys>,
  out_keys=["action"])``;
* ``None`` gives a ``RandomPolicy`` drawing from the action spec.
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import CudaGraphModule, InteractionType, TensorDictModule, TensorDictModuleBase

# tensordict.nn exports interaction_type only from 0.15; probabilistic defines it in every version.
from tensordict.nn.probabilistic import interaction_type
from torch import nn

from hpccollect._compat import has_hooks
from hpccollect.envs.specs import TensorSpec
from hpccollect.errors import ArgumentTypeError, ArgumentValueError

__all__ = [
    "ExplorationType",
    "MLPActor",
    "RandomPolicy",
    "TensorDictCallable",
    "WrappedPolicy",
    "copy_weights_",
    "load_weights_",
    "resolve_exploration_type",
    "resolve_trust_policy",
    "takes_tensordict",
    "to_weights",
    "wrap_policy",
]

#: TorchRL's ``ExplorationType`` is tensordict's ``InteractionType``; so is ours.
ExplorationType = InteractionType


def resolve_exploration_type(
    exploration_type: Any = InteractionType.RANDOM, exploration_mode: str | None = None
) -> InteractionType:
    """Parse ``exploration_type`` (enum or name) and the deprecated ``exploration_mode`` string."""
    value = exploration_mode if exploration_mode is not None else exploration_type
    name = "exploration_mode" if exploration_mode is not None else "exploration_type"
    if isinstance(value, InteractionType):
        return value
    if isinstance(value, str):
        try:
            return InteractionType(value.lower())
        except ValueError:
            pass
        if value.upper() in InteractionType.__members__:
            return InteractionType[value.upper()]
    valid = ", ".join(f"ExplorationType.{m.name}" for m in InteractionType)
    raise ArgumentValueError(f"{name}={value!r} is not an exploration type; use one of {valid}.")


class RandomPolicy(TensorDictModuleBase):
    """Draws uniformly random actions from an action spec (``policy=None``).

    Args:
        action_spec: the spec actions are drawn from. None: the env's, which a collector gives
            it (``set_action_spec_from_env``) when it is the collector's policy.
        action_key: where the action is written.
        generator: the generator actions are drawn with; a freshly seeded one by default.
    """

    def __init__(
        self,
        action_spec: TensorSpec | None = None,
        action_key: str = "action",
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.action_spec = action_spec
        self.action_key = action_key
        if generator is None:
            generator = torch.Generator()
            generator.seed()
        self.generator = generator
        self.in_keys: list = []
        self.out_keys = [action_key]

    def set_action_spec_from_env(self, env: Any) -> None:
        """Draw from ``env``'s action spec, unless a spec was given.

        Args:
            env: an env with an ``action_spec`` (hpccollect's ``GymEnv`` or a TorchRL env).
        """
        if self.action_spec is None:
            self.action_spec = env.action_spec

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Write one random action from the action spec into ``tensordict``.

        Args:
            tensordict: the step's TensorDict; the action goes under ``action_key``.

        Returns:
            ``tensordict``, with the action.
        """
        action = self.sample()
        tensordict.set(self.action_key, action.to(tensordict.device or action.device))
        return tensordict

    def sample(self) -> torch.Tensor:
        """One action, without a TensorDict (the collector's fast path).

        Returns:
            The action, drawn uniformly from the action spec.

        Raises:
            ArgumentValueError: the policy has no action spec yet.
        """
        if self.action_spec is None:
            raise ArgumentValueError(
                "RandomPolicy() has no action spec: give it one (RandomPolicy(env.action_spec)), "
                "or pass it to a collector as its policy, which gives it the env's."
            )
        if isinstance(self.action_spec, TensorSpec):
            return self.action_spec.rand(generator=self.generator)
        return self.action_spec.rand()  # a TorchRL spec draws with torch's generator


def takes_tensordict(fn: Any) -> bool:
    """Whether ``fn`` (or ``fn.forward``) takes exactly one TensorDict argument."""
    target = fn.forward if isinstance(fn, nn.Module) else fn
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return False
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = [p for p in sig.parameters.values() if p.kind in kinds and p.default is p.empty]
    others = [p for p in sig.parameters.values() if p.kind == inspect.Parameter.VAR_POSITIONAL]
    if len(params) != 1 or others:
        return False
    if params[0].name in ("tensordict", "td"):
        return True
    try:
        hint = typing.get_type_hints(target).get(params[0].name)
    except Exception:
        hint = params[0].annotation
    return isinstance(hint, type) and issubclass(hint, TensorDictBase)


class TensorDictCallable(TensorDictModuleBase):
    """A module or callable that takes a TensorDict; may return a new one or write in place."""

    def __init__(self, fn: Callable, out_keys: Sequence[Any]) -> None:
        super().__init__()
        self.fn = fn
        self.in_keys: list = []
        self.out_keys = list(out_keys)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        out = self.fn(tensordict)
        return tensordict if out is None else out


@dataclass
class WrappedPolicy:
    """The policy as the collector runs it.

    Attributes:
        module: the ``TensorDictModuleBase`` called with a TensorDict.
        weights_module: the user-facing module whose parameters ``update_policy_weights_`` targets
            (None when the policy has no parameters).
        direct: ``(fn, in_keys, out_keys)`` when ``fn(*tensors)`` is exactly equivalent to
            calling ``module`` (a plain tensor-to-tensor callable), letting the step loop skip
            building a TensorDict each step; otherwise None.
    """

    module: TensorDictModuleBase
    weights_module: nn.Module | None
    direct: tuple[Callable, list, list] | None


def wrap_policy(
    policy: Any,
    observation_keys: Sequence[Any],
    action_spec: TensorSpec,
    action_key: str = "action",
    trust_policy: bool = False,
) -> WrappedPolicy:
    """Apply TorchRL's wrapping rules to ``policy`` (see the module docstring).

    ``trust_policy=True`` skips the rules, as TorchRL does: the policy is called with the
    TensorDict whatever its signature (it must read and write TensorDicts).
    """
    keys = [k[0] if isinstance(k, tuple) and len(k) == 1 else k for k in observation_keys]
    if policy is None:
        return WrappedPolicy(RandomPolicy(action_spec, action_key), None, None)
    if isinstance(policy, TensorDictModuleBase):
        return WrappedPolicy(policy, policy, _direct_call(policy))
    check_policy(policy)
    weights = policy if isinstance(policy, nn.Module) else None
    if trust_policy or takes_tensordict(policy):
        return WrappedPolicy(TensorDictCallable(policy, [action_key]), weights, None)
    module = TensorDictModule(policy, in_keys=list(keys), out_keys=[action_key])
    return WrappedPolicy(module, weights, (policy, list(keys), [action_key]))


def check_policy(policy: Any) -> Any:
    """``policy`` as a collector takes it: a TensorDictModule, an nn.Module, a callable or None.

    Args:
        policy: the collector's ``policy`` argument.

    Returns:
        ``policy``.

    Raises:
        ArgumentTypeError: ``policy`` is none of those (checked where the collector is built,
            before any worker starts).
    """
    if policy is not None and not callable(policy):
        raise ArgumentTypeError(
            f"policy must be a TensorDictModule, an nn.Module, a callable or None; got "
            f"{type(policy).__name__}."
        )
    return policy


def resolve_trust_policy(trust_policy: Any, policy: Any) -> bool:
    """TorchRL's default for ``trust_policy``: True for a ``CudaGraphModule`` (or a
    ``RandomPolicy``), False otherwise."""
    if trust_policy is None:
        return isinstance(policy, (CudaGraphModule, RandomPolicy))
    if not isinstance(trust_policy, bool):
        raise ArgumentTypeError(f"trust_policy must be True, False or None; got {trust_policy!r}.")
    return trust_policy


def _direct_call(policy: TensorDictModuleBase) -> tuple[Callable, list, list] | None:
    """A plain ``TensorDictModule`` (exact class, list keys, no hooks) is just its module."""
    if type(policy) is not TensorDictModule:
        return None
    if has_hooks(policy) or getattr(policy, "_kwargs", None):
        return None
    if not isinstance(policy.in_keys, list) or not isinstance(policy.out_keys, list):
        return None
    if getattr(policy, "out_to_in_map", False) or getattr(policy, "inplace", True) is not True:
        return None
    return policy.module, list(policy.in_keys), list(policy.out_keys)


# ------------------------------------------------------------------------------------ weights
def to_weights(obj: Any) -> TensorDictBase:
    """Weights as a nested TensorDict, from a module, a TensorDict or a (state_)dict."""
    if isinstance(obj, nn.Module):
        return TensorDict.from_module(obj)
    if isinstance(obj, TensorDictBase):
        return obj
    if isinstance(obj, Mapping):
        td = TensorDict(dict(obj), batch_size=[])
        return td.unflatten_keys(".") if any("." in k for k in obj if isinstance(k, str)) else td
    raise ArgumentTypeError(
        "policy_or_weights must be a module, a TensorDict of weights, a state_dict or None; "
        f"got {type(obj).__name__}."
    )


def load_weights_(module: nn.Module, weights: Any) -> None:
    """Copy ``weights`` into ``module``'s parameters and buffers in place."""
    copy_weights_(TensorDict.from_module(module), weights)


def copy_weights_(dest: TensorDictBase, weights: Any) -> None:
    """Copy ``weights`` (any form ``to_weights`` takes) into the weights TensorDict ``dest``.

    Args:
        dest: the weights to overwrite, in place (``TensorDict.from_module(policy)``).
        weights: a module, a TensorDict of weights or a ``state_dict`` of the same
            architecture (a TensorDictModule's weights, under ``"module"``, fit its module's).

    Raises:
        ArgumentValueError: ``weights`` hold other entries than ``dest``, or entries of other
            shapes (weights of another architecture).
    """
    src = to_weights(weights)
    # a TensorDictModule keeps its module's weights under "module": accept either layout
    if _under_module(src) and not _under_module(dest):
        src = src.get("module")
    elif _under_module(dest) and not _under_module(src):
        src = TensorDict({"module": src}, batch_size=[])
    dest_keys, src_keys = set(dest.keys(True, True)), set(src.keys(True, True))
    if src_keys != dest_keys:
        missing = sorted(map(str, dest_keys - src_keys))
        unexpected = sorted(map(str, src_keys - dest_keys))
        raise _other_weights(f"missing {missing}, unexpected {unexpected}")
    wrong = [
        f"{key}: {tuple(src.get(key).shape)} for {tuple(dest.get(key).shape)}"
        for key in sorted(dest_keys, key=str)
        if src.get(key).shape != dest.get(key).shape
    ]
    if wrong:
        raise _other_weights(f"shapes {', '.join(wrong)}")
    with torch.no_grad():
        dest.update_(src.to(dest.device) if dest.device is not None else src)


def _other_weights(what: str) -> ArgumentValueError:
    return ArgumentValueError(
        f"policy weights do not match the collector's policy: {what}. Pass weights taken from "
        "the same architecture (TensorDict.from_module(policy) or policy.state_dict())."
    )


def _under_module(weights: TensorDictBase) -> bool:
    return list(weights.keys()) == ["module"]


class MLPActor(nn.Module):
    """The main job's small default policy: an MLP over the flattened observation leaves.

    Discrete actions: one-hot samples of a categorical over the logits (the argmax under
    ``ExplorationType.MODE``); Box actions: the network output squashed into the bounds, with
    Gaussian noise when exploring. Randomly initialised unless weights are loaded.

    Args:
        obs_shapes: the event shape of each observation leaf, in the order they are passed.
        action_spec: the env's (unbatched) action spec.
        hidden: width of the two hidden layers.
    """

    def __init__(
        self, obs_shapes: Sequence[Sequence[int]], action_spec: TensorSpec, hidden: int = 64
    ) -> None:
        super().__init__()
        self.obs_shapes = [tuple(s) for s in obs_shapes]
        self.discrete = hasattr(action_spec, "n") and action_spec.shape[-1:] == (action_spec.n,)
        out = action_spec.shape[-1] if len(action_spec.shape) else 1
        sizes = [math.prod(s) for s in self.obs_shapes]
        self.net = nn.Sequential(
            nn.Linear(sum(sizes), hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, out),
        )
        low, high = getattr(action_spec, "low", None), getattr(action_spec, "high", None)
        self.register_buffer("low", torch.zeros(out) if low is None else low.reshape(out).float())
        self.register_buffer("high", torch.ones(out) if high is None else high.reshape(out).float())
        self.dtype_out = action_spec.dtype

    def forward(self, *observations: torch.Tensor) -> torch.Tensor:
        flat = [
            o.reshape(*o.shape[: o.ndim - len(shape)], math.prod(shape)).float()
            for o, shape in zip(observations, self.obs_shapes, strict=True)
        ]
        x = self.net(torch.cat(flat, -1))
        explore = interaction_type() in (None, InteractionType.RANDOM)
        if self.discrete:
            index = torch.distributions.Categorical(logits=x).sample() if explore else x.argmax(-1)
            return torch.nn.functional.one_hot(index, x.shape[-1]).to(self.dtype_out)
        if explore:
            x = x + 0.5 * torch.randn_like(x)
        return (self.low + (torch.tanh(x) + 1) / 2 * (self.high - self.low)).to(self.dtype_out)
