"""The collector's constructor arguments, checked once and grouped into small frozen objects.

Every collector (sync, multi-process, distributed) builds these first, so bad input fails in the
caller's process at construction, with a message naming the argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict.nn import InteractionType

from hpccollect._checks import check_bool, check_callable, check_int
from hpccollect.errors import ArgumentTypeError, ArgumentValueError
from hpccollect.policy import resolve_exploration_type

__all__ = [
    "BatchOptions",
    "Devices",
    "check_batch_options",
    "check_cat_results",
    "check_preemptive_threshold",
    "env_fns",
    "per_worker",
    "resolve_devices",
    "to_device",
]


@dataclass(frozen=True)
class BatchOptions:
    """How many frames, how episodes are cut, and what the output looks like."""

    frames_per_batch: int
    total_frames: int  # -1: endless
    max_frames_per_traj: int | None  # None: no step counting
    init_random_frames: int  # 0: none
    reset_at_each_iter: bool
    split_trajs: bool
    exploration_type: InteractionType
    return_same_td: bool
    reset_when_done: bool
    set_truncated: bool
    postproc: Any

    @property
    def endless(self) -> bool:
        return self.total_frames < 0


def check_batch_options(
    *,
    frames_per_batch: Any,
    total_frames: Any = -1,
    max_frames_per_traj: Any = None,
    init_random_frames: Any = None,
    reset_at_each_iter: Any = False,
    postproc: Any = None,
    split_trajs: Any = None,
    exploration_type: Any = InteractionType.RANDOM,
    exploration_mode: Any = None,
    return_same_td: Any = False,
    reset_when_done: Any = True,
    set_truncated: Any = False,
) -> BatchOptions:
    """Validate the batch-shaping arguments shared by every collector."""
    fpb = check_int(
        "frames_per_batch",
        frames_per_batch,
        minimum=1,
        hint="It is the number of frames (env steps summed over envs) in each yielded batch.",
    )
    total = -1 if total_frames is None else check_int("total_frames", total_frames)
    if total == 0 or total < -1:
        raise ArgumentValueError(
            f"total_frames must be positive, or -1 for an endless collector; got {total}."
        )
    if total > 0 and total % fpb:
        raise ArgumentValueError(
            f"total_frames ({total}) is not divisible by frames_per_batch ({fpb}); use a multiple "
            f"such as {(-(-total // fpb)) * fpb}, or total_frames=-1 for an endless collector."
        )
    max_steps = None
    if max_frames_per_traj is not None:
        max_steps = check_int("max_frames_per_traj", max_frames_per_traj)
        max_steps = (
            max_steps if max_steps > 0 else None
        )  # negative values are ignored, as in TorchRL
    init_random = 0
    if init_random_frames is not None:
        init_random = max(check_int("init_random_frames", init_random_frames), 0)
    return BatchOptions(
        frames_per_batch=fpb,
        total_frames=total,
        max_frames_per_traj=max_steps,
        init_random_frames=init_random,
        reset_at_each_iter=check_bool("reset_at_each_iter", reset_at_each_iter),
        split_trajs=check_bool(
            "split_trajs", bool(split_trajs) if split_trajs is None else split_trajs
        ),
        exploration_type=resolve_exploration_type(exploration_type, exploration_mode),
        return_same_td=check_bool("return_same_td", return_same_td),
        reset_when_done=check_bool("reset_when_done", reset_when_done),
        set_truncated=check_bool("set_truncated", set_truncated),
        postproc=check_callable("postproc", postproc),
    )


@dataclass(frozen=True)
class Devices:
    """Where the env runs, where the policy runs and where output batches are stored."""

    env: torch.device | None
    policy: torch.device | None
    storing: torch.device | None


def to_device(name: str, value: Any) -> torch.device | None:
    """Parse a device argument (int, str, torch.device or None), naming it on error."""
    if value is None or isinstance(value, torch.device):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ArgumentTypeError(
            f"{name} must be a torch.device, a string such as 'cpu' or 'cuda:0', an int or None; "
            f"got {value!r}."
        )
    try:
        return torch.device(value)
    except (RuntimeError, ValueError) as err:
        raise ArgumentValueError(f"{name}={value!r} is not a device: {err}") from err


def resolve_devices(
    device: Any = None,
    storing_device: Any = None,
    env_device: Any = None,
    policy_device: Any = None,
) -> Devices:
    """TorchRL's rules: ``device`` fills each of the other three that is not given, ``"cuda"``
    means the current CUDA device, and with no ``storing_device`` batches are stored on the env's
    device when env and policy share one. Each argument is checked under its own name."""
    default = _usable("device", device)
    storing = _usable("storing_device", storing_device) or default
    env = _usable("env_device", env_device) or default
    policy = _usable("policy_device", policy_device) or default
    if storing is None and env == policy:
        storing = env
    return Devices(env=env, policy=policy, storing=storing)


def _usable(name: str, value: Any) -> torch.device | None:
    dev = to_device(name, value)
    if dev is None or dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        raise ArgumentValueError(
            f"{name}={value!r} asks for CUDA, but CUDA is not available on this machine; "
            "use 'cpu' or leave it unset."
        )
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


def env_fns(create_env_fn: Any, num_workers: int | None) -> list:
    """One env constructor per worker, from a list or from one constructor and ``num_workers``."""
    if num_workers is not None:
        num_workers = check_int("num_workers", num_workers, minimum=1)
    if isinstance(create_env_fn, (list, tuple)):
        fns = list(create_env_fn)
        if not fns:
            raise ArgumentValueError(
                "create_env_fn is an empty list; give one env constructor per worker."
            )
        if num_workers is not None and num_workers != len(fns):
            raise ArgumentValueError(
                f"num_workers={num_workers} but create_env_fn lists {len(fns)} constructors; "
                "give one constructor per worker, or one constructor and num_workers."
            )
    elif num_workers is None:
        raise ArgumentValueError(
            "create_env_fn is a single constructor: pass num_workers=..., or a list with one "
            "constructor per worker."
        )
    else:
        fns = [create_env_fn] * num_workers
    for fn in fns:
        if not (callable(fn) or isinstance(fn, str)):
            raise ArgumentTypeError(
                f"create_env_fn entries must be callables or env ids, got {type(fn).__name__}."
            )
    return fns


def per_worker(name: str, value: Any, index: int, num_workers: int) -> Any:
    """A per-worker value from a list of ``num_workers`` values, or the same value for all."""
    if isinstance(value, (list, tuple)):
        if len(value) != num_workers:
            raise ArgumentValueError(
                f"{name} is a list of {len(value)} values but there are {num_workers} workers; "
                "give one value per worker or a single value for all."
            )
        return value[index]
    return value


def check_cat_results(cat_results: Any, collector: str, concatenates: bool) -> str | int:
    """``"stack"`` (also for None) or an int dim; only a collector that ``concatenates`` (TorchRL:
    MultiSync only) takes a dim."""
    if cat_results is None or cat_results == "stack":
        return "stack"
    if not concatenates:
        raise ArgumentValueError(
            f"cat_results={cat_results!r}: only MultiSyncDataCollector concatenates batches "
            f"(as in TorchRL); drop cat_results from {collector}."
        )
    if isinstance(cat_results, bool) or not isinstance(cat_results, int):
        raise ArgumentValueError(
            f"cat_results must be 'stack' or an int dim such as -1, got {cat_results!r}."
        )
    return cat_results


def check_preemptive_threshold(value: Any) -> float:
    """A fraction of workers in [0, 1]; None means 1 (no preemption)."""
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ArgumentValueError(
            f"preemptive_threshold must be a number between 0.0 and 1.0 (the fraction of workers "
            f"that finish their batch before the others are stopped), got {value!r}."
        )
    return float(value)
