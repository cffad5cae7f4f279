"""What TorchRL's collector does to a TorchRL env and its policy before collecting: specs given
to a policy built without them (``fill_policy_specs``), and the env transforms the policy needs
(``auto_register_policy_transforms``), added as TorchRL's collector adds them.

A policy module reads ``is_init`` (``InitTracker``) and, when it has recurrent parts (anything
with ``make_tensordict_primer()``, such as TorchRL's ``LSTMModule``/``GRUModule``), their state
entries (``TensorDictPrimer``). With ``True`` those the env's specs lack are appended; with
``None`` (TorchRL 0.14's default) nothing changes but a FutureWarning names them; ``False`` is
silent. torchrl is imported only for a TorchRL env, from which the transforms come.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from torch import nn

from hpccollect.envs import envbase
from hpccollect.errors import ArgumentValueError

__all__ = ["fill_policy_specs", "with_policy_transforms"]


def fill_policy_specs(env: Any, policy: Any) -> None:
    """Give a TorchRL policy built without specs the env's, as TorchRL's collector does: a
    ``RandomPolicy()`` its action spec, exploration modules made with ``spec=None`` theirs."""
    fill = getattr(policy, "set_action_spec_from_env", None)
    if not envbase.is_torchrl_env(env):
        if callable(fill) and getattr(policy, "action_spec", False) is None:
            fill(env)  # a RandomPolicy() on a gymnasium env
        return
    if callable(fill):
        fill(env)
    if isinstance(policy, nn.Module) and envbase.from_torchrl(env):
        modules = importlib.import_module("torchrl.modules")
        modules.set_exploration_modules_spec_from_env(policy, env)


def with_policy_transforms(env: Any, policy: Any, flag: bool | None, owner: str) -> Any:
    """``env``, with the transforms ``policy`` needs appended when ``flag`` is True."""
    if flag is False or not isinstance(policy, nn.Module):
        return env
    if not envbase.is_torchrl_env(env):
        if flag:
            raise ArgumentValueError(
                "auto_register_policy_transforms=True appends TorchRL transforms (InitTracker, "
                "TensorDictPrimer) to a TorchRL env, and this env is a gymnasium one: build it "
                "as a TorchRL env (torchrl's GymEnv), or leave auto_register_policy_transforms "
                "unset."
            )
        return env
    missing = _missing(env, policy)
    if not missing:
        return env
    if flag is None:
        names = ", ".join(type(t).__name__ for t in missing)
        warnings.warn(
            f"The env given to {owner} lacks transforms the policy reads ({names}). TorchRL "
            "appends them from its version 0.15 on; pass auto_register_policy_transforms=True "
            "to append them now, or False to leave the env as it is (and silence this).",
            FutureWarning,
            stacklevel=4,
        )
        return env
    for transform in missing:
        env = env.append_transform(transform)
    return env


def _spec_keys(env: Any) -> set:
    keys: set = set()
    for name in ("full_observation_spec", "full_state_spec"):
        spec = getattr(env, name, None)
        if spec is not None:
            keys.update(spec.keys(True, True))
    return keys


def _missing(env: Any, policy: nn.Module) -> list:
    """The transforms ``policy`` needs whose entries ``env``'s specs do not have, in order:
    ``InitTracker``, then each primer."""
    transforms = importlib.import_module("torchrl.envs.transforms")
    utils = importlib.import_module("torchrl.modules.utils")
    keys = _spec_keys(env)
    missing = []
    if not any(k == "is_init" or (isinstance(k, tuple) and k[-1] == "is_init") for k in keys):
        missing.append(transforms.InitTracker(init_key="is_init"))
    primer = utils.get_primers_from_module(policy, warn=False)
    parts = list(primer) if isinstance(primer, transforms.Compose) else [primer]
    for part in parts:
        if part is None:
            continue
        if (
            isinstance(part, transforms.TensorDictPrimer)
            and set(part.primers.keys(True, True)) <= keys
        ):
            continue
        missing.append(part)
    return missing
