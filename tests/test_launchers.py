"""``hpccollect._launchers``: the reaper a rank starts before it aborts a job under Open MPI,
whose launcher (``prterun``) can deadlock while it tears the job down. Real processes: a Python
renamed ``prterun`` (a link to this Python, so that its process name is the launcher's) starts
the ranks, then hangs as the stuck launcher does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import alive

pytestmark = pytest.mark.timeout(60)

#: the launcher: starts its ranks (argv[1], JSON), waits for the first, then hangs (or ends)
LAUNCHER = """
import json, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
ranks = [subprocess.Popen(argv) for argv in json.loads(sys.argv[1])]
print("ranks", *[r.pid for r in ranks], flush=True)
ranks[0].wait()
print("rank ended", flush=True)
if sys.argv[2] == "hang":
    time.sleep(60)
"""
#: the rank that aborts: starts the reaper (if its launcher needs one), then exits 1
ABORTING = """
import sys
from hpccollect._launchers import reap_after_abort
print("reaper", reap_after_abort(grace=float(sys.argv[1]), childless=float(sys.argv[2])), flush=True)
sys.exit(1)
"""


class Job:
    """A launcher named ``name`` running the aborting rank (and ``others``), as a test sees it."""

    def __init__(
        self, tmp_path: Path, name: str, others: list[list[str]], then: str, grace: float
    ) -> None:
        link = tmp_path / name
        link.symlink_to(sys.executable)
        rank = [sys.executable, "-c", ABORTING, str(grace), "1"]  # 1 s once alone
        self.proc = subprocess.Popen(
            [str(link), "-c", LAUNCHER, json.dumps([rank, *others]), then],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.ranks = [int(p) for p in self.proc.stdout.readline().split()[1:]]
        reaper = self.proc.stdout.readline().split()
        assert reaper[0] == "reaper", reaper
        self.reaper = None if reaper[1] == "None" else int(reaper[1])
        assert self.proc.stdout.readline().strip() == "rank ended"
        self.rank_ended = time.monotonic()

    def ended_after(self, timeout: float = 10.0) -> tuple[int, float]:
        """The launcher's status, and the seconds from the rank's end to the launcher's."""
        code = self.proc.wait(timeout)
        return code, time.monotonic() - self.rank_ended

    def close(self) -> None:
        for pid in [self.proc.pid, *self.ranks, self.reaper]:
            if pid is not None and alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(5)
        self.proc.stdout.close()


@pytest.fixture
def job(tmp_path):
    started: list[Job] = []

    def start(
        name: str, others: list[list[str]] = (), then: str = "hang", grace: float = 3.0
    ) -> Job:
        started.append(Job(tmp_path, name, list(others), then, grace))
        return started[-1]

    yield start
    for each in started:
        each.close()


@pytest.mark.timed
def test_a_launcher_left_with_no_rank_after_the_abort_is_ended(job) -> None:
    stuck = job("prterun")
    assert stuck.reaper is not None
    code, seconds = stuck.ended_after()
    assert code == -signal.SIGKILL
    assert 0.8 < seconds < 4.0, f"ended {seconds:.1f} s after its last rank (1 s expected)"
    deadline = time.monotonic() + 3
    while alive(stuck.reaper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(stuck.reaper), "the reaper stayed after its work"


@pytest.mark.timed
def test_a_launcher_with_ranks_still_running_gets_the_grace_then_ends_with_them(job) -> None:
    # the grace counts from the reaper's start, before the test learns that the rank ended:
    # 6 s leaves the check below seconds of room on a loaded machine (one run found the 3 s
    # grace over 1.8 s after it learnt)
    stuck = job("prted", others=[["sleep", "60"]], grace=6.0)
    time.sleep(1.8)  # past the 1 s a launcher with no rank left gets: this one has one
    assert stuck.proc.poll() is None, "ended before its grace, with a rank still running"
    code, seconds = stuck.ended_after()
    assert code == -signal.SIGKILL and seconds < 8.0
    deadline = time.monotonic() + 3
    while alive(stuck.ranks[1]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(stuck.ranks[1]), "the rank still running was left behind"


#: a rank that names itself with bytes that are not UTF-8 (PR_SET_NAME), then stays
RENAMED = """
import ctypes, time
ctypes.CDLL(None).prctl(15, b"rank-\\xff\\xfe", 0, 0, 0)
time.sleep(60)
"""


def test_a_rank_named_in_bytes_that_are_not_utf8_is_reaped_too(job) -> None:
    """A process may name itself with any bytes: the reaper reads every process's name, and
    once failed on such a one (and with it, the stuck launcher stayed)."""
    stuck = job("prterun", others=[[sys.executable, "-c", RENAMED]])
    deadline = time.monotonic() + 5
    while b"\xff" not in Path(f"/proc/{stuck.ranks[1]}/stat").read_bytes():
        assert time.monotonic() < deadline, "the rank never renamed itself"
        time.sleep(0.05)
    assert stuck.ended_after()[0] == -signal.SIGKILL
    deadline = time.monotonic() + 3
    while alive(stuck.ranks[1]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(stuck.ranks[1]), "the renamed rank was left behind"


def test_a_launcher_that_ends_by_itself_is_left_alone(job) -> None:
    done = job("prterun", then="end")
    assert done.ended_after()[0] == 0
    deadline = time.monotonic() + 3
    while alive(done.reaper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(done.reaper), "the reaper stayed after its launcher ended"


@pytest.mark.parametrize("name", ["mpiexec.hydra", "hydra_pmi_proxy", "python3"])
def test_no_reaper_under_a_launcher_that_ends_its_jobs(job, name) -> None:
    """MPICH's and Intel MPI's hydra end an aborted job; under srun or no launcher at all, the
    parent is no MPI launcher's."""
    other = job(name, then="end")
    assert other.reaper is None
    assert other.ended_after()[0] == 0
