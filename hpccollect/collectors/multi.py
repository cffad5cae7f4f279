"""Multi-process collectors: ``MultiSyncDataCollector``, ``MultiaSyncDataCollector``,
``aSyncDataCollector``. The process machinery they share is in ``multi_base.py``; here is only how
each gathers the workers' batches.
"""

from __future__ import annotations

import abc
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase

from hpccollect.collectors.multi_base import MultiCollectorBase
from hpccollect.collectors.rollout import TRAJ_KEY
from hpccollect.errors import ArgumentValueError

__all__ = [
    "MultiCollector",
    "MultiSyncDataCollector",
    "MultiaSyncDataCollector",
    "aSyncDataCollector",
]


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

    _concatenates = True
    _preempts = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._check_layouts()

    def _time_named_split(self) -> bool:
        return self.cat_results in ("stack", -1)

    def _worker_frames_per_batch(self, index: int) -> int:
        """Worker ``index``'s share of each round: its own value from a per-worker list, or an
        equal share."""
        if self._worker_fpb is not None:
            return self._worker_fpb[index]
        fpb, n = self.options.frames_per_batch, self.num_workers
        if fpb % n and index == 0:
            warnings.warn(
                f"frames_per_batch ({fpb}) is not divisible by num_workers ({n}); each worker "
                f"collects {-(-fpb // n)} frames per batch.",
                stacklevel=4,
            )
        return -(-fpb // n)

    def _check_layouts(self) -> None:
        """Batches are stacked or concatenated: every worker must produce the same layout."""

        def layout(td: TensorDictBase) -> dict:
            time = td.batch_dims - 1  # may differ between workers given their own lengths
            skip = self._worker_fpb is not None
            return {
                k: ((*v.shape[:time], *v.shape[time + 1 :]) if skip else tuple(v.shape), v.dtype)
                for k, v in td.items(True, True)
            }

        first = layout(self._layouts[0])
        for i, other in enumerate(self._layouts[1:], 1):
            if layout(other) != first:
                diff = sorted(
                    str(k)
                    for k in set(first) ^ set(layout(other))
                    | {k for k in first if k in layout(other) and layout(other)[k] != first[k]}
                )
                self.shutdown()
                raise ArgumentValueError(
                    f"worker {i}'s batches differ from worker 0's in {diff}, so they cannot be "
                    "stacked: give every worker the same kind of env, or use "
                    "MultiaSyncDataCollector, which yields each worker's batch on its own."
                )

    def _gather(self, frames: list[int]) -> tuple[TensorDictBase, int]:
        """The round's batch and its number of real frames (``frames``: per active worker)."""
        parts = [self._batch(i) for i in self._active]
        steps = [f // (p.numel() // p.shape[-1]) for f, p in zip(frames, parts, strict=True)]
        short = [s < p.shape[-1] for s, p in zip(steps, parts, strict=True)]
        copied = bool(self._by_value)  # batches sent by value are this collector's own
        if self.cat_results == "stack":
            if len({p.shape for p in parts}) > 1:  # workers of their own lengths: a lazy stack
                own = [p if copied else p.clone() for p in parts]  # not the shared buffers
                out = LazyStackedTensorDict.lazy_stack(own, 0)
                copied = True
            else:
                out = torch.stack(parts, 0)
            if not isinstance(out, TensorDict) and not copied:
                out = out.contiguous()
            if self.interruptor is not None:
                _pad_preempted(out, steps, short)
        else:
            if any(short):
                parts = [p[..., :s] for p, s in zip(parts, steps, strict=True)]
            try:
                out = torch.cat(parts, self.cat_results)
            except RuntimeError as err:
                raise RuntimeError(
                    f"the workers' batches cannot be concatenated along dim {self.cat_results} "
                    f"after preemption ({err}); use cat_results=-1 or 'stack'."
                ) from err
            if not isinstance(out, TensorDict) and not copied:
                out = out.contiguous()
        out.names = [None] * (out.batch_dims - 1) + ["time"]
        return out, sum(frames)

    def _buffer_parts(self, batch: TensorDictBase) -> tuple[TensorDictBase, ...]:
        return batch.unbind(0) if self.cat_results == "stack" else (batch,)

    def iterator(self) -> Iterator[TensorDictBase | None]:
        """One round per iteration: every worker collects, then their batches are gathered."""
        while self._more():
            if self.update_at_each_batch:
                self.update_policy_weights_()
            yield self._finish(*self._collect_round())

    def _collect_round(self) -> tuple[TensorDictBase, int]:
        self._drain(self._active)
        if self.interruptor is not None:
            self.interruptor.start_collection()  # before any worker can start
        for i in list(self._active):
            self._collect_from(i)
        return self._gather(self._receive_round())

    def _batch_template(self) -> TensorDictBase:
        return self._gather([self._layouts[i].numel() for i in self._active])[0]

    def _receive_round(self) -> list[int]:
        """Each active worker's frame count for this round; with preemption, stop the
        stragglers once enough workers have delivered."""
        frames: dict[int, int] = {}
        pending = set(self._in_flight)
        n = len(self._active)
        stop_after = int(n * self.preemptive_threshold) if self.interruptor else None
        while pending:
            if stop_after is not None and n - len(pending) >= stop_after:
                self.interruptor.stop_collection()
                stop_after = None
            got = self._wait_batch(pending)
            if got is None:  # a worker was lost: this round goes on without it
                pending &= set(self._active)
                continue
            index, frames[index] = got
            pending.discard(index)
            self._in_flight.discard(index)
        return [frames[i] for i in self._active]


def _pad_preempted(out: TensorDictBase, steps: list[int], short: list[bool]) -> None:
    """Zero a stacked batch's missing steps, mark them with trajectory id -1, add the mask."""
    for i, (taken, cut) in enumerate(zip(steps, short, strict=True)):
        if cut:
            out[i][..., taken:].zero_()
            out.get(TRAJ_KEY)[i][..., taken:] = -1
    out.set(("collector", "mask"), out.get(TRAJ_KEY) != -1)


class MultiaSyncDataCollector(MultiCollectorBase):
    """Runs one ``SyncDataCollector`` per worker; yields each worker's batch as soon as it is
    ready (first ready, first served), ``frames_per_batch`` frames each, ``[T]`` named
    ``["time"]``. A worker starts its next batch as soon as its last one was copied out."""

    def iterator(self) -> Iterator[TensorDictBase | None]:
        while self._more():
            index, batch = self._next_ready()
            if self.update_at_each_batch:
                self.update_policy_weights_(worker_ids=[index])
            # the worker's next batch overlaps this one's split/postproc/buffer work
            if self._wanted(self._in_flight | {index}):
                self._collect_from(index)
            yield self._finish(batch)

    def _wanted(self, busy: set[int]) -> bool:
        """Whether another batch can still count: the frames yielded and those ``busy`` workers
        are collecting fall short of ``total_frames``. No worker collects a batch that would be
        thrown away (a rank writing its own shard keeps every batch it collects)."""
        coming = sum(self._layouts[i].numel() for i in busy)
        return self.total_frames < 0 or self._frames + coming < self.total_frames

    def _next_ready(self) -> tuple[int, TensorDictBase]:
        """Set every idle worker collecting; the first finished batch (a copy) and its worker."""
        got = None
        while got is None:
            for i in list(self._active):
                if i not in self._in_flight and self._wanted(self._in_flight):
                    self._collect_from(i)
            got = self._wait_batch(self._in_flight)
        index = got[0]
        self._in_flight.discard(index)
        batch = self._batch(index)
        return index, batch if index in self._by_value else batch.clone()

    def _collect_round(self) -> tuple[TensorDictBase, int]:
        index, batch = self._next_ready()
        self._collect_from(index)
        return batch, batch.numel()


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
    instances of this class)."""


MultiCollector.register(MultiSyncDataCollector)
MultiCollector.register(MultiaSyncDataCollector)
