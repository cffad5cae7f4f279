"""``workers/kill_warning.py``: where the launcher kills soon after SIGTERM, the signal ends a
worker's batch at once, but never a write of its sink (real signals to this process)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from hpccollect.collectors.workers.kill_warning import KillWarning, SinkGuard


@pytest.fixture
def under_open_mpi(monkeypatch):
    monkeypatch.setenv("PRTE_LAUNCHED", "1")  # what Open MPI's mpirun sets in its ranks


@pytest.mark.timeout(30)
def test_sigterm_ends_the_batch_under_way_at_once(under_open_mpi):
    guard = SinkGuard()
    with pytest.raises(KillWarning), guard.installed():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # a batch under way: the signal ends it
    assert signal.getsignal(signal.SIGTERM) is not guard._handle  # put back


@pytest.mark.timeout(30)
def test_a_sigterm_during_a_write_comes_once_the_write_is_done(under_open_mpi):
    guard = SinkGuard()
    written = []
    with pytest.raises(KillWarning), guard.installed():
        with guard.writing():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the write goes on
            written.append("row")
        written.append("never")  # raised as the write ends
    assert written == ["row"]


def test_where_the_launcher_leaves_time_nothing_is_installed(monkeypatch):
    monkeypatch.delenv("PRTE_LAUNCHED", raising=False)
    before = signal.getsignal(signal.SIGTERM)
    with SinkGuard().installed():
        assert signal.getsignal(signal.SIGTERM) is before
