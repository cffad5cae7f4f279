"""How a collector with workers turns their batches into the batches it yields: a strategy
object a collector holds, chosen by its class (``MultiSyncDataCollector``: ``SyncGathering``,
``MultiaSyncDataCollector``: ``AsyncGathering``) or by an argument
(``DistributedDataCollector(sync=...)``).

A gathering drives the collector's worker pool through the collector (``_collect_from``,
``_wait_batch``, ``_batch``) and hands each worker's rows to ``_stamp_rows`` before they are
yielded, where a collector adds what it alone knows (the ranks' policy versions). All it uses of
the collector is written down in ``GatheringHost``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase

from hpccollect.collectors.loops.rollout import TRAJ_KEY
from hpccollect.collectors.workers.reports import quiet_reports
from hpccollect.errors import ArgumentValueError

__all__ = ["AsyncGathering", "Gathering", "GatheringHost", "SyncGathering"]


class GatheringHost(Protocol):
    """The collector as its gathering sees it (``MultiCollectorBase`` fulfils it): its
    options, its workers' state, and the calls that move one worker's batch."""

    num_workers: int
    total_frames: int
    options: Any  # CollectorArgs
    interruptor: Any
    cat_results: Any
    preemptive_threshold: float
    update_at_each_batch: bool
    _active: list[int]  # workers still collecting
    _in_flight: set[int]  # workers asked for a batch not taken yet
    _layouts: list[TensorDictBase]  # each worker's batch layout
    _worker_fpb: list[int] | None  # TorchRL's per-worker frames_per_batch
    _by_value: set[int]  # workers whose batches travel by value
    _reports: bool  # workers send reports of their batches (``reports.py``), not batches
    _release_after_yield: bool  # async: a worker goes on once its batch was yielded
    _asked: dict[int, int]  # the frames each worker was last asked for
    _frames: int

    def _more(self) -> bool: ...
    def _collect_from(self, index: int) -> None: ...
    def _wait_batch(self, indices: Any) -> tuple[int, int] | None: ...
    def _batch(self, index: int) -> TensorDictBase: ...
    def _own_batch(self, index: int) -> TensorDictBase: ...
    def _stamp_rows(self, batch: TensorDictBase, workers: list[int]) -> TensorDictBase: ...
    def _finish(self, batch: TensorDictBase, frames: int | None = None) -> Any: ...
    def _drain(self, indices: Sequence[int]) -> None: ...
    def update_policy_weights_(self, policy_or_weights: Any = None, **kwargs: Any) -> None: ...
    def shutdown(self, timeout: float | None = None, close_env: bool = True) -> None: ...


class Gathering:
    """One batch per worker as soon as it is ready; subclasses say how batches are yielded."""

    #: whether ``cat_results`` may be something other than ``"stack"``
    concatenates = False
    #: whether ``preemptive_threshold`` below 1 makes workers stop early
    preempts = False

    def __init__(self, collector: GatheringHost) -> None:
        self.c = collector

    def worker_frames_per_batch(self, index: int) -> int:
        """Worker ``index``'s frames per batch (here: a whole batch each)."""
        return self.c.options.frames_per_batch

    def check(self) -> None:
        """Refuse, once the workers announced their layouts, what cannot be gathered."""

    def time_named_split(self) -> bool:
        """Whether a split batch names its last dim "time"."""
        return False

    def buffer_parts(self, batch: TensorDictBase) -> tuple[TensorDictBase, ...]:
        """What goes into the replay buffer, one ``extend`` each."""
        return (batch,)

    def batch_template(self) -> TensorDictBase:
        """A batch laid out as ``collect_round`` gives them."""
        return self.c._layouts[0]

    def iterator(self) -> Iterator[TensorDictBase | None]:
        raise NotImplementedError

    def _wanted(self, busy: set[int]) -> bool:
        """Whether another batch can still count: the frames counted and those ``busy`` workers
        were asked for fall short of ``total_frames``. No worker collects a batch that would be
        thrown away (a rank writing its own shard keeps every batch it collects)."""
        c = self.c
        if c.total_frames < 0:
            return True
        return c._frames + sum(map(c._asked.__getitem__, busy)) < c.total_frames

    def collect_round(self) -> tuple[TensorDictBase, int]:
        """One batch as the iterator gathers it (before ``_finish``), and its real frames."""
        raise NotImplementedError


