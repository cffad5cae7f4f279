"""Waiting on MPI without blocking inside it: MPICH's blocking calls spin a whole core while
they wait, which a rank sharing a node with collector ranks would steal from them. A wait tests
its request, spinning for a moment (a message in flight completes within it), then sleeping
with a growing back-off; a ``Pace`` lets another thread change that back-off's limit at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from hpccollect.errors import CollectorTimeoutError

__all__ = [
    "BUSY_SLEEP",
    "IDLE_SLEEP",
    "SPIN",
    "Pace",
    "recv_object",
    "send_object",
    "wait_request",
]

IDLE_SLEEP = 1e-3  # the longest sleep between two tests of a request (the added latency)
#: ... for a collector rank's weight thread while the rank collects: each wake-up takes the GIL
#: from the collecting thread, which at 1 kHz cost a CartPole rank 15-20% of its frames; at
#: 10 ms a weight update waits about 18 ms for the ranks to join its broadcast
BUSY_SLEEP = 10e-3
#: seconds a wait tests without sleeping first: a message in flight (a batch streaming in, the
#: other half of a rendezvous) completes within them, and both ends must be inside MPI for it
#: to move; an idle wait spins once, then sleeps
SPIN = 200e-6


class Pace:
    """The longest sleep of a group's idle waits, ``limit``; ``set`` changes it at any time and
    wakes a wait that sleeps now, so a shorter limit applies at once."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self._wake = threading.Event()

    def set(self, limit: float) -> None:
        if limit != self.limit:
            self.limit = limit
            self._wake.set()

    def sleep(self, seconds: float) -> None:
        if self._wake.wait(seconds):
            self._wake.clear()


def wait_request(
    test: Callable[[], bool],
    timeout: float | None,
    what: str | Callable[[], str],
    stop: Callable[[], str | None] = lambda: None,
    max_sleep: float | Pace = IDLE_SLEEP,
    spin: float = SPIN,
) -> None:
    """Wait until ``test()`` is true: tests for ``spin`` s, then sleeps growing up to
    ``max_sleep`` (or a ``Pace``'s limit of the moment) between tests; ``RuntimeError`` when
    ``stop()`` gives a reason (asked only once spinning is over), ``CollectorTimeoutError``
    after ``timeout`` s (None: no limit). ``what`` names the operation (or makes its name:
    called only for that error)."""
    start = time.monotonic()
    spin_end = start + spin
    while not test():
        if time.monotonic() > spin_end:
            break
    else:
        return
    deadline = None if timeout is None else start + timeout
    sleep = 20e-6
    while not test():
        why = stop()
        if why is not None:
            if test():  # what the peer sent before it said goodbye still counts
                return
            raise RuntimeError(why)
        if deadline is not None and time.monotonic() > deadline:
            name = what if isinstance(what, str) else what()
            raise CollectorTimeoutError(f"{name} did not complete within {timeout:g} s")
        if isinstance(max_sleep, Pace):
            max_sleep.sleep(sleep)
            sleep = min(sleep * 2, max_sleep.limit)
        else:
            time.sleep(sleep)
            sleep = min(sleep * 2, max_sleep)


def send_object(
    comm: Any, value: Any, dest: int, tag: int, timeout: float, what: str, max_sleep: float
) -> None:
    """Send a small pickled message; wait for it with sleeps (a blocking send may spin)."""
    request = comm.isend(value, dest=dest, tag=tag)
    wait_request(lambda: request.Test(), timeout, what, max_sleep=max_sleep)


def recv_object(
    comm: Any, source: int, tag: int, timeout: float, what: str, max_sleep: float
) -> Any:
    """Receive a small pickled message, probing with sleeps: a blocking receive spins a core
    that the ranks on this node need."""
    wait_request(lambda: comm.Iprobe(source, tag), timeout, what, max_sleep=max_sleep)
    return comm.recv(source=source, tag=tag)
