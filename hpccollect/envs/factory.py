"""``create_env_fn`` as TorchRL accepts it, made into the env a collector steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from hpccollect.envs.envbase import is_torchrl_env, update_env_kwargs
from hpccollect.envs.gym import GymEnv
from hpccollect.errors import ArgumentTypeError, ArgumentValueError, EnvError, with_builtin

__all__ = ["make_env"]

_GYM = (GymEnv, gym.Env, gym.vector.VectorEnv)


def make_env(
    create_env_fn: Any,
    create_env_kwargs: dict | None = None,
    *,
    categorical_action_encoding: bool = False,
) -> Any:
    """The env behind ``create_env_fn``: a ``GymEnv`` for gymnasium envs, the env itself for a
    TorchRL env (an ``EnvBase``, recognised by its interface).

    Accepts an env id string, a gymnasium env or vector env, a ``GymEnv``, a TorchRL env, a
    callable returning any of those (an ``EnvCreator`` too), or a list of callables: gymnasium
    envs run as one ``SyncVectorEnv``; a list of one TorchRL env constructor is that env.
    """
    kwargs = dict(create_env_kwargs or {})
    encoding = {"categorical_action_encoding": categorical_action_encoding}
    if isinstance(create_env_fn, GymEnv):
        return create_env_fn
    if isinstance(create_env_fn, str):
        return GymEnv(create_env_fn, **encoding, **kwargs)
    if isinstance(create_env_fn, (gym.Env, gym.vector.VectorEnv)):
        return GymEnv(create_env_fn, **encoding)
    if is_torchrl_env(create_env_fn):
        update_env_kwargs(create_env_fn, kwargs)
        return create_env_fn
    if isinstance(create_env_fn, (list, tuple)):
        return _from_list(list(create_env_fn), kwargs, encoding)
    if callable(create_env_fn):
        made = _call(create_env_fn, kwargs)
        if isinstance(made, (*_GYM, str)) or is_torchrl_env(made):
            return make_env(made, **encoding)
        raise ArgumentTypeError(
            f"create_env_fn returned {type(made).__name__}; it must return a gymnasium.Env, a "
            "gymnasium.vector.VectorEnv, an hpccollect.envs.GymEnv or a TorchRL env (EnvBase)."
        )
    raise ArgumentTypeError(
        f"create_env_fn must be an env id string, a gymnasium env, a TorchRL env, or a callable "
        f"returning one; got {create_env_fn!r} of type {type(create_env_fn).__name__}."
    )


def _call(fn: Callable, kwargs: dict) -> Any:
    try:
        return fn(**kwargs)
    except Exception as err:
        raise with_builtin(EnvError, err)(
            f"create_env_fn raised {type(err).__name__} while building the env: {err}"
        ) from err


def _from_list(fns: list, kwargs: dict, encoding: dict) -> Any:
    if not fns or not all(callable(f) for f in fns):
        raise ArgumentTypeError(
            "create_env_fn: a list must hold one or more callables that return envs."
        )
    made = [_call(f, kwargs) for f in fns]
    if any(is_torchrl_env(env) for env in made):
        if len(made) == 1:
            return made[0]
        for env in made:
            env.close()
        raise ArgumentValueError(
            f"create_env_fn lists {len(made)} TorchRL env constructors, but this collector "
            "requires exactly one environment constructor: give several to MultiSyncDataCollector/MultiaSyncDataCollector (one per "
            "worker), or batch them in one env with SerialEnv/ParallelEnv."
        )
    envs = iter(made)
    vec = gym.vector.SyncVectorEnv(
        [lambda: next(envs) for _ in made], autoreset_mode=gym.vector.AutoresetMode.DISABLED
    )
    return GymEnv(vec, **encoding)
