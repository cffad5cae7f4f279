"""One collection job's life, the same for a local and a distributed job: start under the stop
signals, collect into a sink until done or stopped, close everything, keep what was committed,
sum up. Where the collectors run and where the data goes is a ``Part``'s: ``local_job.LocalPart``
(this process and its workers) or ``mpi_job.MPIPart`` (rank 0 of an MPI job).

A stop during start-up keeps no dataset; a stop while collecting ends after the current batch
(at once where rank 0 takes only reports, or where the launcher kills the ranks soon after its
signal) and keeps every committed episode (``signals.py``);
a worker or rank that stops answering is killed and the committed episodes are kept.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from hpccollect.app.config import RunConfig
from hpccollect.app.resume import Attempt
from hpccollect.app.signals import Stopped, StopSignals, WaitCut
from hpccollect.app.summary import Summary
from hpccollect.collectors.workers.reports import frames_in
from hpccollect.errors import CollectorTimeoutError
from hpccollect.storage import Sink

__all__ = ["Job", "Part", "Progress"]

#: ``on_progress(frames, episodes, mean return of the last 100 episodes)``
Progress = Callable[[int, int, "float | None"], None]


class Part(Protocol):
    """What a job's local or distributed part decides.

    Attributes:
        cfg: the run's options (a resumed run's, once ``start`` has read them).
        attempt: the attempt of a resumed run, else None.
        who: what stops answering when a collector times out ("a worker", "a collector rank").
        reports: whether the collector yields the ranks' reports, not batches (each rank keeps
            its own data): a stop then ends the wait for the next one at once.
    """

    cfg: RunConfig
    attempt: Attempt | None
    who: str
    reports: bool

    def build(self, stop: StopSignals) -> Any:
        """Check everything, then build the collector (``Job`` seeds it)."""

    def open_sink(self, stop: StopSignals) -> Sink:
        """The sink the collector's batches go to."""

    def shut_down(self, collector: Any, discard: bool) -> None:
        """Stop the collector (``discard``: a stop before the first batch keeps nothing)."""

    def where(self) -> Path:
        """Where the committed episodes are kept."""

    def kept(self, sink: Sink, frames: int) -> tuple[int, int, list[float], Path] | None:
        """Episodes, steps, returns and the dataset the run leaves, once closed, after
        ``frames`` frames; None when it left none."""


class Job:
    """Runs one ``Part`` from start to summary (``run``)."""

    def __init__(self, part: Part) -> None:
        self.part = part
        self.collector: Any = None
        self.sink: Sink | None = None
        self.published = False
        self.frames = 0
        self.start = time.perf_counter()
        self.collect_start = self.last_batch = self.start

    def run(self, on_progress: Progress | None = None) -> Summary:
        """Collect until done or stopped; see the module docstring."""
        stop = StopSignals(cut_always=self.part.reports)
        with stop.installed():
            try:
                self.collector = self.part.build(stop)
                with stop.deferred():  # a distributed collector seeds its ranks: not cut short
                    self.collector.set_seed(self.part.cfg.seed)
                self.sink = self.part.open_sink(stop)
                self._collect(stop, on_progress)
            except Stopped:
                self._close(discard=True)
            except KeyboardInterrupt:
                stop.signal = stop.signal or "SIGINT"
            except CollectorTimeoutError as err:
                if not stop.collecting:  # start-up: its message names start_timeout already
                    raise
                self._close()
                raise self._timeout(err) from err
            finally:
                self._close()
        return self._summary(stop.signal)

    def _collect(self, stop: StopSignals, on_progress: Progress | None) -> None:
        sink = self.sink
        stop.collecting = True
        self.collect_start = self.last_batch = time.perf_counter()
        if on_progress is not None:
            on_progress(0, 0, None)
        batches = iter(self.collector)
        while True:
            try:
                with stop.cutting_waits():
                    batch = next(batches)
            except (StopIteration, WaitCut):
                break
            sink.extend(batch)
            self.frames += frames_in(batch)
            self.last_batch = time.perf_counter()
            if on_progress is not None:
                returns = sink.returns
                mean = statistics.fmean(returns[-100:]) if returns else None
                on_progress(self.frames, sink.committed_episodes, mean)
            if stop.signal is not None:
                break

    def _close(self, discard: bool = False) -> None:
        """Close the sink, then stop the collector (the file is finished first: a launcher may
        kill the job soon after its stop signal, see ``mpi_job.py``); ``discard`` removes a
        dataset that has received no batch (a stop during start-up). A resumed run's attempt is
        published once."""
        self._close_sink(discard)
        if self.collector is not None:
            collector, self.collector = self.collector, None
            self.part.shut_down(collector, discard)

    def _close_sink(self, discard: bool) -> None:
        if self.sink is None or self.sink.path is None:
            return
        path = self.sink.close()
        attempt = self.part.attempt
        if discard and self.frames == 0:
            path.unlink(missing_ok=True)
            self.sink = None
        elif attempt is not None and not self.published and self.sink.failed is None:
            self.published = True  # a failed file stays out: the next --resume repairs it
            attempt.publish([path])

    def _timeout(self, err: CollectorTimeoutError) -> CollectorTimeoutError:
        cfg = self.part.cfg
        kept = self.sink.committed_episodes if self.sink is not None else 0
        return CollectorTimeoutError(
            f"{self.part.who} stopped answering: {str(err).split(';')[0]} (--worker-timeout "
            f"{cfg.worker_timeout:g}); it was killed, {kept} committed episodes were kept in "
            f"{self.part.where()}. Raise --worker-timeout for slow envs or large batches."
        )

    def _summary(self, stopped_by: str | None) -> Summary:
        collecting = self.last_batch - self.collect_start
        elapsed = time.perf_counter() - self.start
        kept = None if self.sink is None else self.part.kept(self.sink, self.frames)
        if kept is None:
            return Summary(0, 0, 0, [], collecting, elapsed, None, stopped_by)
        episodes, steps, returns, path = kept
        attempt = self.part.attempt
        return Summary(
            self.frames,
            episodes,
            steps,
            returns,
            collecting,
            elapsed,
            path if attempt is None else attempt.run,
            stopped_by,
            None if attempt is None else attempt.held(),
        )
