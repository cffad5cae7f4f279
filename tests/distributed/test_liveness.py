"""Liveness across ranks: a collector rank that goes silent (stopped with SIGSTOP, as a lost
node or a cut network looks from rank 0) is reported within ``liveness_timeout`` (which rank,
which host, how long) or let go with ``on_worker_failure="continue"``; a silent rank 0 ends
every collector rank; ranks that are only slow, and a trainer that is only busy, are never
taken for lost. Real ranks: local processes in a gloo group, and ``mpiexec -n 3`` with the
mpi4py transport."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mpirun
import pytest
from conftest import alive

pytestmark = [pytest.mark.slow, pytest.mark.timed]  # asserts how long detection takes

JOB = Path(__file__).with_name("liveness_job.py")


LIVENESS = 3.0  # the job's liveness_timeout


class Job:
    """liveness_job.py running in a session of its own (under mpiexec with ``ranks``, of the
    tests' MPI or of ``flavour``)."""

    def __init__(
        self, tmp_path: Path, *args: str, ranks: int = 0, flavour: str | None = None
    ) -> None:
        self.out = tmp_path / "out"
        cmd = [sys.executable, str(JOB), str(self.out), *args]
        if ranks:
            cmd = mpirun.command(ranks, *cmd, "--launcher", "mpi", flavour=flavour)
        env = {**os.environ, **mpirun.flavour_env(flavour)} if flavour else None
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env=env,
        )

    def pids(self, timeout: float = 60.0) -> list[int]:
        """Rank 0's pid, then each collector rank's, once rank 0 collects."""
        path = self.out.with_suffix(".ranks")
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.end()
                pytest.fail(f"the job never collected:\n{self.proc.stderr.read()}")
            time.sleep(0.05)
        return json.loads(path.read_text())

    def result(self, timeout: float = 60.0) -> dict:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.end(dump=True)
            pytest.fail(f"the job did not end within {timeout:.0f} s:\n{self.stderr}")
        finally:
            self.end()
        path = self.out.with_suffix(".result")
        assert path.exists(), f"no result (exit {self.proc.returncode}):\n{self.stderr}"
        return json.loads(path.read_text())

    def end(self, dump: bool = False) -> None:
        """Kill what is left of the job; ``dump``: each process prints its threads' stacks first."""
        if self.proc.poll() is None:
            if dump:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGCONT)
                    os.killpg(self.proc.pid, signal.SIGUSR1)
                time.sleep(1.0)
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if not hasattr(self, "stderr"):
            self.stderr = self.proc.stderr.read()


def stop(pid: int) -> float:
    os.kill(pid, signal.SIGSTOP)
    return time.time()


def assert_gone(pids: list[int], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    for pid in pids:  # a stopped process does not die of SIGTERM: let it go on first
        if alive(pid):
            os.kill(pid, signal.SIGCONT)
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if alive(p)], "processes of the job are still running"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "args, margin",
    [
        pytest.param(["--sync", "0"], 1.0, id="async"),
        pytest.param(["--sync", "1"], 1.0, id="sync"),
        # rank 0 sends 32 MB of weights after every batch: the stopped rank holds the broadcast
        # (more than the sockets take), and is named within liveness_timeout, not after the
        # broadcast's worker_timeout (600 s); silence is looked for once a second there
        pytest.param(["--weights", str(8_000_000)], 2.0, id="during-a-weight-broadcast"),
    ],
)
def test_a_stopped_rank_is_reported_within_the_liveness_timeout(tmp_path, args, margin):
    job = Job(tmp_path, *args)
    pids = job.pids()
    stopped = stop(pids[2])
    result = job.result()
    assert "error" in result, result
    took = result["at"] - stopped
    assert took <= LIVENESS + margin, f"reported {took:.1f} s after the rank stopped"
    text = result["error"]
    assert f"collector rank 2 (pid {pids[2]}, " in text  # which rank, and its host
    assert "has sent nothing, not even a heartbeat, for" in text  # how long
    assert "liveness_timeout" in text
    assert job.proc.returncode == 0
    assert_gone(pids)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sync", [0, 1], ids=["async", "sync"])
def test_continue_goes_on_without_a_stopped_rank_and_says_so_once(tmp_path, sync):
    job = Job(tmp_path, "--sync", str(sync), "--failure", "continue")
    pids = job.pids()
    stopped = stop(pids[2])
    result = job.result()
    assert result.get("lost") == [2], result
    assert result["at"] - stopped <= LIVENESS + 1.0
    assert result["batches_after"] == 10  # rank 1 alone kept collecting
    warned = [line for line in job.stderr.splitlines() if "is lost and collection goes on" in line]
    assert len(warned) == 1, job.stderr
    assert "collector rank 2" in warned[0] and "not even a heartbeat" in warned[0]
    assert_gone(pids)


@pytest.mark.timeout(120)
def test_a_stopped_rank_0_ends_every_collector_rank(tmp_path):
    job = Job(tmp_path, "--limit", "100")
    pids = job.pids()
    stopped = time.monotonic()
    os.kill(pids[0], signal.SIGSTOP)
    try:
        deadline = stopped + LIVENESS + 8
        while any(alive(p) for p in pids[1:]) and time.monotonic() < deadline:
            time.sleep(0.05)
        ended = time.monotonic() - stopped
        assert not [p for p in pids[1:] if alive(p)], "collector ranks outlived a silent rank 0"
    finally:
        job.end()
    assert ended <= LIVENESS + 4.0, f"the collector ranks took {ended:.1f} s to end"
    for rank in (1, 2):
        assert f"collector rank {rank} on " in job.stderr
    assert job.stderr.count("rank 0 (127.0.0.1) has sent nothing, not even a heartbeat") == 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("what", ["slow-env", "busy-trainer"])
