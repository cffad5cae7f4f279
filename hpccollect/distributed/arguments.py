"""``DistributedDataCollector``'s own arguments: which collector each rank runs, and what may be
passed to it, checked at construction before any rank starts."""

from __future__ import annotations

import inspect
import warnings
from typing import Any

from hpccollect._checks import check_bool, check_int
from hpccollect.collectors.multi_base import MultiCollectorBase
from hpccollect.collectors.sync import SyncDataCollector
from hpccollect.collectors.torchrl_api.kinds import collector_kind, collector_kinds
from hpccollect.errors import ArgumentTypeError, ArgumentValueError

__all__ = [
    "RANK_DEVICES",
    "accepted_kwargs",
    "check_collector_class",
    "check_collector_kwargs",
    "check_liveness_timeout",
    "check_on_worker_failure",
    "check_port",
    "check_rank_reports",
    "check_rank_sink",
    "check_slurm_kwargs",
    "rank_envs",
    "weight_schedule",
]

#: what the ranks' collectors get from this collector; collector_kwargs cannot set them
_OWN = (
    "frames_per_batch",
    "total_frames",
    "traj_id_offset",
    "traj_id_stride",
    "replay_buffer",
    "return_same_td",
    "postproc",
    "split_trajs",
)
#: device keywords collector_kwargs may set: the rank's own (TorchRL passes them on)
RANK_DEVICES = ("device", "storing_device", "env_device", "policy_device")


def check_collector_class(value: Any) -> type:
    """``collector_class``: a local collector class, or the TorchRL name of one."""
    if isinstance(value, str):
        kinds = list(collector_kinds(torchrl_names=True))
        if value not in kinds:
            raise ArgumentValueError(
                f"collector_class must be a collector class or one of {kinds}, got {value!r}."
            )
        return collector_kind(value, torchrl_names=True)
    if isinstance(value, type) and issubclass(value, (SyncDataCollector, MultiCollectorBase)):
        if getattr(value, "starts_ranks", False):
            raise ArgumentValueError(
                "collector_class cannot be a DistributedDataCollector: each rank runs a local "
                "collector."
            )
        return value
    kinds = list(collector_kinds(torchrl_names=True))
    raise ArgumentTypeError(
        "collector_class must be SyncDataCollector, MultiSyncDataCollector, "
        f"MultiaSyncDataCollector (or a subclass), or one of {kinds}; got {value!r}."
    )


def check_collector_kwargs(value: Any, n: int, cls: type) -> list[dict]:
    """One dict of extra arguments per rank, checked against ``cls``'s signature."""
    if value is None:
        return [{} for _ in range(n)]
    items = list(value) if isinstance(value, (list, tuple)) else [value] * n
    if len(items) != n or not all(isinstance(d, dict) for d in items):
        raise ArgumentTypeError(
            f"collector_kwargs must be a dict, or a list of {n} dicts (one per collector rank)."
        )
    accepted = accepted_kwargs(cls)
    for d in items:
        own = sorted(set(d) & set(_OWN))
        if own:
            raise ArgumentValueError(
                f"collector_kwargs sets {own}; set them on DistributedDataCollector itself."
            )
        unknown = sorted(k for k in d if accepted is not None and k not in accepted)
        if unknown:
            raise ArgumentTypeError(
                f"collector_kwargs has {unknown}, which {cls.__name__} does not take."
            )
    return [dict(d) for d in items]


