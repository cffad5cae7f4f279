"""The job's ``--policy`` option: ``default``, ``random``, a ``module:function`` factory or a
``state_dict`` file, each checked so that a mistake is one line naming what was expected."""

from __future__ import annotations

import importlib
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpccollect.envs.gym import GymEnv
from hpccollect.errors import ArgumentValueError
from hpccollect.policy import MLPActor

__all__ = ["build_policy"]


def build_policy(spec: str, env: GymEnv) -> Any:
    """``random``, ``default`` (a small MLP), ``module:function`` (called with the observation
    and action spaces) or a path to a ``state_dict`` checkpoint for the default MLP."""
    if spec == "random":
        return None
    shapes = [tuple(c.spec.shape) for c in env.obs_codecs.values()]
    if spec == "default":
        return MLPActor(shapes, env.action_codec.spec)
    if ":" in spec and not Path(spec).exists():
        return _from_factory(spec, env)
    path = Path(spec)
    if not path.is_file():
        raise ArgumentValueError(
            f"--policy {spec!r} is not 'random', 'default', a module:function factory or an "
            "existing checkpoint file."
        )
    policy = MLPActor(shapes, env.action_codec.spec)
    policy.load_state_dict(_read_state_dict(path, policy))
    return policy


def _from_factory(spec: str, env: GymEnv) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ArgumentValueError(
            f"--policy {spec}: a factory is module:function, both named (e.g. "
            "--policy mypolicies:make_actor)."
        )
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except Exception as err:  # a module that fails as it is imported fails here too
        text = str(err).splitlines()[0] if str(err) else "(no message)"
        raise ArgumentValueError(
            f"--policy {spec}: cannot import {attr} from {module_name} ({type(err).__name__}: "
            f"{text}); check the name and that its directory is on PYTHONPATH."
        ) from err
    space = env.env
    try:
        policy = factory(
            getattr(space, "single_observation_space", space.observation_space),
            getattr(space, "single_action_space", space.action_space),
        )
    except Exception as err:
        raise ArgumentValueError(
            f"--policy {spec}: {attr}(observation_space, action_space) raised "
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else '(no message)'}"
        ) from err
    if not callable(policy):
        raise ArgumentValueError(
            f"--policy {spec}: {attr}() returned {type(policy).__name__}, not a policy; return an "
            "nn.Module or a callable that maps observation tensors to an action."
        )
    return policy


def _read_state_dict(path: Path, policy: nn.Module) -> Mapping[str, torch.Tensor]:
    """The checkpoint at ``path``, checked against the default MLP ``policy`` key by key."""
    expected = policy.state_dict()
    wanted = (
        f"a state_dict of the default MLP for this env (torch.save(policy.state_dict(), path); "
        f"keys {', '.join(expected)})"
    )
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        what = (
            "holds Python objects, not only tensors (it is read with weights_only=True)"
            if "Unsupported global" in str(err)
            else "is not a readable torch checkpoint"
        )
        raise ArgumentValueError(f"--policy {path}: {what}; expected {wanted}.") from err
    except Exception as err:
        raise ArgumentValueError(
            f"--policy {path}: is not a readable torch checkpoint ({type(err).__name__}); "
            f"expected {wanted}."
        ) from err
    if not isinstance(state, Mapping) or not all(
        isinstance(v, torch.Tensor) for v in state.values()
    ):
        raise ArgumentValueError(
            f"--policy {path}: holds a {type(state).__name__}, not a state_dict; expected {wanted}."
        )
    missing = [k for k in expected if k not in state]
    unexpected = [str(k) for k in state if k not in expected]
    if missing or unexpected:
        raise ArgumentValueError(
            f"--policy {path}: keys do not match the default MLP: missing {missing}, "
            f"unexpected {unexpected}; expected {wanted}."
        )
    wrong = [
        f"{key} {tuple(state[key].shape)} (needs {tuple(value.shape)})"
        for key, value in expected.items()
        if tuple(state[key].shape) != tuple(value.shape)
    ]
    if wrong:
        raise ArgumentValueError(
            f"--policy {path}: shapes do not match the default MLP for this env (was it trained "
            f"on another env?): {', '.join(sorted(wrong, key=lambda w: not w.startswith('net')))}."
        )
    return state
