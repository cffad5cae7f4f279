"""Rank reports: what a collector rank sends rank 0 instead of its batches when the batches stay
where they were collected (``DistributedDataCollector(rank_reports=True)``: a ``rank_sink``, a
dataset shard per rank, keeps them).

A rank then takes a ``COLLECT`` for several batches. It collects them one after the other,
hands each to its sink, and stops early once ``report_interval`` seconds have passed, or once
rank 0 sent it something (a stop, new weights: such a message waits one batch). A stop rank 0
decides while it waits for reports (a SIGTERM) is sent with its answer to the next report, so
it reaches a rank within one interval and a batch. It
then answers with one report of fixed layout (``report_template``), whatever the batches' size:

* ``rank``: the collector rank (1..N);
* ``frames``, ``batches``: what it collected since its last report;
* ``episodes``, ``return_sum``: the episodes that ended meanwhile and the sum of their returns;
* ``recent_returns``: the returns of the last ``RECENT`` of those episodes, oldest first, NaN
  where there were fewer;
* ``committed_episodes``, ``committed_steps``: what the rank's sink has committed so far (its
  own counts, when the sink keeps some; else the episodes and frames reported so far).

Rank 0 moves, decodes and counts one small message per report instead of one batch per batch:
its cost no longer grows with the batches' bytes or their number. ``ReportTally`` is the sink a
job's rank 0 keeps the reports in.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from hpccollect.storage.sink import EpisodeReturns, Sink

__all__ = [
    "RECENT",
    "RankReporter",
    "ReportTally",
    "Reporting",
    "frames_in",
    "is_report",
    "quiet_reports",
    "report_template",
]

RECENT = 100  # returns a report carries: what a progress line's mean is taken over
_COUNTS = ("rank", "frames", "batches", "episodes", "committed_episodes", "committed_steps")
_COMMITTED = ("rank", "committed_episodes", "committed_steps")


@dataclass(frozen=True)
class Reporting:
    """How a rank reports (``WorkerSpec.reports``): as collector rank ``rank``, at least once
    every ``interval`` seconds of collection."""

    rank: int
    interval: float


def report_template() -> TensorDict:
    """An empty report: the layout every report has (a TensorDict of batch size ``[]``)."""
    fields: dict[str, torch.Tensor] = {k: torch.zeros((), dtype=torch.int64) for k in _COUNTS}
    fields["return_sum"] = torch.zeros((), dtype=torch.float64)
    fields["recent_returns"] = torch.full((RECENT,), math.nan, dtype=torch.float64)
    return TensorDict(fields, batch_size=[])


def is_report(td: TensorDictBase) -> bool:
    """Whether ``td`` is a report, or reports stacked (``sync=True``), not a batch."""
    return td.batch_dims <= 1 and td.get("recent_returns", None) is not None


def quiet_reports(reports: TensorDictBase) -> TensorDictBase:
    """``reports`` (one, or stacked) as their ranks would send them after a while of not
    collecting: nothing new (no frames, batches, episodes or returns), the same ranks and
    committed counts. A new TensorDict."""
    out = reports.clone()
    for key in ("frames", "batches", "episodes", "return_sum"):
        out.get(key).zero_()
    out.get("recent_returns").fill_(math.nan)
    return out


def frames_in(td: TensorDictBase) -> int:
    """The frames ``td`` stands for: a batch's own, or those its reports count."""
    return int(td.get("frames").sum()) if is_report(td) else td.numel()


class RankReporter:
    """A collector rank's side: collects for one ``COLLECT``, then writes the report.

    Args:
        reporting: the rank and its report interval.
        sink: what keeps the batches (its committed counts go into each report), or None.
    """

    def __init__(self, reporting: Reporting, sink: Any) -> None:
        self.reporting, self.sink = reporting, sink
        self._episodes = EpisodeReturns()
        self._reported = [0, 0]  # episodes and frames reported so far
        self.template = report_template()

    def collect(
        self,
        collect_one: Callable[[], TensorDictBase],
        batches: int,
        into: TensorDictBase,
        interrupted: Callable[[], bool] = lambda: False,
    ) -> int:
        """Collect up to ``batches`` batches with ``collect_one`` (which also hands each to the
        sink), stopping after the first one past the interval, or once ``interrupted()`` (rank
        0 sent something: a stop waits one batch, not a whole report); write the report into
        ``into``; the frames collected."""
        deadline = time.monotonic() + self.reporting.interval
        frames = count = episodes = 0
        total = 0.0
        recent: deque[float] = deque(maxlen=RECENT)
        while True:
            batch = collect_one()
            ended, _ = self._episodes.ended(batch)
            frames += batch.numel()
            count += 1
            episodes += len(ended)
            total += math.fsum(ended)
            recent.extend(ended)
            if count >= batches or time.monotonic() >= deadline or interrupted():
                break
        self._reported[0] += episodes
        self._reported[1] += frames
        committed = self._reported
        if isinstance(self.sink, Sink):
            committed = [self.sink.committed_episodes, self.sink.committed_steps]
        returns = torch.full((RECENT,), math.nan, dtype=torch.float64)
        returns[: len(recent)] = torch.tensor(list(recent), dtype=torch.float64)
        values = (self.reporting.rank, frames, count, episodes, *committed)
        for key, value in zip(_COUNTS, values, strict=True):
            into.get(key).fill_(value)
        into.get("return_sum").fill_(total)
        into.get("recent_returns").copy_(returns)
        return frames


class ReportTally(Sink):
    """Rank 0's sink for reports: the episodes and frames the ranks report, their committed
    counts (each rank's latest, summed) and the returns of the last ``RECENT`` episodes
    reported. Keeps no data: the ranks' sinks do."""

    def __init__(self) -> None:
        self.returns: list[float] = []
        self.episodes = 0
        self.frames = 0
        self._committed: dict[int, tuple[int, int]] = {}

    def extend(self, batch: TensorDictBase) -> None:
        """Take a report, or reports stacked."""
        if not is_report(batch):
            raise TypeError(
                "ReportTally takes the reports of ranks that keep their batches "
                "(DistributedDataCollector(rank_reports=True)), got a batch."
            )
        returns = batch.get("recent_returns").reshape(-1)  # the reports' returns, in order
        self.returns.extend(returns[~returns.isnan()].tolist())
        del self.returns[:-RECENT]
        self.episodes += int(batch.get("episodes").sum())
        self.frames += int(batch.get("frames").sum())
        counts = (batch.get(k).reshape(-1).tolist() for k in _COMMITTED)
        for rank, episodes, steps in zip(*counts, strict=True):
            self._committed[rank] = (episodes, steps)
        self.committed_episodes = sum(e for e, _ in self._committed.values())
        self.committed_steps = sum(s for _, s in self._committed.values())

    def close(self) -> None:
        return None
