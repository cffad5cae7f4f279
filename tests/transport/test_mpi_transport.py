"""The mpi4py transport itself (``MPIGroup``) under a real ``mpiexec -n 2``: small messages,
batches and multi-megabyte transfers cross intact into receives posted first, a broadcast
crosses, a wait for nothing is bounded, a closed peer's goodbye ends receives from it, and
nothing stays inside MPI at the end."""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path

import mpirun
import pytest
from mpirun import assert_gone, job_pids

from hpccollect.transport.mpi_waits import Pace, wait_request

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
def test_a_paced_wait_sleeps_up_to_its_limit_and_a_shorter_limit_applies_at_once():
    """A collector rank's weight thread waits paced by ``BUSY_SLEEP`` while the rank collects
    (each look takes the GIL from the collection); when the rank turns to wait for rank 0 the
    limit drops to ``IDLE_SLEEP`` at once, not after the sleep under way."""
    pace = Pace(0.5)
    flag = threading.Event()
    looks = []

    def test() -> bool:
        looks.append(time.monotonic())
        return flag.is_set()

    def later() -> None:
        time.sleep(1.2)
        pace.set(1e-3)  # the rank waits now: look often
        time.sleep(0.05)
        flag.set()

    helper = threading.Thread(target=later)
    start = time.monotonic()
    helper.start()
    wait_request(test, 10.0, "a test", max_sleep=pace, spin=0.0)
    helper.join()
    took = time.monotonic() - start
    assert 1.2 < took < 1.5, f"the wait ended {took:.2f} s after it began"
    slow = [b - a for a, b in itertools.pairwise(looks) if b < start + 1.2]
    assert max(slow) > 0.25, "the busy limit was not used"
    assert len([t for t in looks if t < start + 1.2]) < 20, "the wait looked too often"


@pytest.mark.timeout(30)
def test_an_abort_waits_until_the_launcher_has_read_what_this_process_wrote(monkeypatch):
    """``abort_job`` first lets the launcher read this process's stderr pipe (hydra dropped the
    message that said why the job ended); the wait ends once the pipe is empty, or is bounded
    when nobody reads it."""
    import fcntl
    import sys
    import termios

    from hpccollect.transport.mpi_job_end import _drain_output

    def unread(fd: int) -> int:
        count = bytearray(4)
        fcntl.ioctl(fd, termios.FIONREAD, count)
        return int.from_bytes(count, sys.byteorder)

    read_end, write_end = os.pipe()
    try:
        with os.fdopen(os.dup(write_end), "w") as stream:
            monkeypatch.setattr("sys.stderr", stream)
            stream.write("hpccollect: collector ranks [2] were lost\n")  # buffered: it flushes
            # the launcher comes late: an abort that did not wait would leave the line unread
            reader = threading.Timer(0.3, os.read, (read_end, 1 << 16))
            reader.start()
            _drain_output(timeout=10.0)
            assert unread(write_end) == 0
            reader.join(5)
            stream.write("nobody reads this\n")
            _drain_output(timeout=0.2)  # returns, bounded
            assert os.read(read_end, 1 << 16) == b"nobody reads this\n"
    finally:
        os.close(read_end)
        os.close(write_end)
