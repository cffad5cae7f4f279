"""What a dataset file records about the env its data came from, so the env can be rebuilt.

The attributes are ``env_id``, ``env_spec`` (gymnasium's ``EnvSpec.to_json()``: id, entry point,
kwargs, ``max_episode_steps``, wrappers added after ``make``), ``env_kwargs`` and the
``observation_space``/``action_space`` of the env actually used (``FrozenLake-v1`` with
``map_name="8x8"`` is ``Discrete(64)``, not the registered default's ``Discrete(16)``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec, load_env_creator

from hpccollect.errors import ArgumentTypeError, ArgumentValueError
from hpccollect.storage.spaces_json import describe, space_to_json

__all__ = ["ENV_ATTRS", "env_metadata", "env_spec_from_attrs", "recorded_env"]

#: the file attributes that say which env a file's data came from (merge compares them)
ENV_ATTRS = ("env_id", "env_spec", "env_kwargs", "observation_space", "action_space")


def env_metadata(env: Any, env_kwargs: dict | None = None) -> dict[str, str]:
    """The env attributes of a dataset file for ``env``.

    ``env`` is an env id (made with ``env_kwargs`` to learn its spec and spaces), an ``EnvSpec``,
    a gymnasium env or vector env, or an hpccollect ``GymEnv``; None records nothing.
    """
    if env is None:
        if env_kwargs:
            raise ArgumentValueError("env_kwargs needs env: pass the env id they are for.")
        return {}
    if env_kwargs is not None and not isinstance(env_kwargs, dict):
        raise ArgumentTypeError(f"env_kwargs must be a dict, got {type(env_kwargs).__name__}.")
    if isinstance(env, (str, EnvSpec)):
        try:
            made = gym.make(env, **(env_kwargs or {}))
        except Exception as err:
            name = env if isinstance(env, str) else env.id
            raise ArgumentValueError(
                f"env={name!r} with env_kwargs={env_kwargs or {}}: cannot make it to record its "
                f"spec and spaces: {err}"
            ) from err
        try:
            return _describe(made, env_kwargs)
        finally:
            made.close()
    if env_kwargs:
        raise ArgumentValueError(
            "env_kwargs only goes with an env id; a made env already carries its kwargs in its spec."
        )
    if not isinstance(env, (gym.Env, gym.vector.VectorEnv)):
        env = getattr(env, "env", env)  # an hpccollect GymEnv holds the gymnasium env
    return _describe(env, None)


def _describe(env: Any, env_kwargs: dict | None) -> dict[str, str]:
    if isinstance(env, gym.vector.VectorEnv):
        spec = env.spec or getattr(getattr(env, "envs", [None])[0], "spec", None)
        spaces = env.single_observation_space, env.single_action_space
    elif isinstance(env, gym.Env):
        spec, spaces = env.spec, (env.observation_space, env.action_space)
    else:
        raise ArgumentTypeError(
            "env must be an env id, an EnvSpec, a gymnasium env or a GymEnv, got "
            f"{type(env).__name__}."
        )
    attrs = {
        "env_id": spec.id if spec is not None else type(env.unwrapped).__name__,
        "env_kwargs": describe(env_kwargs if env_kwargs is not None else _kwargs(spec)),
        "observation_space": space_to_json(spaces[0]),
        "action_space": space_to_json(spaces[1]),
    }
    if spec is not None:
        # a callable entry point, or kwargs JSON cannot hold: env_id + env_kwargs remain
        with contextlib.suppress(ValueError, TypeError, AssertionError):
            attrs["env_spec"] = spec.to_json()
    return attrs


def _kwargs(spec: EnvSpec | None) -> dict:
    return {} if spec is None else dict(spec.kwargs)


def env_spec_from_attrs(attrs: Any) -> EnvSpec | None:
    """The ``EnvSpec`` a file records (None for files written without one)."""
    text = attrs.get("env_spec")
    if text is None:
        return None
    return EnvSpec.from_json(text.decode() if isinstance(text, bytes) else str(text))


def recorded_env(attrs: Any) -> EnvSpec | None:
    """The env a file records, as an ``EnvSpec`` gymnasium can make here, else None.

    Files without ``env_spec`` (older ones, or an env whose spec JSON cannot hold) fall back to
    the registered spec of ``env_id`` with the recorded ``env_kwargs``.
    """
    spec = env_spec_from_attrs(attrs)
    if spec is not None:
        return spec if spec.id in gym.registry or _loadable(spec.entry_point) else None
    env_id = attrs.get("env_id")
    if env_id is None or str(env_id) not in gym.registry:
        return None
    spec = gym.spec(str(env_id))
    kwargs = json.loads(attrs.get("env_kwargs", "{}"))
    steps = kwargs.pop("max_episode_steps", spec.max_episode_steps)
    spec = dataclasses.replace(spec, kwargs={**spec.kwargs, **kwargs}, max_episode_steps=steps)
    try:  # kwargs recorded as text (not JSON-able values) may not make the env any more
        gym.make(spec).close()
    except Exception:
        return None
    return spec


def _loadable(entry_point: Any) -> bool:
    if not isinstance(entry_point, str):
        return False
    try:
        load_env_creator(entry_point)
    except (ImportError, AttributeError, ValueError):
        return False
    return True
