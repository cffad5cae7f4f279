"""``app/signals.py``: which stop signals end rank 0's wait for the next batch at once (real
signals to this process, in a wait of ``transport.base.ready``)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import pytest

from hpccollect._signals import killed_soon_after
from hpccollect.app.signals import StopSignals, WaitCut
from hpccollect.transport.base import ready

#: some of what Open MPI 5's mpirun sets in a rank; a rank of an srun step is started by
#: slurmstepd, not by PRRTE, so has no PRTE_LAUNCHED
UNDER_OPEN_MPI = {"PRTE_LAUNCHED": "1", "OMPI_COMM_WORLD_SIZE": "3", "PMIX_RANK": "0"}


def test_only_open_mpis_sigterm_is_followed_by_a_kill_too_soon_to_wait():
    assert killed_soon_after(signal.SIGTERM, UNDER_OPEN_MPI)
    assert not killed_soon_after(signal.SIGUSR1, UNDER_OPEN_MPI)  # passed on as it is
    assert not killed_soon_after(signal.SIGINT, UNDER_OPEN_MPI)
    assert not killed_soon_after(signal.SIGTERM, {"PMI_SIZE": "3", "PMI_RANK": "0"})  # MPICH
    assert not killed_soon_after(signal.SIGTERM, {"SLURM_STEP_ID": "0", "PMIX_RANK": "0"})
    assert not killed_soon_after(signal.SIGTERM, {})


def waited(stop: StopSignals, signum: int) -> tuple[bool, float]:
    """Send ``signum`` to this process 0.2 s into an armed 3 s wait: whether the wait was cut,
    and how long it took."""
    bell, write_end = os.pipe()  # nobody writes to it
    start = time.monotonic()
    cut = False
    try:
        with stop.installed():
            stop.collecting = True
            try:
                with stop.cutting_waits():
                    timer = threading.Timer(0.2, os.kill, (os.getpid(), signum))
                    timer.start()  # armed first: a slow start cannot make the signal early
                    ready([bell], 3.0)
            except WaitCut:
                cut = True
            timer.join()
    finally:
        os.close(bell)
        os.close(write_end)
    return cut, time.monotonic() - start


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("cut_always", "signum", "environ", "cuts"),
    [
        (False, signal.SIGUSR1, UNDER_OPEN_MPI, False),  # the batch under way is waited for
        (False, signal.SIGTERM, {}, False),
        (False, signal.SIGTERM, UNDER_OPEN_MPI, True),  # Open MPI kills 0.25 s later
        (True, signal.SIGUSR1, {}, True),  # rank 0 takes reports: nothing to wait for
    ],
    ids=["sigusr1-open-mpi", "sigterm-elsewhere", "sigterm-open-mpi", "reports"],
)
def test_a_stop_signal_cuts_the_wait_only_where_it_cannot_wait_for_the_batch(
    monkeypatch, cut_always, signum, environ, cuts
):
    for name in [*UNDER_OPEN_MPI, "PMI_SIZE"]:
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    stop = StopSignals(cut_always=cut_always)
    cut, took = waited(stop, signum)
    assert stop.signal == signal.Signals(signum).name
    assert cut == cuts
    assert took < 2.5 if cuts else took >= 2.9  # cut 0.2 s in, or the whole 3 s wait
    with pytest.raises(WaitCut) if cuts else contextlib.nullcontext(), stop.cutting_waits():
        pass  # a later wait: cut at once where the signal cut, else not
