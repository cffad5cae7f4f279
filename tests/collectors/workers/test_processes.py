"""Worker processes and signals: workers leave the stop to their parent, never outlive it, and a
worker that cannot listen is killed at shutdown instead of being waited on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import CounterEnv, alive

from hpccollect import MultiSyncDataCollector
from hpccollect.errors import CollectorTimeoutError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_workers_ignore_sigterm_and_exit_when_their_parent_dies(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent("""
        import gymnasium as gym
        from hpccollect import MultiSyncDataCollector
        if __name__ == "__main__":
            c = MultiSyncDataCollector([lambda: gym.make("CartPole-v1")] * 2, None,
                                       frames_per_batch=100)
            print(*c.worker_pids, flush=True)
            for _ in c:
                print("batch", flush=True)
        """)
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert proc.stdout.readline() == "batch\n"
        for pid in pids:
            os.kill(pid, signal.SIGTERM)  # as a scheduler signals every process of a job
        time.sleep(1)
        assert all(alive(p) for p in pids), "a worker died of SIGTERM"
        for _ in range(3):  # and the collection goes on
            assert proc.stdout.readline() == "batch\n"
        proc.kill()  # the parent dies without a word: its pipes close
        proc.wait(10)
    finally:
        proc.kill()
    deadline = time.monotonic() + 15
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "workers outlived their parent"


def test_a_worker_that_never_answered_is_killed_at_once():
    def slow_env():
        time.sleep(60)
        return CounterEnv(3)

    start = time.monotonic()
    with pytest.raises(CollectorTimeoutError):
        MultiSyncDataCollector([slow_env], None, frames_per_batch=5, start_timeout=3)
    # the shutdown does not wait its 10 s for a worker that cannot be listening
    assert time.monotonic() - start < 3 + 6


def test_a_worker_that_missed_its_deadline_is_killed_at_once():
    class Sleepy(CounterEnv):
        def step(self, action):
            time.sleep(60)
            return super().step(action)

    collector = MultiSyncDataCollector([Sleepy], None, frames_per_batch=5, worker_timeout=2)
    pid = collector.worker_pids[0]
    with pytest.raises(CollectorTimeoutError):
        next(iter(collector))
    start = time.monotonic()
    collector.shutdown(timeout=30)
    assert time.monotonic() - start < 6 and not alive(pid)


def _leave_a_collector_running() -> None:
    from conftest import CounterEnv

    from hpccollect import MultiSyncDataCollector

    collector = MultiSyncDataCollector([CounterEnv] * 2, None, frames_per_batch=4)
    next(iter(collector))
    raise AssertionError("left without shutdown")  # the collector is still open


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_multiprocessing_child_that_left_a_collector_open_still_exits() -> None:
    """Workers are not daemonic (their envs may start processes); a process that
    multiprocessing started runs no atexit handler and joins such children on its way out, so
    the pools are shut down from its finalizers first: it exits instead of waiting forever."""
    import multiprocessing as mp

    child = mp.get_context("spawn").Process(target=_leave_a_collector_running)
    child.start()
    child.join(60)
    alive = child.is_alive()
    if alive:
        child.kill()
        child.join(10)
    assert not alive and child.exitcode == 1
