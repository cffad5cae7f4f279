"""The transport contracts: ``Channel`` (protocol messages to one worker or rank), ``PeerLife``
(the peer's process: whether it lives, how it ended, ending it) and ``ProcessGroup``/``Work``
(the part of torch's process-group API every backend offers). ``send``/``recv`` raise
``ConnectionError`` when the peer is gone; ``handles()`` are objects that
``multiprocessing.connection.wait`` accepts, ready when a message arrives or the peer ends.

The waits: ``wait_ready`` (channels and their peers' processes in one ``poll``) and
``wait_request`` (a non-blocking transfer). A stop signal ends the main thread's ``poll`` at
once (``cut_wait``; what was taken before stays where it is): Open MPI's ``mpirun`` kills the
ranks half a second after SIGTERM, and a ``collect --shards`` job closes its shards in that time.
"""

from __future__ import annotations

import abc
import contextlib
import datetime
import math
import select
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hpccollect.errors import CollectorTimeoutError

if TYPE_CHECKING:  # not at run time: the command line's checks wait for nothing of torch's
    import torch

    from hpccollect.protocol import Message

__all__ = [
    "Channel",
    "PeerLife",
    "ProcessGroup",
    "Work",
    "cut_wait",
    "cut_waits_by",
    "ready",
    "wait_ready",
    "wait_request",
]