class SyncGathering(Gathering):
    """A batch from every worker per round, stacked ``[num_workers, T]`` or concatenated along
    ``cat_results``; preemption pads (stack) or drops (cat) a stopped worker's missing steps."""

    concatenates = True
    preempts = True

    def __init__(self, collector: GatheringHost) -> None:
        super().__init__(collector)
        # With reports (workers keep their batches, so none may be collected past total_frames)
        # the last round can leave nothing for some workers: they rest, and their last report,
        # with nothing new in it, stands in for them (``reports.quiet_reports``). Every worker
        # reports in the first round, so the first batch is whole, as TorchRL's.
        self._quiet: dict[int, TensorDictBase] = {}

    def worker_frames_per_batch(self, index: int) -> int:
        """Worker ``index``'s share of each round: its own value from a per-worker list, or an
        equal share."""
        c = self.c
        if c._worker_fpb is not None:
            return c._worker_fpb[index]
        fpb, n = c.options.frames_per_batch, c.num_workers
        if fpb % n and index == 0:
            warnings.warn(
                f"frames_per_batch ({fpb}) is not divisible by num_workers ({n}); each worker "
                f"collects {-(-fpb // n)} frames per batch.",
                stacklevel=3,
            )
        return -(-fpb // n)

    def check(self) -> None:
        """Batches are stacked or concatenated: every worker must produce the same layout."""
        skip_time = self.c._worker_fpb is not None  # workers of their own lengths
        cat = self.c.cat_results

        def layout(td: TensorDictBase) -> dict:
            # the time dim differs between workers of their own lengths, and the dim batches
            # are concatenated along may differ anyway
            skip = {td.batch_dims - 1} if skip_time else set()
            if cat != "stack" and -td.batch_dims <= cat < td.batch_dims:
                skip.add(cat % td.batch_dims)
            return {
                k: (tuple(n for d, n in enumerate(v.shape) if d not in skip), v.dtype)
                for k, v in td.items(True, True)
            }

        layouts = [layout(td) for td in self.c._layouts]
        first = layouts[0]
        for i, other in enumerate(layouts[1:], 1):
            if other != first:
                diff = sorted(
                    str(k)
                    for k in set(first) ^ set(other)
                    | {k for k in first if k in other and other[k] != first[k]}
                )
                self.c.shutdown()
                raise ArgumentValueError(
                    f"worker {i}'s batches differ from worker 0's in {diff}, so they cannot be "
                    "stacked: give every worker the same kind of env, or use "
                    "MultiaSyncDataCollector, which yields each worker's batch on its own."
                )

    def time_named_split(self) -> bool:
        return self.c.cat_results in ("stack", -1)

    def buffer_parts(self, batch: TensorDictBase) -> tuple[TensorDictBase, ...]:
        return batch.unbind(0) if self.c.cat_results == "stack" else (batch,)

    def batch_template(self) -> TensorDictBase:
        c = self.c
        return self.gather([c._layouts[i].numel() for i in c._active])[0]

    def iterator(self) -> Iterator[TensorDictBase | None]:
        """One round per iteration: every worker collects, then their batches are gathered."""
        c = self.c
        while c._more():
            if c.update_at_each_batch:
                c.update_policy_weights_()
            yield c._finish(*self.collect_round())

    def collect_round(self) -> tuple[TensorDictBase, int]:
        c = self.c
        c._drain(c._active)
        if c.interruptor is not None:
            c.interruptor.start_collection()  # before any worker can start
        resting = set()
        for i in list(c._active):
            if i in self._quiet and not self._wanted(c._in_flight):
                resting.add(i)  # the frames still wanted are asked of the others already
                continue
            c._collect_from(i)
        return self.gather(self._receive_round(), resting)

    def gather(
        self, frames: list[int], resting: set[int] = frozenset()
    ) -> tuple[TensorDictBase, int]:
        """The round's batch and its number of real frames (``frames``: per active worker;
        ``resting``: workers not asked this round, whose quiet report stands in)."""
        c = self.c
        if c._reports:  # one report per worker, nothing to pad or cut
            parts = [self._quiet[i] if i in resting else c._batch(i) for i in c._active]
            out = torch.stack(parts, 0)
            self._quiet = dict(zip(c._active, quiet_reports(out).unbind(0), strict=True))
            return c._stamp_rows(out, list(c._active)), sum(frames)
        parts = [c._batch(i) for i in c._active]
        steps = [f // (p.numel() // p.shape[-1]) for f, p in zip(frames, parts, strict=True)]
        short = [s < p.shape[-1] for s, p in zip(steps, parts, strict=True)]
        copied = bool(c._by_value)  # batches sent by value are the collector's own
        if c.cat_results == "stack":
            if len({p.shape for p in parts}) > 1:  # workers of their own lengths: a lazy stack
                own = [p if copied else p.clone() for p in parts]  # not the shared buffers
                out = LazyStackedTensorDict.lazy_stack(own, 0)
                copied = True
            else:
                out = torch.stack(parts, 0)
            if not isinstance(out, TensorDict) and not copied:
                out = out.contiguous()
            if c.interruptor is not None:
                _pad_preempted(out, steps, short)
        else:
            out = _concatenated(parts, steps, short, c.cat_results, copied)
        out.names = [None] * (out.batch_dims - 1) + ["time"]
        return c._stamp_rows(out, list(c._active)), sum(frames)

    def _receive_round(self) -> list[int]:
        """Each active worker's frame count for this round; with preemption, stop the
        stragglers once enough workers have delivered."""
        c = self.c
        frames: dict[int, int] = {}
        pending = set(c._in_flight)
        n = len(c._active)
        stop_after = int(n * c.preemptive_threshold) if c.interruptor else None
        while pending:
            if stop_after is not None and n - len(pending) >= stop_after:
                c.interruptor.stop_collection()
                stop_after = None
            got = c._wait_batch(pending)
            if got is None:  # a worker was lost: this round goes on without it
                pending &= set(c._active)
                continue
            index, frames[index] = got
            pending.discard(index)
            c._in_flight.discard(index)
        return [frames.get(i, 0) for i in c._active]  # 0: a worker resting this round


def _concatenated(
    parts: list[TensorDictBase], steps: list[int], short: list[bool], dim: int, copied: bool
) -> TensorDictBase:
    """The workers' batches concatenated along ``dim``, a preempted worker's missing steps left
    out."""
    if any(short):
        parts = [p[..., :s] for p, s in zip(parts, steps, strict=True)]
    try:
        out = torch.cat(parts, dim)
    except RuntimeError as err:
        raise RuntimeError(
            f"the workers' batches cannot be concatenated along dim {dim} after preemption "
            f"({err}); use cat_results=-1 or 'stack'."
        ) from err
    if not isinstance(out, TensorDict) and not copied:
        out = out.contiguous()
    return out


def _pad_preempted(out: TensorDictBase, steps: list[int], short: list[bool]) -> None:
    """Zero a stacked batch's missing steps, mark them with trajectory id -1, add the mask."""
    for i, (taken, cut) in enumerate(zip(steps, short, strict=True)):
        if cut:
            out[i][..., taken:].zero_()
            out.get(TRAJ_KEY)[i][..., taken:] = -1
    out.set(("collector", "mask"), out.get(TRAJ_KEY) != -1)


class AsyncGathering(Gathering):
    """Each worker's batch as soon as it is ready (first ready, first served); a worker starts
    its next batch as soon as its last one was copied out, or, where the collector releases
    it only after the yield (``_release_after_yield``), when the caller asks for the next
    batch (``_next_ready`` then sets it collecting)."""

    def iterator(self) -> Iterator[TensorDictBase | None]:
        c = self.c
        early = not c._release_after_yield
        while c._more():
            index, batch, frames = self._next_ready()
            c._frames += frames  # counted now: how much the worker is asked for next needs it
            if c.update_at_each_batch:
                c.update_policy_weights_(worker_ids=[index])
            # the worker's next batch overlaps this one's split/postproc/buffer work
            if early and self._wanted(c._in_flight):
                c._collect_from(index)
            yield c._finish(batch, 0)

    def collect_round(self) -> tuple[TensorDictBase, int]:
        index, batch, frames = self._next_ready()
        self.c._collect_from(index)
        return batch, frames

    def _next_ready(self) -> tuple[int, TensorDictBase, int]:
        """Set every idle worker collecting; the first finished batch (a copy), its worker and
        its frames."""
        c = self.c
        got = None
        while got is None:
            # most often every worker collects already (it was asked again as soon as its
            # batch was taken): then this costs the same at 2 and at 1,000 workers
            if len(c._in_flight) < len(c._active):
                for i in list(c._active):
                    if i not in c._in_flight and self._wanted(c._in_flight):
                        c._collect_from(i)
            got = c._wait_batch(c._in_flight)
        index, frames = got
        c._in_flight.discard(index)
        return index, c._stamp_rows(c._own_batch(index), [index]), frames
