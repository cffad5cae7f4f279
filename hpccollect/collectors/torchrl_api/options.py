"""The collectors' constructor arguments: declared once (``CollectorArgs``, with TorchRL's
defaults) and checked once (``CollectorArgs.check``).

Every collector (sync, multi-process, distributed) keeps TorchRL's explicit signature, for users
and IDEs, and forwards its arguments here first, so bad input fails in the caller's process at
construction, with a message naming the argument. A worker's collector gets the checked values
back as keyword arguments (``CollectorArgs.kwargs``).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from tensordict.nn import InteractionType

from hpccollect._checks import check_bool, check_callable, check_int
from hpccollect.collectors.loops.whole_trajs import check_traj_options
from hpccollect.collectors.torchrl_api.policy_options import check_compile
from hpccollect.envs.factory import check_env_kwargs
from hpccollect.errors import ArgumentTypeError, ArgumentValueError
from hpccollect.policy import check_policy, resolve_exploration_type, resolve_trust_policy

__all__ = [
    "CollectorArgs",
    "Devices",
    "check_cat_results",
    "check_preemptive_threshold",
    "env_fns",
    "per_worker",
    "resolve_devices",
    "to_device",
]


@dataclass(frozen=True)
class CollectorArgs:
    """Every argument the collectors share, with TorchRL's defaults: the one declaration.

    ``check()`` returns a copy with every value checked and normalised (``total_frames`` -1 for
    endless, ``max_frames_per_traj`` None for no step counting, ``init_random_frames`` an int,
    ``split_trajs`` and ``trust_policy`` bools, ``exploration_type`` resolved, with
    ``exploration_mode`` folded into it); checking a checked copy changes nothing. The device
    arguments stay as given (a collector with workers accepts one per worker): see ``devices()``.
    """

    frames_per_batch: int
    total_frames: int = -1
    device: Any = None
    storing_device: Any = None
    env_device: Any = None
    policy_device: Any = None
    create_env_kwargs: Any = None
    max_frames_per_traj: int | None = None
    init_random_frames: int | None = None
    reset_at_each_iter: bool = False
    postproc: Callable | None = None
    split_trajs: bool | None = None
    exploration_type: InteractionType | str = InteractionType.RANDOM
    exploration_mode: str | None = None
    return_same_td: bool = False
    reset_when_done: bool = True
    set_truncated: bool = False
    use_buffers: bool | None = None
    trust_policy: bool | None = None
    replay_buffer: Any = None
    categorical_action_encoding: bool = False
    local_weight_updater: Any = None
    remote_weight_updater: Any = None
    weight_updater: Any = None
    traj_id_offset: int = 0
    traj_id_stride: int = 1
    compile_policy: Any = None
    cudagraph_policy: Any = None
    no_cuda_sync: bool = False
    pre_collect_hook: Callable[[], None] | None = None
    post_collect_hook: Callable[[Any], None] | None = None
    compact_obs: bool = False
    extend_buffer: bool = True
    trajs_per_batch: int | None = None
    trajs_per_write: int | None = None
    traj_format: str | None = None
    track_policy_version: Any = False
    auto_register_policy_transforms: bool | None = None

    @classmethod
    def check(cls, arguments: Mapping[str, Any], policy: Any = None) -> CollectorArgs:
        """The checked arguments, from a constructor's ``locals()`` (other names are ignored);
        ``policy`` decides ``trust_policy``'s default."""
        given = {f.name: arguments[f.name] for f in dataclasses.fields(cls) if f.name in arguments}
        if "frames_per_batch" not in given:
            raise ArgumentTypeError("frames_per_batch is required (frames in each batch).")
        raw = cls(**given)
        return dataclasses.replace(raw, **_checked_batch(raw), **_checked_rest(raw, policy))

    @property
    def endless(self) -> bool:
        return self.total_frames < 0

    def kwargs(self, **changes: Any) -> dict[str, Any]:
        """Keyword arguments for a collector built from these (``changes`` applied)."""
        changed = dataclasses.replace(self, **changes)
        return {f.name: getattr(changed, f.name) for f in dataclasses.fields(changed)}

    def devices(self, index: int | None = None, num_workers: int = 1) -> Devices:
        """The resolved devices (of worker ``index`` of ``num_workers`` when per worker)."""
        values = [
            (name, getattr(self, name))
            for name in ("device", "storing_device", "env_device", "policy_device")
        ]
        if index is not None:
            values = [(name, per_worker(name, v, index, num_workers)) for name, v in values]
        return resolve_devices(*(v for _, v in values))


