"""What must happen at exit, in order: what is still open (a collector, a worker pool) shuts
down, newest first, while its transport's groups are still open (a collector tells its ranks
to stop over them); then the transports close their groups. Layers above and the transports
register here, so the transport never reaches up into the collectors.

In an MPI job the exit handler of the job's end (``mpi_job_end``) runs both steps, then
finalises or aborts MPI. Elsewhere what is open is shut down by this module's own exit hooks:
Python's (registered after multiprocessing's, so it runs before multiprocessing joins its
children without a timeout) and, in a process multiprocessing started (which runs no
``atexit`` hook), a multiprocessing finaliser."""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing.util
import sys
import traceback
import weakref
from collections.abc import Callable
from typing import Protocol

__all__ = ["done_at_exit", "run_exit_steps", "shut_down_at_exit", "when_transports_close"]

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
    Called once, by the MPI job's exit handler."""
    shut_down_open()
    for fn in _CLOSE:
        with contextlib.suppress(Exception):
            fn()


atexit.register(shut_down_open)
multiprocessing.util.Finalize(None, shut_down_open, exitpriority=10)
