"""What a job checks and builds before any collector starts: the env id (and the modules that
register it), the output, the policy for the env's spaces, and the options a dataset records.
The local and the distributed job share it; a worker or collector rank calls ``env_maker``'s
constructor."""

from __future__ import annotations

import functools
import importlib
import multiprocessing
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from hpccollect.app.config import RunConfig
from hpccollect.app.policy_option import build_policy
from hpccollect.app.progress import show_warning_line
from hpccollect.app.resume import Attempt, run_files
from hpccollect.envs.gym import GymEnv
from hpccollect.errors import ArgumentValueError
from hpccollect.storage import dataset_format
from hpccollect.storage.outputs import check_final_name, check_kind, check_writable

__all__ = ["check_output", "env_maker", "probe_policy", "record", "resolve_env"]


def _import(module: str, option: str) -> None:
    try:
        importlib.import_module(module)
    except Exception as err:
        raise ArgumentValueError(
            f"{option}: cannot import module {module!r} ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); check the name and that its "
            "directory is on PYTHONPATH."
        ) from err


def resolve_env(env: str, imports: tuple[str, ...] = ()) -> str:
    """Import ``imports`` and, for gymnasium's ``module:EnvName-v0``, the module; check that the
    env id is registered. Returns the bare env id."""
    for module in imports:
        _import(module, f"--import {module}")
    module, _, name = env.rpartition(":")
    if module:
        _import(module, f"--env {env}")
    if name not in gym.registry:
        where = f" (module {module!r} was imported but did not register it)" if module else ""
        raise ArgumentValueError(
            f"--env: unknown gymnasium env {name!r}{where}; list ids with "
            "python -c 'import gymnasium; gymnasium.pprint_registry()', and for envs that a "
            "module registers use --env module:EnvName-v0 or --import module."
        )
    return name


def _make_env(env_id: str, kwargs: dict, num_envs: int, imports: tuple[str, ...] = ()) -> gym.Env:
    # a worker process starts fresh: it imports the modules (and gymnasium the ``module:`` of
    # ``module:EnvName-v0``) to register the envs there too
    if multiprocessing.parent_process() is not None:  # a worker: its warnings as the job's
        warnings.showwarning = show_warning_line
    for module in imports:
        importlib.import_module(module)
    if num_envs == 1:
        return gym.make(env_id, **kwargs)
    return gym.vector.SyncVectorEnv([functools.partial(gym.make, env_id, **kwargs)] * num_envs)


def env_maker(cfg: RunConfig) -> Callable[[], gym.Env]:
    """The env constructor every worker (or collector rank) calls: picklable, imports first."""
    return functools.partial(
        _make_env, cfg.env, dict(cfg.env_kwargs), cfg.num_envs, tuple(cfg.imports)
    )


def probe_policy(cfg: RunConfig, make: Callable[[], gym.Env], seed: int | None = None) -> Any:
    """Build one env to learn its spaces, and the policy ``--policy`` names for them (the
    default MLP's weights drawn with ``seed``, by default ``cfg.seed``)."""
    try:
        probe = GymEnv(make())
    except Exception as err:
        raise ArgumentValueError(
            f"--env {cfg.env} with --env-kwargs {cfg.env_kwargs}: {err}"
        ) from err
    try:
        torch.manual_seed(cfg.seed if seed is None else seed)  # the default MLP's weights
        policy = build_policy(cfg.policy, probe)
        if seed is not None:
            torch.manual_seed(cfg.seed)  # single's sampling: this run's own stream
        return policy
    finally:
        probe.close()


def check_output(out: Path, overwrite: bool) -> None:
    """Refuse an existing output, or an earlier run's files beside it (unless ``overwrite``),
    and an output that cannot be written."""
    check_final_name(out)
    partial = dataset_format(out).partial_path(out)
    check_kind(out, folder=False)
    earlier = [p for p in (out, partial) if p.exists()] + run_files(out)
    if earlier and not overwrite:
        raise ArgumentValueError(
            f"{earlier[0]} already exists; pass --overwrite to replace it (or --resume {out} to "
            "continue that run) or --out elsewhere."
        )
    check_writable(out, hint=" (or $HPCCOLLECT_DATA_DIR)")


def record(cfg: RunConfig, attempt: Attempt | None) -> dict[str, Any]:
    """The options a dataset file records: the run's (so that ``--resume`` finds them), and
    for a resumed attempt which one it is."""
    out = cfg.as_dict()
    if attempt is not None:
        out["resume"] = attempt.record()
    return out
