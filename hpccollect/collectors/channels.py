"""How protocol messages travel between a collector and one worker: the ``Channel`` interface,
and ``PipeChannel`` for a local worker process (a ``Pipe`` plus the process's sentinel).

The pool (``pool.py``) and the worker loop (``worker.py``) only use this interface, so a
torch.distributed or MPI transport plugs in as another ``Channel``. Contract: ``send``/``recv``
raise ``ConnectionError`` when the peer is gone; ``handles()`` are objects that
``multiprocessing.connection.wait`` accepts and that become ready when a message arrives or the
peer ends (a transport without such objects gives a pipe its receiving thread writes to).
"""

from __future__ import annotations

import abc
import contextlib
import signal
import socket
import time
import weakref
from collections.abc import Sequence
from multiprocessing import resource_sharer
from multiprocessing.connection import Connection, wait
from typing import Any

from hpccollect.protocol import Message

__all__ = ["Channel", "PipeChannel", "wait_ready"]


class Channel(abc.ABC):
    """One end of a message link to a peer (a worker, or the collector seen from a worker).

    Attributes:
        host: the peer's host as far as this side knows it.
        local: whether the peer shares this machine's memory (``Command.local_only`` needs it).
        pid: the peer's process id when it is a local process, else None.
    """

    host: str = ""
    local: bool = False
    #: its messages are seen by ``poll`` only, not by waiting on ``handles()`` (which then
    #: tell only the peer's end and wake-ups)
    polled: bool = False
    pid: int | None = None
    rank: int | None = None  # the peer's torch.distributed rank, for a collector rank

    @abc.abstractmethod
    def send(self, message: Message) -> None:
        """Send one message; ``ConnectionError`` when the peer is gone."""

    @abc.abstractmethod
    def poll(self, timeout: float) -> bool:
        """Whether ``recv()`` can return (a message, or the peer's end) within ``timeout`` s."""

    @abc.abstractmethod
    def recv(self) -> Message:
        """The next message; ``ConnectionError`` when the peer is gone."""

    @abc.abstractmethod
    def handles(self) -> list[Any]:
        """What ``multiprocessing.connection.wait`` watches for this channel."""

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

    @abc.abstractmethod
    def close(self) -> None:
        """Release this end; idempotent."""

    def describe(self) -> str:
        """The peer, for messages."""
        return f"the worker (pid {self.pid})" if self.pid is not None else "the worker"

    def batch_buffers(self, batch: Any) -> Any:
        """Where a worker's batches should be written: ``batch`` itself (the collector's own
        buffers), or buffers laid out the same in this channel's memory, sent without a copy."""
        return batch

    def weights_buffer(self, policy: Any) -> Any:
        """On a worker given no weights buffer: the one ``UPDATE_WEIGHTS`` loads, which this
        channel fills when weights arrive; None when the transport passes none."""
        return None


def wait_ready(channels: Sequence[Channel], timeout: float) -> list[Channel]:
    """The channels of ``channels`` with something to receive within ``timeout`` s (maybe none).
    Polled channels are polled in turn with the others' handles, sleeping between rounds from
    20 us up to 1 ms (the latency an idle wait adds)."""
    owners = {}
    for channel in channels:
        for handle in channel.handles():
            owners[id(handle)] = channel
    polled = [c for c in channels if c.polled]
    handles = [h for c in channels if not c.polled for h in c.handles()]
    deadline = time.monotonic() + timeout
    sleep = 20e-6
    while True:
        seen = {id(c): c for c in polled if c.poll(0)}
        remaining = 0.0 if seen else max(0.0, deadline - time.monotonic())
        for handle in wait(handles, min(remaining, sleep) if polled else remaining):
            seen[id(owners[id(handle)])] = owners[id(handle)]
        if seen or not polled or time.monotonic() >= deadline:
            return [c for c in channels if id(c) in seen]
        sleep = min(2 * sleep, 1e-3)


# open PipeChannels: sending shared tensors down a pipe starts the stdlib's fd-passing thread in
# this process; when the last channel closes, nothing can fetch from it any more and it is stopped
_OPEN_PIPES: weakref.WeakSet = weakref.WeakSet()


class PipeChannel(Channel):
    """A ``multiprocessing`` pipe end; with ``process`` (the collector's side), the worker
    process whose sentinel tells its death at once, and which ``kill()`` SIGKILLs."""

    local = True

    def __init__(self, conn: Connection, process: Any = None) -> None:
        self.conn, self.process = conn, process
        self.host = socket.gethostname()
        self.pid = None if process is None else process.pid
        self._closed = False
        _OPEN_PIPES.add(self)

    def send(self, message: Message) -> None:
        try:
            self.conn.send(message)
        except (BrokenPipeError, ConnectionResetError, OSError) as err:
            raise ConnectionError(str(err)) from err

    def poll(self, timeout: float) -> bool:
        return bool(wait(self.handles(), max(0.0, timeout)))

    def recv(self) -> Message:
        # the sentinel may be what woke the caller: do not block on a pipe nobody writes to
        if self.process is not None and not self.conn.poll() and not self.process.is_alive():
            raise ConnectionError("the worker process ended")
        try:
            return self.conn.recv()
        except (EOFError, OSError) as err:
            raise ConnectionError(str(err) or "the pipe was closed") from err

    def handles(self) -> list[Any]:
        return [self.conn] if self.process is None else [self.conn, self.process.sentinel]

    @property
    def sentinel(self) -> Any:
        """What ``wait`` sees become ready when the process ends (None without a process)."""
        return None if self.process is None else self.process.sentinel

    def death(self, wait: float = 0.0) -> str | None:
        if self.process is None or not _started(self.process):
            return None
        self.process.join(wait)
        code = self.process.exitcode
        if code is None:
            return None
        if code < 0:
            return f"was killed by signal {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def join(self, timeout: float) -> bool:
        if self.process is None or not _started(self.process):
            return True
        self.process.join(max(0.0, timeout))
        return self.process.exitcode is not None

    def kill(self) -> None:
        """SIGKILL the process if it still runs (it ignores SIGTERM), and reap it (bounded)."""
        if self.process is None or not _started(self.process):
            return
        if self.process.is_alive():
            with contextlib.suppress(OSError):
                self.process.kill()
        self.process.join(5)

    def describe(self) -> str:
        return f"the worker process (pid {self.pid})"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.conn.close()
        if self.process is not None:
            with contextlib.suppress(ValueError):  # still running: closed when reaped
                self.process.close()
        _OPEN_PIPES.discard(self)
        if self.process is not None and not _OPEN_PIPES:
            resource_sharer.stop(timeout=1)


def _started(process: Any) -> bool:
    return getattr(process, "_popen", None) is not None