def test_ranks_that_are_only_slow_are_never_taken_for_lost(tmp_path, what):
    """A batch that takes longer than the timeout (each step 0.5 s, 10 steps), and a trainer
    that takes longer than the timeout between batches: the heartbeats carry both."""
    args = ["--slow", "0.5", "--warmup", "2"] if what == "slow-env" else ["--pause", "4.5"]
    job = Job(tmp_path, "--failure", "continue", "--limit", "14", *args)
    result = job.result(timeout=90)
    assert "timeout" in result, result  # neither an error nor a lost rank
    assert result["timeout"] >= 3
    assert "rank 0" not in job.stderr and "lost" not in job.stderr, job.stderr
    assert job.proc.returncode == 0


# ---------------------------------------------------------------------- under mpiexec
@mpirun.needs()
@pytest.mark.mpi
@pytest.mark.timeout(150)
@pytest.mark.usefixtures("no_mpich_segments_left")
@pytest.mark.parametrize(
    ("backend", "sync", "failure", "comes_back", "flavour"),
    [
        ("mpi", 0, "raise", True, None),
        ("mpi", 1, "continue", True, None),
        ("gloo", 0, "continue", True, None),
        ("mpi", 0, "continue", False, None),
        ("gloo", 1, "raise", False, None),
        pytest.param("gloo", 1, "raise", False, "impi", marks=mpirun.needs("impi")),
    ],
)
def test_under_mpiexec_a_stopped_rank_is_reported_and_the_job_still_exits_0(
    tmp_path, backend, sync, failure, comes_back, flavour
):
    """Reported in time; then the rank comes back (it must find its way out), or never does
    (MPI cannot end one rank: the job is ended when rank 0 exits, with status 0)."""
    args = ["--backend", backend, "--sync", str(sync), "--failure", failure, "--hold"]
    job = Job(tmp_path, *args, ranks=3, flavour=flavour)
    pids = job.pids()
    stopped = stop(pids[2])
    detected = job.out.with_suffix(".detected")
    deadline = time.monotonic() + 30
    while not detected.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if comes_back:
        os.kill(pids[2], signal.SIGCONT)
    job.out.with_suffix(".resume").write_text("")
    result = job.result(timeout=60)
    took = result["at"] - stopped
    assert took <= LIVENESS + 1.0, f"reported {took:.1f} s after the rank stopped"
    if failure == "raise":
        assert "collector rank 2" in result["error"] and "not even a heartbeat" in result["error"]
    else:
        assert result["lost"] == [2] and result["batches_after"] == 10
    assert job.proc.returncode == 0, job.stderr
    ended_job = "collector ranks [2] were lost and cannot be stopped from here" in job.stderr
    assert ended_job is not comes_back, job.stderr
    assert "did not stop when asked" not in job.stderr
    assert_gone(pids)


@mpirun.needs()
@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_a_trainer_that_leaves_with_a_rank_lost_still_ends_the_job(tmp_path, backend):
    """Rank 0 lets a lost rank go, then leaves its script with the collector open: its exit
    hooks shut the collector down, find the rank left running, and end the job (exit 0), where
    ``MPI_Finalize`` would wait for that rank forever."""
    args = ["--backend", backend, "--failure", "continue", "--leave"]
    job = Job(tmp_path, *args, ranks=3)
    pids = job.pids()
    stop(pids[2])
    result = job.result(timeout=60)
    assert result["lost"] == [2] and result["batches_after"] == 10
    assert job.proc.returncode == 0, job.stderr
    assert "collector ranks [2] were lost and cannot be stopped from here" in job.stderr
    assert_gone(pids)


@mpirun.needs()
@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_mpich_segments_left")
@pytest.mark.parametrize(
    ("backend", "flavour"),
    [
        ("gloo", None),
        ("mpi", None),
        pytest.param("mpi", "openmpi", marks=mpirun.needs("openmpi")),
    ],
)
def test_under_mpiexec_a_stopped_rank_0_ends_the_job(tmp_path, backend, flavour):
    job = Job(tmp_path, "--backend", backend, "--limit", "100", ranks=3, flavour=flavour)
    pids = job.pids()
    stopped = time.monotonic()
    os.kill(pids[0], signal.SIGSTOP)
    with contextlib.suppress(subprocess.TimeoutExpired):
        job.proc.wait(LIVENESS + 10)
    ended = time.monotonic() - stopped
    job.end()
    assert job.proc.returncode == 3, job.stderr  # a collector rank's: rank 0 was lost
    assert ended <= LIVENESS + 3.0, f"the job took {ended:.1f} s to end"
    assert "rank 0 (127.0.0.1) has sent nothing" in job.stderr or backend == "mpi"
    assert "rank 0 has sent nothing, not even a heartbeat" in job.stderr or backend == "gloo"
    assert_gone(pids)
