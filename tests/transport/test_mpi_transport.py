"""The mpi4py transport itself (``MPIGroup``) under a real ``mpiexec -n 2``: small messages,
batches and multi-megabyte transfers cross intact into receives posted first, a broadcast
crosses, a wait for nothing is bounded, a closed peer's goodbye ends receives from it, and
nothing stays inside MPI at the end."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import mpirun
import pytest
from mpirun import assert_gone, job_pids

from hpccollect.errors import CollectorTimeoutError
from hpccollect.transport.base import wait_request

JOB = Path(__file__).with_name("transport_job.py")


@pytest.mark.mpi
@pytest.mark.slow
@mpirun.needs()
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_mpich_segments_left")
def test_transfers_of_every_size_and_a_broadcast_cross_and_a_goodbye_ends_the_link(tmp_path):
    out = tmp_path / "out"
    code, output, seconds = mpirun.run(JOB, out, ranks=2, timeout=90)
    assert code == 0, output
    checks = ("ok a wait for nothing is bounded", "ok messages", "ok broadcast")
    for line in (*checks, "ok goodbye", "ok quiesced"):
        assert line in output, output
    assert len(job_pids(out)) == 2
    assert_gone(job_pids(out))
    assert seconds < 60, f"the job took {seconds:.1f} s"


@pytest.mark.timed
@pytest.mark.timeout(30)
def test_an_idle_wait_backs_off_to_its_limit_and_ends_soon_after_its_test_holds():
    """An idle wait sleeps growing up to ``max_sleep`` between tests (a blocking MPI call would
    spin a core), so it tests rarely, yet it sees its request done within that limit."""
    flag = threading.Event()
    looks = []

    def test() -> bool:
        looks.append(time.monotonic())
        return flag.is_set()

    timer = threading.Timer(1.0, flag.set)
    start = time.monotonic()
    timer.start()
    wait_request(test, 10.0, "a test", max_sleep=0.1, spin=0.0)
    took = time.monotonic() - start
    assert 1.0 <= took < 1.25, f"the wait ended {took:.2f} s after it began"
    gaps = [b - a for a, b in itertools.pairwise(looks)]
    assert max(gaps) > 0.08, "the wait never slept up to its limit"
    assert len(looks) < 40, f"the wait tested {len(looks)} times in a second"
    with pytest.raises(CollectorTimeoutError, match="a test did not complete within 0.2 s"):
        wait_request(lambda: False, 0.2, "a test", max_sleep=0.05)
