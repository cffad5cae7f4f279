"""The transport contracts: ``Channel`` (protocol messages between a collector and one worker
or rank, messages only), ``PeerLife`` (the peer's process: whether it lives, how it ended, ending
it), and ``ProcessGroup``/``Work`` (the part of torch's process-group API the rank channels use,
which every registered backend offers, ``backends.py``). ``pipe.py`` has the local channel
(a ``multiprocessing`` pipe, the worker process as its peer).

The waits: ``wait_ready`` (a caller's channels, with their peers' processes, in one ``poll``)
and ``wait_request`` (a non-blocking transfer tested with a growing sleep in between). A stop
signal ends the main thread's ``poll`` at once (``cut_waits_by``/``cut_wait``): a job whose
rank 0 takes only the ranks' reports (``collect --shards``) has nothing to finish when SIGTERM
comes, and Open MPI's ``mpirun`` kills the ranks half a second after it (``_signals.py``);
with the wait cut short every rank closes its shard within that time. What was taken before
the wait (a message in an inbox) stays where it is.

The pool (``collectors/workers/pool.py``) and the worker loop (``collectors/workers/worker.py``) use only these
interfaces. Contract: ``send``/``recv`` raise ``ConnectionError`` when the peer is gone;
``handles()`` are objects that ``multiprocessing.connection.wait`` accepts and that become ready
when a message arrives or the peer ends.
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
    """What a backend's process group offers the rank channels and the weight sender: tagged
    point-to-point transfers and a broadcast of preallocated tensors, and an abort that ends
    every transfer still pending (torch's ``ProcessGroupGloo`` is one as it is)."""

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
        sentinel: what ``multiprocessing.connection.wait`` sees become ready when it ends, or
            None (its connection closing tells instead).
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
        """None while the peer lives; otherwise how it ended ("was killed by signal SIGKILL"),
        waiting up to ``wait`` s for an end that is under way."""

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
    """One end of a message link to a peer (a worker, or the collector seen from a worker);
    ``life`` is the peer's process.

    Attributes:
        local: whether the peer shares this machine's memory (``Command.local_only`` needs it).
        rank: the peer's rank, for a collector rank.
    """

    local: bool = False
    #: its messages may wait in an inbox of its own, read from its connection by ``poll`` or
    #: by a thread: waiters look at ``pending()`` first (its ``handles`` tell only that
    #: something came on the connection, or that the peer ended)
    polled: bool = False
    rank: int | None = None
    life: PeerLife

    @abc.abstractmethod
    def send(self, message: Message) -> None:
        """Send one message; ``ConnectionError`` when the peer is gone."""

    @abc.abstractmethod
    def poll(self, timeout: float) -> bool:
        """Whether ``recv()`` can return (a message, or the peer's end) within ``timeout`` s."""

    def pending(self) -> bool:
        """Whether ``recv()`` returns at once without a look at the connection (a
        ``polled`` channel's inbox holds something)."""
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
        """Why the peer counts as lost though its connection is open (it has sent nothing,
        not even a heartbeat, for too long), or None; None too where the transport watches the
        peer's process instead (a local pipe)."""
        return None

    def describe(self) -> str:
        """The peer, for messages."""
        return f"the worker (pid {self.pid})" if self.pid is not None else "the worker"

    def batch_buffers(self, batch: Any) -> Any:
        """Where a worker's batches should be written: ``batch`` itself (the collector's own
        buffers), or buffers laid out the same in this channel's memory, sent without a copy."""
        return batch

    def report_buffers(self, report: Any) -> Any:
        """Where a worker's reports should be written (``reports.py``: a small message of one
        fixed layout, sent instead of its batches): as ``batch_buffers``, or buffers whose
        bytes travel with the report's announcement, a control message like any other."""
        return self.batch_buffers(report)

    def latest(self, batch: Any) -> Any:
        """The peer's last batch, ``batch`` being the buffers it announced: those buffers
        themselves, where every batch arrives in them."""
        return batch

    def own(self, batch: Any) -> Any:
        """The peer's last batch (``batch``: as for ``latest``) for the caller to keep: a copy,
        where the next batch arrives in the same buffers."""
        return batch.clone()

    def weights_buffer(self, policy: Any) -> Any:
        """On a worker given no weights buffer: the one ``UPDATE_WEIGHTS`` loads, which this
        channel fills when weights arrive; None when the transport passes none."""
        return None


def wait_ready(channels: Sequence[Channel], timeout: float) -> list[Channel]:
    """The channels of ``channels`` with something to receive within ``timeout`` s (maybe none).

    A channel whose messages may wait in an inbox (``polled``) is ready at once when
    ``pending()`` says so; otherwise every channel's handles (its connection, its peer's
    process) are watched in one ``poll``, which a stop signal may cut short (``cut_wait``). A
    channel whose connection woke is ready when ``poll(0)`` says so (a heartbeat alone is
    taken and waited past); one whose peer's process ended is ready (``recv`` says how)."""
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
    """Those of ``handles`` (file descriptors, or objects with ``fileno()``: connections,
    process sentinels, pipes) ready to read or closed, within ``timeout`` s (None: no limit).

    What ``multiprocessing.connection.wait`` does on Linux, in one ``poll`` object; a stop
    signal may cut the main thread's wait short (``cut_wait``)."""
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
    """Within: ``cut_wait()`` ends the main thread's wait in ``ready`` under way, or its next,
    with ``error()``.

    Args:
        error: makes the exception the cut wait raises (a ``BaseException`` that no
            ``except Exception`` on the way takes for the peers' failure).
    """
    try:
        _CUT.error, _CUT.pending = error, False
        yield
    finally:
        _CUT.error, _CUT.pending = None, False


def cut_wait() -> None:
    """End the main thread's armed wait (see ``cut_waits_by``); nothing when none is armed.
    Called by a signal handler (signal handlers run in the main thread): it raises there when
    the main thread was waiting."""
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
#: s a wait tests without sleeping first: a message in flight (a batch streaming in, the other
#: half of a rendezvous) completes within them; over MPI both ends must be inside MPI for it to
#: move. An idle wait spins once, then sleeps: MPICH's blocking calls would spin a core the
#: ranks on the node need.
SPIN = 200e-6


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
