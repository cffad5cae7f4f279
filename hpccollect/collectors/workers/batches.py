"""How a collector with workers takes their batches: asks a worker for one, waits for the
first to deliver, reads it (shared buffers, or a copy sent by value), lets a failed worker go
(``on_worker_failure="continue"``), and finishes each batch it yields (count, split,
post-process, store). A gathering (``gathering.py``) decides which workers and how batches are
put together."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tensordict import TensorDictBase

from hpccollect.collectors.loops.trajectories import split_trajectories
from hpccollect.collectors.workers.gathering import Gathering
from hpccollect.collectors.workers.pool import WorkerPool
from hpccollect.errors import WorkerError
from hpccollect.protocol import Command, Reply

__all__ = ["WorkerBatches"]

_MANY = 1 << 30  # batches asked of a worker that reports, for an endless collection


class WorkerBatches:
    """The batch path of ``MultiCollectorBase``; what it uses of the collector is declared."""

    total_frames: int
    worker_timeout: float
    on_worker_failure: str
    storing_device: Any
    split_trajs: bool
    postproc: Callable | None
    lost_workers: list[int]
    _closed: bool
    _pool: WorkerPool | None
    _gathering: Gathering
    _active: list[int]
    _in_flight: set[int]
    _layouts: list[TensorDictBase]
    _by_value: set[int]
    _received: dict[int, TensorDictBase]
    _shared: TensorDictBase | None
    _batch_frames: list[int]
    _asked: dict[int, int]
    _reports: bool
    _frames: int
    _iter: int
    _sink: Callable[[TensorDictBase], TensorDictBase | None]

    def _finish(self, batch: TensorDictBase, frames: int | None = None) -> TensorDictBase | None:
        """Count (``frames``: the valid frames, default all; 0 where the caller counted them),
        split, post-process, store; return what the iterator yields."""
        self._frames += batch.numel() if frames is None else frames
        self._iter += 1
        if self.storing_device is not None:
            batch = batch.to(self.storing_device)
        if self.split_trajs:
            batch = split_trajectories(batch)
            if self._time_named_split():
                batch.names = [None] * (batch.ndim - 1) + ["time"]
        if self.postproc is not None:
            batch = self.postproc(batch)
        return self._sink(batch)

    def iterator(self) -> Iterator[TensorDictBase | None]:
        """Batches as ``gathering`` yields them, until ``total_frames``."""
        return self._gathering.iterator()

    def _buffer_parts(self, batch: TensorDictBase) -> tuple[TensorDictBase, ...]:
        return self._gathering.buffer_parts(batch)

    def _time_named_split(self) -> bool:
        """Whether a split batch names its last dim "time"."""
        return self._gathering.time_named_split()

    def _stamp_rows(self, batch: TensorDictBase, workers: list[int]) -> TensorDictBase:
        """``batch`` (one row per worker in ``workers``, or one worker's) as yielded: here
        unchanged."""
        return batch

    def _shared_batch(self) -> TensorDictBase:
        """The buffers ``_collect_counted`` writes each batch into, in shared memory, made once:
        what a worker running this collector announces (``collector_class`` in a worker)."""
        if self._shared is None:
            self._shared = self._gathering.batch_template().clone().share_memory_()
        return self._shared

    def _use_batch_buffers(self, batch: TensorDictBase) -> None:
        """Write later batches into ``batch`` (laid out as ``_shared_batch()``)."""
        self._shared = batch

    def _collect_counted(self) -> TensorDictBase:
        """One batch into ``_shared_batch()``, counted in ``frames`` (a worker's COLLECT)."""
        batch, frames = self._gathering.collect_round()
        self._frames += frames
        self._iter += 1
        return self._shared_batch().update_(batch)

    def _more(self) -> bool:
        return not self._closed and (self.total_frames < 0 or self._frames < self.total_frames)

    def _collect_from(self, index: int) -> None:
        batches = self._batches_per_command(index)
        self._pool.send(index, Command.COLLECT, batches)
        self._asked[index] = batches * self._batch_frames[index]
        self._in_flight.add(index)

    def _batches_per_command(self, index: int) -> int:
        """How many batches worker ``index`` is asked for: one, unless it sends reports
        (``reports.py``); then its share of the frames still wanted, split among it and the
        workers not collecting now (it reports early, after its report interval)."""
        if not self._reports:
            return 1
        if self.total_frames < 0:
            return _MANY
        busy = [i for i in self._in_flight if i != index]
        left = self.total_frames - self._frames - sum(self._asked[i] for i in busy)
        share = self._batch_frames[index] * max(1, len(self._active) - len(busy))
        return max(1, min(_MANY, -(-left // share)))

    def _wait_batch(self, indices: Any) -> tuple[int, int] | None:
        """The first of ``indices`` to deliver its batch: (index, frames); None when a worker
        failed and was let go instead (see ``_lose``)."""
        try:
            got = self._pool.wait_any(indices, Reply.BATCH, self.worker_timeout)
            self._take_data(got[0])
            return got
        except WorkerError as err:
            self._lose(err)
            return None

    def _take_data(self, index: int) -> None:
        """Worker ``index`` delivered a batch: keep it, when it came by value (before BATCH)."""
        if index in self._by_value:
            self._received[index] = self._pool.recv(index, Reply.DATA, self.worker_timeout)

    def _batch(self, index: int) -> TensorDictBase:
        """Worker ``index``'s last batch: its shared buffers, or the one it sent."""
        if index in self._by_value:
            return self._received[index]
        return self._pool.channels[index].latest(self._layouts[index])

    def _own_batch(self, index: int) -> TensorDictBase:
        """Worker ``index``'s last batch as the caller's to keep: the one it sent, or what its
        channel gives (a copy of its buffers, or the buffer it arrived in)."""
        if index in self._by_value:
            return self._received[index]
        return self._pool.channels[index].own(self._layouts[index])

    def _lose(self, err: WorkerError) -> None:
        """A worker failed: raise ``err``, or, with ``on_worker_failure="continue"`` and other
        workers left, warn, stop that worker and go on without it."""
        index = err.worker
        if (
            self.on_worker_failure != "continue"
            or index not in self._active
            or len(self._active) < 2
        ):
            raise err
        warnings.warn(
            f"{self._pool.channels[index].describe()} is lost and collection goes on without it "
            f"(on_worker_failure='continue'): {str(err).splitlines()[0]}",
            RuntimeWarning,
            stacklevel=2,
        )
        self._active.remove(index)
        self._in_flight.discard(index)
        self.lost_workers.append(index)
        self._pool.channels[index].life.kill()

    def _drain(self, indices: Sequence[int]) -> None:
        """Wait out batches already requested (an earlier iteration that stopped early)."""
        for i in [i for i in indices if i in self._in_flight and i in self._active]:
            self._pool.recv(i, Reply.BATCH, self.worker_timeout)
            self._take_data(i)
            self._in_flight.discard(i)