def accepted_kwargs(cls: type) -> set[str] | None:
    """The keywords ``cls(...)`` takes: its MRO's ``__init__`` names down to the first that
    forwards no ``**kwargs``; None when any name goes."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" in vars(klass) and klass is not object:
            params = inspect.signature(klass.__init__).parameters.values()
            names |= {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
            if not any(p.kind is p.VAR_KEYWORD for p in params):
                return names
    return None


def check_port(value: Any) -> int | None:
    """``tcp_port``: None (the launcher's default), or a port as an int or digits ("12345")."""
    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip().isdigit():
            raise ArgumentValueError(
                f"tcp_port must be a TCP port number (0-65535), got {value!r}."
            )
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(
            f"tcp_port must be an int or a string of digits, got {type(value).__name__}."
        )
    if not 0 <= value <= 65535:
        raise ArgumentValueError(f"tcp_port must be a TCP port (0-65535), got {value}.")
    return value


def weight_schedule(
    update_after_each_batch: Any, max_weight_update_interval: Any, update_interval: Any
) -> tuple[bool, int, int | None]:
    """``(update_after_each_batch, max_weight_update_interval, update_interval)``, checked."""
    after_each = check_bool("update_after_each_batch", update_after_each_batch)
    interval = check_int("max_weight_update_interval", max_weight_update_interval)
    if update_interval is not None:
        # TorchRL's: each rank gets weights before its next batch once it collected this many
        update_interval = check_int("update_interval", update_interval, minimum=1)
        if interval > 0:
            raise ArgumentValueError(
                "update_interval and max_weight_update_interval both set when weights are "
                "sent; give one."
            )
        interval = update_interval
    return after_each, interval, update_interval


def check_slurm_kwargs(value: Any, launcher: Any) -> dict | None:
    """``slurm_kwargs``: a dict or None; a warning where ``launcher`` does not use them."""
    if value is not None and not isinstance(value, dict):
        raise ArgumentTypeError(
            f"slurm_kwargs must be a dict of submitit executor parameters, got "
            f"{type(value).__name__}."
        )
    if value and not launcher.uses_slurm_kwargs:
        warnings.warn(
            f"slurm_kwargs are for the submitit launchers; {type(launcher).__name__} ignores them.",
            stacklevel=3,
        )
    return value


def check_rank_sink(value: Any) -> Any:
    """``rank_sink``: None, or a callable that makes each collector rank's sink."""
    if value is not None and not callable(value):
        raise ArgumentTypeError(
            f"rank_sink must be a callable rank_sink(rank) -> an object with extend(batch) "
            f"and close(), got {type(value).__name__}."
        )
    return value


def check_rank_reports(value: Any, arguments: dict[str, Any]) -> bool:
    """``rank_reports``: True needs a ``rank_sink`` and refuses what works on batches."""
    if not check_bool("rank_reports", value):
        return False
    if arguments["rank_sink"] is None:
        raise ArgumentValueError(
            "rank_reports=True keeps the batches on the ranks, and without a rank_sink they "
            "are thrown away: pass rank_sink (each rank's dataset shard), or drop rank_reports "
            "to have rank 0 take the batches."
        )
    for name, off in (("split_trajs", False), ("postproc", None), ("replay_buffer", None)):
        if arguments[name] not in (off, None):
            raise ArgumentValueError(
                f"{name} works on batches, and with rank_reports=True rank 0 gets reports, "
                f"not batches: drop {name}, or drop rank_reports."
            )
    return True


def check_liveness_timeout(value: Any) -> float | None:
    """Seconds of silence before a rank counts as lost; None: no heartbeats (worker_timeout)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1:
        raise ArgumentValueError(
            f"liveness_timeout must be a number of seconds >= 1, or None to send no "
            f"heartbeats; got {value!r}."
        )
    return float(value)


def check_on_worker_failure(value: Any) -> str:
    """``on_worker_failure``: ``"raise"`` (a lost rank ends the run) or ``"continue"``."""
    if value not in ("raise", "continue"):
        raise ArgumentValueError(f"on_worker_failure must be 'raise' or 'continue', got {value!r}.")
    return value


def rank_envs(create_env_fn: Any, num_ranks: int | None) -> list:
    """One env constructor per collector rank: the list given, or one repeated (mpiexec -n N)."""
    if not isinstance(create_env_fn, (list, tuple)):
        return [create_env_fn] * (num_ranks or 1)
    fns = list(create_env_fn)
    if num_ranks is not None and len(fns) != num_ranks:
        raise ArgumentValueError(
            f"create_env_fn lists {len(fns)} env constructors but the job has {num_ranks} "
            f"collector ranks (its MPI ranks but rank 0): pass {num_ranks} constructors, or a "
            "single one for every rank."
        )
    return fns