def _checked_batch(raw: CollectorArgs) -> dict[str, Any]:
    """How many frames, how episodes are cut, and what the output looks like."""
    fpb = check_int(
        "frames_per_batch",
        raw.frames_per_batch,
        minimum=1,
        hint="It is the number of frames (env steps summed over envs) in each yielded batch.",
    )
    total = -1 if raw.total_frames is None else check_int("total_frames", raw.total_frames)
    if total == 0 or total < -1:
        raise ArgumentValueError(
            f"total_frames must be positive, or -1 for an endless collector; got {total}."
        )
    if total > 0 and total % fpb:
        whole = -(-total // fpb) * fpb
        warnings.warn(  # TorchRL's behaviour: the last batch is whole
            f"total_frames ({total}) is not divisible by frames_per_batch ({fpb}): the last batch "
            f"is whole, so {whole} frames are collected; give a multiple of {fpb} to avoid this.",
            stacklevel=4,
        )
    max_steps = None
    if raw.max_frames_per_traj is not None:
        max_steps = check_int("max_frames_per_traj", raw.max_frames_per_traj)
        max_steps = max_steps if max_steps > 0 else None  # negative: ignored, as in TorchRL
    init_random = 0
    if raw.init_random_frames is not None:
        init_random = max(check_int("init_random_frames", raw.init_random_frames), 0)
    split = raw.split_trajs
    return dict(
        frames_per_batch=fpb,
        total_frames=total,
        max_frames_per_traj=max_steps,
        init_random_frames=init_random,
        reset_at_each_iter=check_bool("reset_at_each_iter", raw.reset_at_each_iter),
        split_trajs=check_bool("split_trajs", bool(split) if split is None else split),
        exploration_type=resolve_exploration_type(raw.exploration_type, raw.exploration_mode),
        exploration_mode=None,
        return_same_td=check_bool("return_same_td", raw.return_same_td),
        reset_when_done=check_bool("reset_when_done", raw.reset_when_done),
        set_truncated=check_bool("set_truncated", raw.set_truncated),
        postproc=check_callable("postproc", raw.postproc),
    )


def _checked_rest(raw: CollectorArgs, policy: Any) -> dict[str, Any]:
    """Policy handling, env arguments, output sinks and trajectory id shares."""
    check_policy(policy)
    env_kwargs = raw.create_env_kwargs
    for kwargs in env_kwargs if isinstance(env_kwargs, (list, tuple)) else [env_kwargs]:
        check_env_kwargs(kwargs)  # one dict for every env, or one a worker
    if raw.use_buffers is not None:
        check_bool("use_buffers", raw.use_buffers)
    buffer = raw.replay_buffer
    if buffer is not None and not callable(getattr(buffer, "extend", None)):
        raise ArgumentTypeError(
            f"replay_buffer must have an extend() method (e.g. hpccollect.storage.ReplayBuffer "
            f"or an HDF5 writer), got {type(buffer).__name__}."
        )
    per_batch, per_write, traj_format = check_traj_options(
        raw.trajs_per_batch, raw.trajs_per_write, raw.traj_format, buffer is not None
    )
    if per_batch is not None and raw.split_trajs:
        raise ArgumentValueError(
            "trajs_per_batch already yields whole trajectories; drop split_trajs=True "
            "(TorchRL cannot combine them either)."
        )
    return dict(
        track_policy_version=_checked_version(raw.track_policy_version),
        auto_register_policy_transforms=_checked_optional_bool(
            "auto_register_policy_transforms", raw.auto_register_policy_transforms
        ),
        trajs_per_batch=per_batch,
        trajs_per_write=per_write,
        traj_format=traj_format,
        trust_policy=resolve_trust_policy(raw.trust_policy, policy),
        traj_id_offset=check_int("traj_id_offset", raw.traj_id_offset, minimum=0),
        traj_id_stride=check_int("traj_id_stride", raw.traj_id_stride, minimum=1),
        compile_policy=check_compile("compile_policy", raw.compile_policy),
        cudagraph_policy=check_compile("cudagraph_policy", raw.cudagraph_policy),
        no_cuda_sync=check_bool("no_cuda_sync", raw.no_cuda_sync),
        pre_collect_hook=check_callable("pre_collect_hook", raw.pre_collect_hook),
        post_collect_hook=check_callable("post_collect_hook", raw.post_collect_hook),
        compact_obs=check_bool("compact_obs", raw.compact_obs),
        extend_buffer=_checked_extend(raw),
    )


def _checked_optional_bool(name: str, value: Any) -> bool | None:
    return None if value is None else check_bool(name, value)


def _checked_version(value: Any) -> Any:
    """True, False or a TorchRL ``PolicyVersion`` (anything with ``increment_version``)."""
    if isinstance(value, bool) or callable(getattr(value, "increment_version", None)):
        return value
    raise ArgumentTypeError(
        "track_policy_version must be True, False or a PolicyVersion (an object with "
        f"increment_version()), got {value!r}."
    )


def _checked_extend(raw: CollectorArgs) -> bool:
    """``extend_buffer=False`` (a ``replay_buffer.add`` per step) with TorchRL's refusals."""
    extend = check_bool("extend_buffer", raw.extend_buffer)
    if raw.replay_buffer is not None and not extend:
        if not callable(getattr(raw.replay_buffer, "add", None)):
            raise ArgumentTypeError(
                "extend_buffer=False writes each step with replay_buffer.add(), which "
                f"{type(raw.replay_buffer).__name__} does not have."
            )
        for name in ("postproc", "split_trajs"):
            if getattr(raw, name):
                raise ArgumentValueError(
                    f"{name} needs whole batches: with a replay_buffer, leave extend_buffer=True "
                    "(TorchRL refuses this combination too)."
                )
    return extend


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
