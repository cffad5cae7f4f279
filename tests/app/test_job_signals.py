"""The main job under a batch scheduler's signals and faults: real process groups, real signals
(``os.killpg``), real worker processes, the dataset read back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import alive, cmdline, descendants, parent

from hpccollect.storage import open_dataset

pytestmark = [pytest.mark.slow]

#: Envs that misbehave only in worker processes (the parent's env probe stays fast).
TEST_ENVS = """
import multiprocessing
import time

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


def in_worker():
    return multiprocessing.parent_process() is not None


class SlowStart(CartPoleEnv):
    def __init__(self, **kwargs):
        if in_worker():
            time.sleep(60)
        super().__init__(**kwargs)


class HangAfter(CartPoleEnv):
    steps = 0

    def step(self, action):
        HangAfter.steps += 1
        if in_worker() and HangAfter.steps > 300:
            time.sleep(3600)
        return super().step(action)


gym.register("slowenvs/SlowStart-v0", entry_point=SlowStart, max_episode_steps=200)
gym.register("slowenvs/HangAfter-v0", entry_point=HangAfter, max_episode_steps=200)
"""


def start(tmp_path: Path, *args) -> subprocess.Popen:
    """The CLI in a session of its own, so it can be signalled as a process group."""
    (tmp_path / "slowenvs.py").write_text(TEST_ENVS)
    env = {k: v for k, v in os.environ.items() if k != "HPCCOLLECT_DATA_DIR"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-m", "hpccollect", "--quiet", *map(str, args)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for(proc: subprocess.Popen, condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            said = proc.stderr.read() if proc.stderr else ""
            pytest.fail(f"the job ended ({proc.returncode}) before {what}: {said}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def committed(partial: Path, steps: int) -> Callable[[], bool]:
    """A condition: a run's unfinished file ``partial`` has committed ``steps`` frames."""

    def condition() -> bool:
        if not partial.exists():
            return False
        try:
            with open_dataset(partial) as ds:
                return ds.committed_steps >= steps
        except Exception:  # created but not readable yet
            return False

    return condition


def assert_none_survive(pids: list[int]) -> None:
    # the stdlib's resource tracker exits when its pipe closes: allow it a moment
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "worker processes survived the job"


def workers_of(proc: subprocess.Popen) -> list[int]:
    """The job's worker processes: forked from its fork server, the child of the job's process
    that runs ``multiprocessing.forkserver``."""
    tree = descendants(proc.pid)
    servers = {p for p in tree if parent(p) == proc.pid and b"forkserver" in cmdline(p)}
    return [p for p in tree if parent(p) in servers]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "collector,sig",
    [
        ("multi-sync", signal.SIGTERM),
        ("multi-async", signal.SIGTERM),
        ("single", signal.SIGTERM),
        ("multi-sync", signal.SIGINT),
    ],
)
def test_signal_to_the_process_group_is_a_clean_stop(tmp_path, collector, sig):
    proc = start(
        tmp_path,
        "--collector",
        collector,
        "--total-frames",
        10_000_000,
        "--frames-per-batch",
        500,
        "--out",
        "long.h5",
    )
    try:
        wait_for(proc, committed(tmp_path / "long.h5.partial", 1500), 150, "a few batches")
        processes = descendants(proc.pid)
        if collector != "single":
            assert len(workers_of(proc)) == 2
        os.killpg(proc.pid, sig)  # what SLURM, scancel, timeout and a terminal's Ctrl-C do
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 0, err
    assert f"stopped early by {sig.name}" in out, out
    with open_dataset(tmp_path / "long.h5") as ds:
        assert len(ds) > 0 and ds.check() == [] and ds.metadata["complete"]
        assert f"episodes kept     {ds.committed_episodes}" in out
    assert_none_survive(processes)


@pytest.mark.timeout(120)
def test_sigterm_during_start_up_stops_the_workers_at_once(tmp_path):
    proc = start(
        tmp_path,
        "--import",
        "slowenvs",
        "--env",
        "slowenvs/SlowStart-v0",
        "--collector",
        "multi-sync",
        "--total-frames",
        1000,
        "--out",
        "never.h5",
    )
    try:
        wait_for(proc, lambda: len(workers_of(proc)) == 2, 60, "the workers to start")
        time.sleep(1)
        processes = descendants(proc.pid)
        signalled = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=40)
        took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 0, err
    assert "stopped by SIGTERM during start-up" in out, (out, err)
    assert "Traceback" not in err
    assert took < 20, f"the job took {took:.1f} s to stop"  # the envs sleep 60 s in start-up
    assert not (tmp_path / "never.h5").exists() and not (tmp_path / "never.h5.partial").exists()
    assert_none_survive(processes)


@pytest.mark.timeout(180)
def test_a_hung_worker_is_noticed_after_worker_timeout(tmp_path):
    proc = start(
        tmp_path,
        "--import",
        "slowenvs",
        "--env",
        "slowenvs/HangAfter-v0",
        "--collector",
        "multi-sync",
        "--total-frames",
        100_000,
        "--frames-per-batch",
        200,
        "--worker-timeout",
        3,
        "--out",
        "hung.h5",
    )
    try:
        wait_for(proc, (tmp_path / "hung.h5.partial").exists, 150, "collection to start")
        processes = descendants(proc.pid)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 1, (out, err)
    lines = [line for line in err.splitlines() if line.startswith("hpccollect")]
    assert len(lines) == 1 and "--worker-timeout 3" in lines[0], err
    assert "Traceback" not in err
    with open_dataset(tmp_path / "hung.h5") as ds:
        assert len(ds) > 0 and ds.check() == []
    assert_none_survive(processes)
