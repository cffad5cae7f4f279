"""How an MPI job ends: ``finalize_before_teardown`` the usual way; when it cannot end so,
``abort_job`` (``MPI_Abort``, with what must happen first), and ``end_job_at_exit`` for a rank 0
whose collector ranks cannot be stopped one by one.

At Python's exit one handler (``_end_at_exit``, registered when this module is imported, so
before any the user registers after importing hpccollect, and run after them) does it in
order: live collectors tell their ranks to stop, the transports close their groups
(``at_exit``), then the job is aborted if collector ranks were left running (found before the
exit or during those steps), else MPI is finalised."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from hpccollect._launchers import reap_after_abort
from hpccollect.transport.at_exit import run_exit_steps

__all__ = [
    "abort_job",
    "end_job_at_exit",
    "end_job_now_if_left_running",
    "finalize_before_teardown",
    "unlink_node_segment",
]

_DRAIN = 2.0  # s an abort waits at most for the launcher to read this process's output
#: collector ranks that did not stop, the job ends at exit: whether each was known lost
_ABORTING: dict[int, bool] = {}


def unlink_node_segment() -> None:
    """Unlink the shared-memory segment MPICH made for this node's ranks: every rank of the
    node has mapped it once MPI is initialised, and MPICH unlinks it only in ``MPI_Finalize``,
    so a job that ends otherwise (an abort, a rank killed on another node) would leave it in
    /dev/shm. The mappings live on; only the name goes."""
    mapped: set[bytes] = set()
    # read as bytes: another mapped file's path may be any bytes, UTF-8 or not
    with contextlib.suppress(OSError), open("/proc/self/maps", "rb") as maps:
        mapped = {line.split()[-1] for line in maps if b"/dev/shm/mpich_shm_" in line}
    for path in mapped:
        with contextlib.suppress(OSError):
            os.unlink(path)


def finalize_before_teardown() -> None:
    """Finalise MPI now, at Python's exit (an ``atexit`` hook), if it is initialised and not
    finalised yet, rather than where mpi4py would: after Python's teardown.

    The collector ranks that have finished wait inside ``MPI_Finalize`` until rank 0 finalises
    too, and under Intel MPI that wait spins a whole core each. Rank 0's teardown (the
    collection of every module's objects: torch's are many) then runs on what they leave of
    the node's cores: under Intel MPI on 2 cores, 2 collector ranks kept rank 0 from its
    finalise for 5 to 16 s after a run that had ended, in 5 of 25 runs; the job now ends
    about a second after its stop (``benchmarks/job_end.py``)."""
    if "mpi4py.MPI" not in sys.modules:
        return
    from mpi4py import MPI

    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    MPI.Finalize()


def abort_job(comm: Any, code: int) -> None:
    """End every rank of the MPI job with ``code`` (``MPI_Abort``), leaving no shared-memory
    segment (see ``unlink_node_segment``), once the launcher has taken what this process
    wrote (see ``_drain_output``), and with a reaper for a launcher the abort could leave
    stuck (``hpccollect._launchers``)."""
    unlink_node_segment()
    _drain_output()
    reap_after_abort()
    comm.Abort(code)


def _drain_output(timeout: float = _DRAIN) -> None:
    """Flush stdout and stderr, and wait (bounded) until the launcher's proxy has read them
    from their pipes. The proxy forwards what it read before it handles the abort; what is
    still in a pipe when the job is torn down is lost (a message that says why the job ended,
    then nothing: seen under hydra)."""
    import fcntl
    import stat
    import termios

    waiting = []
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
            fd = stream.fileno()
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                waiting.append(fd)
    unread = bytearray(4)
    deadline = time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            # FIONREAD on either end of a pipe: the bytes still in it
            fcntl.ioctl(waiting[0], termios.FIONREAD, unread)
            if int.from_bytes(unread, sys.byteorder) > 0:
                time.sleep(1e-3)
                continue
        waiting.pop(0)


def end_job_at_exit(ranks: Sequence[int], lost: bool) -> None:
    """End the MPI job when this process (rank 0) exits, for collector ranks still running
    that MPI cannot end one by one and ``MPI_Finalize`` would wait for forever. ``lost``: the
    collector knew them lost (silent, let go) and finished without them: the job ends with
    status 0; else they did not stop when asked, status 1. It may be called from the exit
    handler itself (a collector it shuts down finds them): the abort comes after."""
    for rank in ranks:  # a rank the collector knew lost is one, whoever saw it stuck first
        _ABORTING[rank] = _ABORTING.get(rank, False) or lost


def end_job_now_if_left_running() -> None:
    """End the job now if collector ranks were left running (``end_job_at_exit``): for a
    gatherer, which leaves through ``MPI_Finalize`` and C's ``exit``, not Python's exit
    handlers, and whose finalize would wait for those ranks forever."""
    if _ABORTING:
        _abort()


@atexit.register
def _end_at_exit() -> None:
    """At Python's exit: the steps of the module's docstring. Ranks already known to be left
    running are not waited for: the abort ends them, and every group with them."""
    if not _ABORTING:
        run_exit_steps()
    if _ABORTING:
        _abort()
    finalize_before_teardown()


def _abort() -> None:
    ranks = sorted(_ABORTING)
    if all(_ABORTING.values()):
        why, code = "were lost and cannot be stopped from here; ending the MPI job", 0
    else:
        why, code = "did not stop when asked; aborting the MPI job so that it ends", 1
    sys.stderr.write(f"hpccollect: collector ranks {ranks} {why}.\n")
    sys.stderr.flush()
    from mpi4py import MPI

    # on the world: an abort on a group's duplicate of it ends the job "killed by signal 9"
    # (the ranks are numbered alike in both)
    abort_job(MPI.COMM_WORLD, code)
