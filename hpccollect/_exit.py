"""How a process that hpccollect runs ends: what is still open shuts down in order, an MPI job
finalises or aborts cleanly, and Python's last collections skip torch's objects.

**The exit steps.** What is still open (a collector, a worker pool) shuts down, newest first,
while its transport's groups are still open (a collector tells its ranks to stop over them);
then the transports close their groups (``when_transports_close``). Layers above and the
transports register here, so the transport never reaches up into the collectors. One handler
runs them at Python's exit (registered when this module is imported, after multiprocessing's,
so it runs before multiprocessing joins its children without a timeout); a process that
multiprocessing started runs no ``atexit`` hook, so a multiprocessing finaliser shuts down
what is open there.

**An MPI job's end.** ``finalize_before_teardown`` the usual way; when it cannot end so,
``abort_job`` (``MPI_Abort``, with what must happen first), and ``end_job_at_exit`` for a rank 0
whose collector ranks cannot be stopped one by one: the exit handler then aborts the job after
the steps above (found before the exit or during those steps), else MPI is finalised.

**Freezing.** When Python exits, its cyclic garbage collector runs several full collections over every
object still tracked; with torch and tensordict imported that takes about 0.4 s of CPU (a
full ``gc.collect()`` takes 80-90 ms with torch 2.13 and Python 3.11 on this project's 2-core
machine), a quarter of a short process's life. ``freeze_survivors`` collects once, so that the
garbage cycles of the run still have their finalizers run, then freezes what is left
(``gc.freeze``), so that the collections at exit skip it.

Three kinds of process call it, each once its work is done and its files are closed: the
command line after its command (``hpccollect.app.cli.run``), a Multi collector's worker at
the exit that follows its collector (an ``atexit`` hook: a spawned one exits through Python's
teardown; a forked one leaves through ``os._exit`` and skips both), and a submitit job's rank
after it served. A user's own script is never frozen. What freezing gives up: an object still reachable when it is called, in a cycle that
only the teardown of the modules breaks, no longer has its ``__del__`` run at exit, which
Python does not promise for objects alive at exit in any case.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import multiprocessing.util
import os
import sys
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from hpccollect._launchers import reap_after_abort

__all__ = [
    "abort_job",
    "done_at_exit",
    "end_job_at_exit",
    "end_job_now_if_left_running",
    "finalize_before_teardown",
    "freeze_survivors",
    "run_exit_steps",
    "shut_down_at_exit",
    "unlink_node_segment",
    "when_transports_close",
]

EXIT_TIMEOUT = 2.0  # s: what each object still open at exit gets to shut down

_OPEN: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # id -> object, oldest first
_CLOSE: list[Callable[[], None]] = []


class _ShutsDown(Protocol):
    def shutdown(self, timeout: float) -> None: ...


def shut_down_at_exit(obj: _ShutsDown) -> None:
    """Have ``obj.shutdown(timeout=EXIT_TIMEOUT)`` run at exit should it still be open then
    (held weakly: an object collected before is forgotten). Objects shut down newest first,
    so a collector stops before the worker pool it made."""
    _OPEN[id(obj)] = obj


def done_at_exit(obj: object) -> None:
    """``obj`` shut down: nothing is left to do for it at exit."""
    if _OPEN.get(id(obj)) is obj:
        del _OPEN[id(obj)]


def shut_down_open() -> None:
    """Shut down, newest first, what ``shut_down_at_exit`` holds and is still open (errors
    ignored). Run at exit by each of the hooks of the module's docstring; what one of them
    shut down, the next finds gone."""
    if _OPEN:
        _free_the_last_tracebacks_locals()
    for obj in reversed(list(_OPEN.values())):
        done_at_exit(obj)
        with contextlib.suppress(Exception):
            obj.shutdown(timeout=EXIT_TIMEOUT)


def _free_the_last_tracebacks_locals() -> None:
    """Drop the locals of the frames that the exception which ended the script keeps.

    Python keeps that exception (``sys.last_value``, with its traceback) until its teardown,
    after every exit hook, so the objects its frames hold outlive the groups closed here. A
    gloo work among them (a receive a Ctrl-C cut short, say) then drops gloo's context last,
    which shuts gloo's device down from inside the work's release; with a rank's socket at
    end-of-file that shutdown never returns, and the process hung at its exit. Dropped now,
    each such object goes while its group still holds the context. The traceback was printed
    already and stays; only its frames' locals go."""
    chain, seen = [getattr(sys, "last_value", None)], set()
    while chain:
        exc = chain.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        with contextlib.suppress(Exception):
            traceback.clear_frames(exc.__traceback__)
        chain += [exc.__cause__, exc.__context__]


def when_transports_close(fn: Callable[[], None]) -> Callable[[], None]:
    """Have ``fn`` close a transport's groups at exit, once what is open has shut down."""
    _CLOSE.append(fn)
    return fn


def run_exit_steps() -> None:
    """Shut down what is still open, then close the transports' groups (errors ignored).
    Called once, by the exit handler."""
    shut_down_open()
    for fn in _CLOSE:
        with contextlib.suppress(Exception):
            fn()


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


atexit.register(_end_at_exit)
multiprocessing.util.Finalize(None, shut_down_open, exitpriority=10)


def freeze_survivors() -> None:
    """Collect the garbage cycles, then leave every object alive out of later collections."""
    gc.collect()
    gc.freeze()
