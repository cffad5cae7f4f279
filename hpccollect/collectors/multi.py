"""Multi-process collectors: ``MultiSyncDataCollector``, ``MultiaSyncDataCollector``,
``aSyncDataCollector``. The process machinery they share is in ``multi_base.py``; here is only how
each gathers the workers' batches.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from hpccollect.collectors.messages import Reply
from hpccollect.collectors.multi_base import MultiCollectorBase
from hpccollect.errors import ArgumentTypeError, ArgumentValueError

__all__ = ["MultiSyncDataCollector", "MultiaSyncDataCollector", "aSyncDataCollector"]


class MultiSyncDataCollector(MultiCollectorBase):
    """Runs one ``SyncDataCollector`` per worker process and gathers a batch from each.

    ``frames_per_batch`` is the total over workers. Each iteration yields the workers' batches
    stacked ``[num_workers, T]`` named ``[None, "time"]`` (``cat_results="stack"``, the default),
    or concatenated along dim ``cat_results`` (``-1``: along time).
    """

    def __init__(self, *args: Any, cat_results: str | int | None = None, **kwargs: Any) -> None:
        if cat_results is None:
            cat_results = "stack"
        if cat_results != "stack" and (
            isinstance(cat_results, bool) or not isinstance(cat_results, int)
        ):
            raise ArgumentValueError(
                f"cat_results must be 'stack' or an int dim such as -1, got {cat_results!r}."
            )
        self.cat_results = cat_results
        super().__init__(*args, **kwargs)
        self._check_layouts()

    def _time_named_split(self) -> bool:
        return self.cat_results in ("stack", -1)

    def _worker_frames_per_batch(self) -> int:
        fpb, n = self.options.frames_per_batch, self.num_workers
        if fpb % n:
            warnings.warn(
                f"frames_per_batch ({fpb}) is not divisible by num_workers ({n}); each worker "
                f"collects {-(-fpb // n)} frames per batch.",
                stacklevel=4,
            )
        return -(-fpb // n)

    def _check_layouts(self) -> None:
        """Batches are stacked or concatenated: every worker must produce the same layout."""

        def layout(td: TensorDictBase) -> dict:
            return {k: (tuple(v.shape), v.dtype) for k, v in td.items(True, True)}

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

    def _gather(self) -> TensorDictBase:
        parts = self._layouts
        if self.cat_results == "stack":
            out = torch.stack(parts, 0)
        else:
            out = torch.cat(parts, self.cat_results)
        if not isinstance(out, TensorDict):
            out = out.contiguous()
        out.names = [None] * (out.batch_dims - 1) + ["time"]
        return out

    def iterator(self) -> Iterator[TensorDictBase | None]:
        """One round per iteration: every worker collects, then their batches are gathered."""
        workers = range(self.num_workers)
        while self._more():
            if self.update_at_each_batch:
                self.update_policy_weights_()
            self._drain(workers)
            for i in workers:
                self._collect_from(i)
            for i in workers:
                self._pool.recv(i, Reply.BATCH, self.worker_timeout)
                self._in_flight.discard(i)
            yield self._finish(self._gather())


class MultiaSyncDataCollector(MultiCollectorBase):
    """Runs one ``SyncDataCollector`` per worker; yields each worker's batch as soon as it is
    ready (first ready, first served), ``frames_per_batch`` frames each, ``[T]`` named
    ``["time"]``. A worker starts its next batch as soon as its last one was copied out."""

    def iterator(self) -> Iterator[TensorDictBase | None]:
        for i in range(self.num_workers):
            if i not in self._in_flight:
                self._collect_from(i)
        while self._more():
            index, _ = self._pool.wait_any(
                sorted(self._in_flight), Reply.BATCH, self.worker_timeout
            )
            self._in_flight.discard(index)
            batch = self._layouts[index].clone()
            if self.update_at_each_batch:
                self.update_policy_weights_(worker_ids=[index])
            out = self._finish(batch)
            if self._more():
                self._collect_from(index)
            yield out


class aSyncDataCollector(MultiaSyncDataCollector):
    """One ``SyncDataCollector`` in a separate process, with the same interface.

    Collection of the next batch runs in the worker while the caller uses the current one.
    """

    def __init__(self, create_env_fn: Any, policy: Any = None, **kwargs: Any) -> None:
        if "num_workers" in kwargs:
            raise ArgumentTypeError("aSyncDataCollector runs exactly one worker; drop num_workers.")
        super().__init__([create_env_fn], policy, **kwargs)
