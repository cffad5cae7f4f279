"""Rank reports (``collectors/workers/reports.py``): what a rank that keeps its batches tells rank 0,
and rank 0's tally of them."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import CounterEnv

from hpccollect import SyncDataCollector
from hpccollect.collectors.workers.reports import (
    RECENT,
    RankReporter,
    Reporting,
    ReportTally,
    frames_in,
    is_report,
    report_template,
)


class Kept:
    """A sink that keeps every batch's frame count."""

    def __init__(self) -> None:
        self.frames: list[int] = []

    def extend(self, batch) -> None:
        self.frames.append(batch.numel())


def test_a_report_counts_the_batches_its_sink_took_and_the_episodes_they_ended():
    collector = SyncDataCollector(
        lambda: CounterEnv(3), None, frames_per_batch=10, return_same_td=True
    )
    sink = Kept()
    reporter = RankReporter(Reporting(rank=2, interval=60.0), sink)

    def one():
        batch = collector._collect_counted()
        sink.extend(batch)
        return batch

    tally = ReportTally()
    reports = []
    for batches in (3, 1):
        report = reporter.template.clone()
        assert reporter.collect(one, batches, report) == 10 * batches
        reports.append(report)
        tally.extend(report)
    collector.shutdown()

    first, second = reports
    assert is_report(first) and not is_report(collector._shared_batch())
    assert (int(first["rank"]), int(first["batches"]), int(first["frames"])) == (2, 3, 30)
    assert int(first["episodes"]) == 10 and float(first["return_sum"]) == 10 * 6.0
    assert int(second["episodes"]) == 3  # steps 31..40 end episodes at 33, 36, 39
    assert int(second["committed_episodes"]) == 13 and int(second["committed_steps"]) == 40
    assert sink.frames == [10] * 4
    assert tally.frames == 40 and tally.episodes == tally.committed_episodes == 13
    assert tally.returns == [6.0] * 13
    assert frames_in(first) == 30 and frames_in(torch.stack(reports)) == 40


def test_an_interval_of_0_reports_after_every_batch_and_recent_returns_are_capped():
    collector = SyncDataCollector(lambda: CounterEnv(1), None, frames_per_batch=60)
    reporter = RankReporter(Reporting(rank=1, interval=0.0), None)
    report = report_template()
    assert reporter.collect(collector._collect_counted, 5, report) == 60  # one batch only
    reporter.collect(collector._collect_counted, 5, report)
    collector.shutdown()
    returns = report["recent_returns"]
    assert int(report["episodes"]) == 60
    assert not returns[:60].isnan().any() and returns[60:].isnan().all()
    assert returns.shape == (RECENT,) and int(report["committed_episodes"]) == 120
    tally = ReportTally()
    tally.extend(report)
    assert len(tally.returns) == 60
    tally.extend(report)
    assert len(tally.returns) == RECENT


def test_a_message_from_rank_0_ends_the_report_after_the_batch_under_way():
    """A stop (or new weights) waits one batch, not the rest of the report's batches."""
    collector = SyncDataCollector(lambda: CounterEnv(3), None, frames_per_batch=10)
    reporter = RankReporter(Reporting(rank=1, interval=60.0), None)
    looks = []

    def interrupted() -> bool:
        looks.append(None)
        return len(looks) == 2  # the message comes during the second batch

    report = report_template()
    assert reporter.collect(collector._collect_counted, 50, report, interrupted) == 20
    collector.shutdown()
    assert int(report["batches"]) == 2


def test_the_tally_takes_reports_only():
    with pytest.raises(TypeError, match="rank_reports=True"):
        ReportTally().extend(SyncDataCollector(lambda: CounterEnv(3), None, frames_per_batch=4,
                                               return_same_td=True)._shared_batch())  # fmt: skip
    empty = report_template()
    assert math.isnan(float(empty["recent_returns"][0])) and frames_in(empty) == 0
