"""The policy of the TorchRL step loop: what ``policy`` becomes on a TorchRL env (TorchRL's
wrapping rules: a TensorDict module as it is, ``nn.Module``s and callables keyed by their
argument names, ``None`` a random policy over the env's action spec)."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase
from torch import nn

from hpccollect.errors import ArgumentTypeError
from hpccollect.policy import TensorDictCallable, WrappedPolicy, check_policy, takes_tensordict

__all__ = ["SpecRandomPolicy", "leaf_keys", "private_key", "wrap_env_policy"]


class SpecRandomPolicy(TensorDictModuleBase):
    """``policy=None`` on a TorchRL env: a uniform draw from the env's full action spec, with
    torch's global generator, as TorchRL's ``RandomPolicy`` does."""

    def __init__(self, action_spec: Any) -> None:
        super().__init__()
        self.action_spec = action_spec
        self.in_keys: list = []
        self.out_keys = list(action_spec.keys(True, True))

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict.update(self.action_spec.rand())


def wrap_env_policy(policy: Any, env: Any, trust_policy: bool = False) -> WrappedPolicy:
    """TorchRL's wrapping rules on a TorchRL env: no policy draws random actions; a TensorDict
    module, a callable taking one TensorDict, or any policy with ``trust_policy`` is called with
    the TensorDict; another callable is called with the observation entries its parameters are
    named after, and its output is the env's action (``output1``, ... for a tuple's rest)."""
    if policy is None:
        return WrappedPolicy(SpecRandomPolicy(env.full_action_spec), None, None)
    weights = policy if isinstance(policy, nn.Module) else None
    if isinstance(policy, TensorDictModuleBase):
        return WrappedPolicy(policy, policy, None)
    check_policy(policy)
    if trust_policy or takes_tensordict(policy):
        return WrappedPolicy(TensorDictCallable(policy, []), weights, None)
    module = TensorDictModule(policy, **_keys_by_name(policy, env))
    return WrappedPolicy(module, weights, None)


def _keys_by_name(policy: Any, env: Any) -> dict[str, list]:
    target = policy.forward if isinstance(policy, nn.Module) else policy
    params = inspect.signature(target).parameters
    observations = set(env.observation_spec.keys())
    required = {n for n, p in params.items() if p.default is inspect.Parameter.empty}
    if required - observations:
        raise ArgumentTypeError(
            f"Arguments to policy.forward are incompatible with entries in the env's "
            f"observation spec: the parameters {sorted(params)} do not name entries of "
            f"{sorted(map(str, observations))}, and a plain callable is called with "
            "the observations its parameters are named after. Rename them, wrap the policy in a "
            "TensorDictModule with in_keys/out_keys, or pass trust_policy=True if it takes the "
            "TensorDict."
        )
    in_keys = [n for n in params if n in observations]
    out_keys = list(env.action_keys)
    sample = env.observation_spec.rand()
    with torch.no_grad():
        output = policy(**{k: sample.get(k) for k in in_keys})
    if isinstance(output, tuple):
        out_keys += [f"output{i + 1}" for i in range(len(output) - 1)]
    return {"in_keys": in_keys, "out_keys": out_keys}


def leaf_keys(td: TensorDictBase) -> set:
    return {k if isinstance(k, tuple) else (k,) for k in td.keys(True, True)}


def private_key(key: tuple) -> bool:
    return any(part.startswith("_") for part in key)