class Work(Protocol):
    """A transfer under way."""

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Block until it is done (``timeout``: raise when it is not done by then)."""


class ProcessGroup(Protocol):
    """What a backend's process group offers (torch's ``ProcessGroupGloo`` as it is): tagged
    point-to-point transfers, a broadcast, and an abort that ends every pending transfer."""

    def send(self, tensors: Sequence[torch.Tensor], peer: int, tag: int) -> Work: ...

    def recv(self, tensors: Sequence[torch.Tensor], peer: int, tag: int) -> Work: ...

    def broadcast(self, tensor: Any, root: int) -> Work: ...

    def abort(self) -> None: ...


class PeerLife(abc.ABC):
    """A peer's process as this side can watch and end it: a local worker, a rank a launcher
    started, or a rank known only through its connection.

    Attributes:
        host: the peer's host as far as this side knows it.
        pid: its process id when known, else None.
        sentinel: what ``multiprocessing.connection.wait`` sees ready when it ends, or None.
        where: where to look for it besides host and pid (a scheduler's job and log), or "".
        can_end: whether ``kill`` ends it (False: only its connection is known).
    """

    host: str = ""
    pid: int | None = None
    sentinel: Any = None
    where: str = ""
    can_end: bool = True

    @abc.abstractmethod
    def death(self, wait: float = 0.0) -> str | None:
        """None while the peer lives, else how it ended ("was killed by signal SIGKILL"),
        waiting up to ``wait`` s for an end under way."""

    @abc.abstractmethod
    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the peer to end; whether it has."""

    @abc.abstractmethod
    def kill(self) -> None:
        """End the peer now if this side can (bounded); a no-op otherwise."""

    def close(self) -> None:
        """Release what watching the peer holds; idempotent."""
        return None


class Channel(abc.ABC):
    """One end of a message link to a peer; ``life`` is the peer's process.

    Attributes:
        local: whether the peer shares this machine's memory (``Command.local_only`` needs it).
        rank: the peer's rank, for a collector rank.
    """

    local: bool = False
    polled: bool = False  # messages may wait in an inbox: see ``pending()`` before ``handles``
    rank: int | None = None
    life: PeerLife

    @abc.abstractmethod
    def send(self, message: Message) -> None:
        """Send one message; ``ConnectionError`` when the peer is gone."""

    @abc.abstractmethod
    def poll(self, timeout: float) -> bool:
        """Whether ``recv()`` can return (a message, or the peer's end) within ``timeout`` s."""

    def pending(self) -> bool:
        """Whether ``recv()`` returns at once: a ``polled`` channel's inbox holds something."""
        return False

    @abc.abstractmethod
    def recv(self) -> Message:
        """The next message; ``ConnectionError`` when the peer is gone."""

    @abc.abstractmethod
    def handles(self) -> list[Any]:
        """What ``multiprocessing.connection.wait`` watches for this channel."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release this end (and what watching the peer holds); idempotent."""

    @property
    def pid(self) -> int | None:
        """The peer's process id when known."""
        return self.life.pid

    @property
    def host(self) -> str:
        """The peer's host as far as this side knows it."""
        return self.life.host

    def silence(self) -> str | None:
        """Why the peer counts as lost though its connection is open (silent too long), or
        None (always, where the transport watches the peer's process instead)."""
        return None

    def describe(self) -> str:
        """The peer, for messages."""
        return f"the worker (pid {self.pid})" if self.pid is not None else "the worker"

    def batch_buffers(self, batch: Any) -> Any:
        """Where a worker's batches should be written: ``batch`` itself, or buffers laid out
        the same in this channel's memory, sent without a copy."""
        return batch

    def report_buffers(self, report: Any) -> Any:
        """Where a worker's reports (``reports.py``) should be written: as ``batch_buffers``,
        or buffers whose bytes travel in the report's control message."""
        return self.batch_buffers(report)

    def latest(self, batch: Any) -> Any:
        """The peer's last batch (``batch``: the buffers it announced and arrives in here)."""
        return batch

    def own(self, batch: Any) -> Any:
        """The peer's last batch (``batch``: as for ``latest``) for the caller to keep: here a
        copy, as the next batch arrives in the same buffers."""
        return batch.clone()

    def weights_buffer(self, policy: Any) -> Any:
        """On a worker given no weights buffer: the one this channel fills for
        ``UPDATE_WEIGHTS`` to load; None when the transport passes none."""
        return None


def wait_ready(channels: Sequence[Channel], timeout: float) -> list[Channel]:
    """The channels with something to receive (a message, or the peer's end) within ``timeout``
    s, maybe none, watched in one ``poll``; a heartbeat alone is waited past."""
    deadline = time.monotonic() + timeout
    while True:
        found = [c for c in channels if c.polled and c.pending()]
        if found:
            return found
        owners: dict[int, Channel] = {}
        handles = []
        for channel in channels:
            for handle in channel.handles():
                owners[id(handle)] = channel
                handles.append(handle)
        woke = ready(handles, max(0.0, deadline - time.monotonic()))
        ended = {id(owners[id(h)]) for h in woke if h is owners[id(h)].life.sentinel}
        seen = {id(owners[id(h)]) for h in woke}
        found = [
            c for c in channels if id(c) in seen and (not c.polled or id(c) in ended or c.poll(0))
        ]
        if found or time.monotonic() >= deadline:
            return found


def ready(handles: Sequence[Any], timeout: float | None) -> list[Any]:
    """``multiprocessing.connection.wait(handles, timeout)`` on Linux, except that a stop signal
    may cut the main thread's wait short (``cut_wait``)."""
    poller = select.poll()
    by_fd: dict[int, Any] = {}
    for handle in handles:
        fd = handle if isinstance(handle, int) else handle.fileno()
        by_fd[fd] = handle
        poller.register(fd, select.POLLIN)
    ms = None if timeout is None else math.ceil(max(0.0, timeout) * 1e3)
    return [by_fd[fd] for fd, _ in _cut_short(poller.poll, ms)]


class _Cut:
    error: Callable[[], BaseException] | None = None  # armed: what a cut wait raises
    waiting = False  # the main thread is in ``ready``'s poll
    pending = False  # cut while not waiting: the next wait raises


_CUT = _Cut()


@contextlib.contextmanager
def cut_waits_by(error: Callable[[], BaseException]) -> Iterator[None]:
    """Within: ``cut_wait()`` ends the main thread's wait in ``ready`` (or its next) by ``error()``.

    Args:
        error: makes the exception the cut wait raises (a ``BaseException``, so that no
            ``except Exception`` on the way takes it for the peers' failure).
    """
    try:
        _CUT.error, _CUT.pending = error, False
        yield
    finally:
        _CUT.error, _CUT.pending = None, False


def cut_wait() -> None:
    """End the main thread's armed wait (``cut_waits_by``), from a signal handler: it raises
    there when the main thread was waiting."""
    error = _CUT.error
    if error is None:
        return
    _CUT.pending = True
    if _CUT.waiting:
        _CUT.waiting = False
        raise error()


def _cut_short(call: Callable[[Any], Any], arg: Any) -> Any:
    if _CUT.error is None or threading.current_thread() is not threading.main_thread():
        return call(arg)
    _CUT.waiting = True
    try:
        if _CUT.pending:
            raise _CUT.error()
        return call(arg)
    finally:
        _CUT.waiting = False


IDLE_SLEEP = 1e-3  # s: the longest sleep between two tests of a request (the added latency)
SPIN = 200e-6  # s a wait tests without sleeping first: a message in flight completes in them


def wait_request(
    test: Callable[[], bool],
    timeout: float | None,
    what: str | Callable[[], str],
    stop: Callable[[], str | None] = lambda: None,
    max_sleep: float = IDLE_SLEEP,
    spin: float = SPIN,
) -> None:
    """Wait until ``test()`` is true: tests for ``spin`` s, then sleeps growing up to
    ``max_sleep`` between tests.

    Args:
        test: whether the awaited thing is done (a request's ``Test``).
        timeout: s until ``CollectorTimeoutError`` (None: no limit).
        what: names the operation for that error (or makes its name: called only then).
        stop: gives a reason to give up (``RuntimeError``), asked once spinning is over.
        max_sleep: the longest sleep between two tests.
        spin: s of tests without sleeping first.
    """
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
        time.sleep(sleep)
        sleep = min(sleep * 2, max_sleep)
