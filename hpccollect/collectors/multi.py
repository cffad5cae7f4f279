"""Multi-process collectors: ``MultiSyncDataCollector``, ``MultiaSyncDataCollector``,
``aSyncDataCollector``, and ``MultiCollector`` choosing between the first two. The process
machinery they share is in ``multi_base.py``, how each gathers its workers' batches in
``gathering.py``.
"""

from __future__ import annotations

import abc
from typing import Any

from hpccollect.collectors.multi_base import MultiCollectorBase
from hpccollect.collectors.torchrl_api.keyword_docs import MULTI, with_args
from hpccollect.collectors.workers.gathering import AsyncGathering, SyncGathering
from hpccollect.errors import ArgumentValueError

__all__ = [
    "MultiCollector",
    "MultiSyncDataCollector",
    "MultiaSyncDataCollector",
    "aSyncDataCollector",
]


@with_args(**MULTI)
class MultiSyncDataCollector(MultiCollectorBase):
    """Runs one ``SyncDataCollector`` per worker process and gathers a batch from each.

    ``frames_per_batch`` is the total over workers. Each iteration yields the workers' batches
    stacked ``[num_workers, T]`` named ``[None, "time"]`` (``cat_results="stack"``, the default),
    or concatenated along dim ``cat_results`` (``-1``: along time).

    ``preemptive_threshold=p`` (below 1), as in TorchRL: once ``int(p * num_workers)`` workers
    have delivered their batch, the others are told to stop after the env step they are in.
    With ``"stack"`` the batch keeps its shape: a stopped worker's missing steps are zeros with
    ``("collector", "traj_ids")`` -1, and ``("collector", "mask")`` (present in every batch while
    preemption is on) is True on real frames; with an int ``cat_results`` the missing steps are
    left out instead. Only real frames count towards ``total_frames``, so a preempting collector
    may run more iterations than ``total_frames / frames_per_batch``. A stopped worker carries
    on with the same episodes in its next batch. With ``split_trajs`` the padding is left out.
    """

    gathering = SyncGathering


@with_args(**MULTI)
class MultiaSyncDataCollector(MultiCollectorBase):
    """Runs one ``SyncDataCollector`` per worker; yields each worker's batch as soon as it is
    ready (first ready, first served), ``frames_per_batch`` frames each, ``[T]`` named
    ``["time"]``. A worker starts its next batch as soon as its last one was copied out."""

    gathering = AsyncGathering


@with_args(
    create_env_fn="the env, as ``SyncDataCollector`` takes it.",
    policy="the policy, as ``SyncDataCollector`` takes it.",
    kwargs="``MultiaSyncDataCollector``'s keywords but ``num_workers`` (always 1).",
)
class aSyncDataCollector(MultiaSyncDataCollector):
    """One ``SyncDataCollector`` in a separate process, with the same interface.

    Collection of the next batch runs in the worker while the caller uses the current one.
    """

    def __init__(self, create_env_fn: Any, policy: Any = None, **kwargs: Any) -> None:
        if kwargs.pop("num_workers", None) not in (None, 1):
            raise ArgumentValueError(
                "aSyncDataCollector runs exactly one worker; drop num_workers (TorchRL's "
                "AsyncCollector ignores it), or use MultiaSyncDataCollector for several."
            )
        super().__init__([create_env_fn], policy, **kwargs)


class _BySync(abc.ABCMeta):
    """``MultiCollector(..., sync=...)`` builds the collector ``sync`` names."""

    def __call__(cls, *args: Any, sync: Any = None, **kwargs: Any) -> Any:
        if not isinstance(sync, bool):
            raise ArgumentValueError(
                f"MultiCollector needs sync=True (MultiSyncDataCollector: one batch from every "
                f"worker) or sync=False (MultiaSyncDataCollector: first ready, first served); "
                f"got sync={sync!r}."
            )
        target = MultiSyncDataCollector if sync else MultiaSyncDataCollector
        return target(*args, **kwargs)


class MultiCollector(metaclass=_BySync):
    """TorchRL's ``MultiCollector``: ``MultiCollector(create_env_fn, policy, sync=True, ...)``
    is a ``MultiSyncDataCollector``, ``sync=False`` a ``MultiaSyncDataCollector`` (both are
    instances of this class).

    Args:
        sync: required, True or False: which of the two collectors is built.
        *args: that collector's positional arguments (``create_env_fn``, ``policy``).
        **kwargs: that collector's keywords.
    """


MultiCollector.register(MultiSyncDataCollector)
MultiCollector.register(MultiaSyncDataCollector)
