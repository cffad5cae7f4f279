"""``create_env_fn`` as TorchRL accepts it, made into the env a collector steps."""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym

from hpccollect.envs.envbase import is_torchrl_env, kwargs_refused, update_env_kwargs
from hpccollect.envs.gym import GymEnv
from hpccollect.errors import ArgumentTypeError, ArgumentValueError, EnvError, with_builtin

__all__ = ["check_env_kwargs", "make_env"]

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
    kwargs = check_env_kwargs(create_env_kwargs)
    encoding = {"categorical_action_encoding": categorical_action_encoding}
    if isinstance(create_env_fn, str):
        return GymEnv(create_env_fn, **encoding, **kwargs)
    if isinstance(create_env_fn, (GymEnv, gym.Env, gym.vector.VectorEnv)):
        if kwargs:
            raise kwargs_refused(
                create_env_fn, "pass a constructor (a callable or an env id) instead."
            )
        if isinstance(create_env_fn, GymEnv):
            return create_env_fn
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


def check_env_kwargs(create_env_kwargs: Any) -> dict:
    """``create_env_kwargs`` as a dict of keyword arguments for ``create_env_fn`` (None: none).

    Args:
        create_env_kwargs: the keyword arguments, or None.

    Returns:
        A new dict of them.

    Raises:
        ArgumentTypeError: ``create_env_kwargs`` is not a mapping of argument names.
    """
    if create_env_kwargs is None:
        return {}
    if not isinstance(create_env_kwargs, Mapping) or not all(
        isinstance(name, str) for name in create_env_kwargs
    ):
        raise ArgumentTypeError(
            f"create_env_kwargs must be a dict of keyword arguments for create_env_fn (one dict "
            f"per worker in a list, for a collector with workers), got "
            f"{reprlib.repr(create_env_kwargs)}."
        )
    return dict(create_env_kwargs)


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
