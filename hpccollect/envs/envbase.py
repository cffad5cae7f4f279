"""TorchRL environments (``EnvBase`` and its subclasses), recognised by their interface.

torchrl is never imported to recognise one: an env that has the TensorDict-speaking methods the
collector calls is taken as one. Only a transform that the collector must add (``StepCounter``
for ``max_frames_per_traj``, as TorchRL's collector adds it) is imported, from the torchrl that
the env itself comes from.
"""

from __future__ import annotations

import importlib
from collections import OrderedDict
from typing import Any

import torch

from hpccollect.errors import ArgumentValueError

__all__ = [
    "add_step_counter",
    "env_state_dict",
    "from_torchrl",
    "is_torchrl_env",
    "load_env_state_dict",
    "num_envs",
    "update_env_kwargs",
]

#: what the collector calls on a TorchRL env
_METHODS = ("reset", "step_and_maybe_reset", "rand_action", "fake_tensordict", "set_seed", "close")
_ATTRIBUTES = ("batch_size", "full_action_spec", "done_keys", "output_spec")


def is_torchrl_env(obj: Any) -> bool:
    """Whether ``obj`` is a TorchRL env instance (an ``EnvBase``, by its interface)."""
    if isinstance(obj, type):
        return False
    cls = type(obj)
    return all(callable(getattr(cls, name, None)) for name in _METHODS) and all(
        hasattr(obj, name) for name in _ATTRIBUTES
    )


def from_torchrl(obj: Any) -> bool:
    """Whether ``obj``'s class comes from torchrl (an ``EnvCreator``, say), by its module."""
    return any(c.__module__.split(".")[0] == "torchrl" for c in type(obj).__mro__)


def num_envs(env: Any) -> int:
    """How many envs step together (the product of the env's batch size, 1 for ``[]``)."""
    return int(torch.Size(env.batch_size).numel())


def env_name(env: Any) -> str:
    """A short name for messages: the base env's id where it has one, else its class."""
    base = getattr(env, "base_env", env)
    for attr in ("env_name", "_env_name"):
        value = getattr(base, attr, None)
        if isinstance(value, str):
            return value
    return type(env).__name__


def update_env_kwargs(env: Any, kwargs: dict) -> None:
    """``create_env_kwargs`` for an env given as an instance: only a batched env (``SerialEnv``,
    ``ParallelEnv``) takes them before it starts, as in TorchRL."""
    if not kwargs:
        return
    if not _is_batched(env):
        raise kwargs_refused(
            env,
            "pass a constructor (a callable or an EnvCreator) instead, or a SerialEnv/ParallelEnv.",
        )
    env.update_kwargs(kwargs)


def kwargs_refused(env: Any, fix: str) -> ArgumentValueError:
    """The error for ``create_env_kwargs`` given with an env instance that cannot take them.

    Args:
        env: the env instance given as ``create_env_fn``.
        fix: what to pass instead, for the message.

    Returns:
        The error to raise.
    """
    return ArgumentValueError(
        f"create_env_kwargs were given, but create_env_fn is an env instance of type "
        f"{type(env).__name__} that cannot take them; {fix}"
    )


# looked up on the class: batched and transformed envs hand unknown attributes on to the envs
# they hold, so an instance of either seems to have both
def _is_transformed(env: Any) -> bool:
    return hasattr(type(env), "transform") and hasattr(env, "base_env")


def _is_batched(env: Any) -> bool:
    return callable(getattr(type(env), "update_kwargs", None))


def env_state_dict(env: Any) -> OrderedDict:
    """The env part of a collector's ``state_dict``, by TorchRL's rule: a transformed env's
    transforms (running statistics of ObservationNorm, ...), a batched env's own, else empty."""
    if _is_transformed(env):
        return env.transform.state_dict()
    if _is_batched(env):
        return env.state_dict()
    return OrderedDict()


def load_env_state_dict(env: Any, state: Any) -> None:
    """Restore what ``env_state_dict`` returned."""
    if _is_transformed(env):
        env.transform.load_state_dict(state)
    elif _is_batched(env):
        env.load_state_dict(state)
    elif state:
        raise ArgumentValueError(
            f"state_dict has an env_state_dict with {len(state)} entries, but env "
            f"{type(env).__name__} keeps no state (it is neither transformed nor batched)."
        )


def add_step_counter(env: Any, max_steps: int) -> Any:
    """The env with a ``StepCounter(max_steps)`` appended, as TorchRL's collector does for
    ``max_frames_per_traj``: trajectories are truncated after ``max_steps`` steps and the batch
    gains ``step_count``."""
    for key in env.output_spec.keys(True, True):
        if "step_count" in ((key,) if isinstance(key, str) else key):
            raise ArgumentValueError(
                "max_frames_per_traj is set, but the env already counts steps (it has a "
                f"'step_count' entry, key {key!r}): drop max_frames_per_traj and give the env's "
                "StepCounter max_steps instead, or remove that StepCounter."
            )
    transforms = _torchrl_module(env, "envs")
    return transforms.TransformedEnv(env, transforms.StepCounter(max_steps=max_steps))


def _torchrl_module(env: Any, name: str) -> Any:
    """``torchrl.<name>``, from the package the env's class comes from."""
    if from_torchrl(env):
        return importlib.import_module(f"torchrl.{name}")
    raise ArgumentValueError(
        f"max_frames_per_traj needs torchrl's StepCounter, but env {type(env).__name__} does not "
        "come from torchrl; count steps in the env instead."
    )
