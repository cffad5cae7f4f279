"""Waits that a stop signal ends at once: the main thread's wait for its peers (in
``doorbell.ready``), cut short where the wait itself has taken nothing. What was taken before it
(a message in an inbox) stays where it is; a caller that held one puts it back (``WorkerPool``).

A job whose rank 0 takes only the ranks' reports (``collect --shards``) has nothing to finish
on rank 0 when SIGTERM comes: waiting for the next report (every ``--report-interval`` s) only
delays the shutdown that makes every rank close its shard. Open MPI's ``mpirun`` kills the
ranks half a second after a SIGTERM (``_signals.py``); with the wait cut short the shards are
closed within that time.

The app arms the cut around its wait (``cut_by``); its signal handler calls ``cut()``, which
raises the armed exception in the wait under way, or in the next one. Signal handlers run in the
main thread, so only the main thread's waits are cut.
"""

from __future__ import annotations

import contextlib
import select
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["cut", "cut_by", "poll"]


class _State:
    error: Callable[[], BaseException] | None = None  # armed: what a cut wait raises
    waiting = False  # the main thread is in ``poll``
    pending = False  # cut while not waiting: the next wait raises


_STATE = _State()


@contextlib.contextmanager
def cut_by(error: Callable[[], BaseException]) -> Iterator[None]:
    """Within: ``cut()`` ends the main thread's wait under way, or its next, with ``error()``.

    Args:
        error: makes the exception the cut wait raises (a ``BaseException`` that no
            ``except Exception`` on the way takes for the peers' failure).
    """
    try:
        _STATE.error, _STATE.pending = error, False
        yield
    finally:
        _STATE.error, _STATE.pending = None, False


def cut() -> None:
    """End the main thread's wait (see the module); nothing when no wait is armed. Called by a
    signal handler: it raises there when the main thread was waiting."""
    error = _STATE.error
    if error is None:
        return
    _STATE.pending = True
    if _STATE.waiting:
        _STATE.waiting = False
        raise error()


def poll(poller: select.poll, ms: int | None) -> list[tuple[int, int]]:
    """``poller.poll(ms)``, cut short as the module says when it runs in the main thread."""
    return _cut_short(poller.poll, ms)


def _cut_short(call: Callable[[Any], Any], arg: Any) -> Any:
    if _STATE.error is None or threading.current_thread() is not threading.main_thread():
        return call(arg)
    _STATE.waiting = True
    try:
        if _STATE.pending:
            raise _STATE.error()
        return call(arg)
    finally:
        _STATE.waiting = False
