"""The local transport: ``PipeChannel``, a ``multiprocessing`` pipe to a worker process (batches
travel in shared memory the worker writes, ``collectors/workers/worker.py``), and its
``ProcessLife``."""

from __future__ import annotations

import contextlib
import signal
import socket
import weakref
from multiprocessing.connection import Connection, wait
from typing import Any

from hpccollect._compat import stop_fd_passing
from hpccollect.protocol import Message
from hpccollect.transport.base import Channel, PeerLife

__all__ = ["PipeChannel", "ProcessLife"]


class ProcessLife(PeerLife):
    """A ``multiprocessing`` process (or none: a worker's view of its collector, which it
    cannot watch): its sentinel tells its end at once; ``kill()`` SIGKILLs it."""

    def __init__(self, process: Any = None) -> None:
        self.process = process
        self.host = socket.gethostname()
        self._pid: int | None = None

    @property
    def pid(self) -> int | None:  # type: ignore[override]
        """Known once the process started; kept after it was closed."""
        if self._pid is None and self.process is not None:
            with contextlib.suppress(ValueError):  # closed before it started
                self._pid = self.process.pid
        return self._pid

    @property
    def sentinel(self) -> Any:  # type: ignore[override]
        return None if self.process is None or not _started(self.process) else self.process.sentinel

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

    def close(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ValueError):  # still running: closed when reaped
                self.process.close()


# open PipeChannels: sending shared tensors down one starts the stdlib's fd-passing thread,
# stopped when the last closes (nothing can fetch from it then)
_OPEN_PIPES: weakref.WeakSet = weakref.WeakSet()


class PipeChannel(Channel):
    """A ``multiprocessing`` pipe end; with ``process`` (the collector's side), the worker
    process at its other end (``ProcessLife``)."""

    local = True

    def __init__(self, conn: Connection, process: Any = None) -> None:
        self.conn, self.process = conn, process
        self.life = ProcessLife(process)
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

    def describe(self) -> str:
        return f"the worker process (pid {self.pid})"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.conn.close()
        self.life.close()
        _OPEN_PIPES.discard(self)
        if self.process is not None and not _OPEN_PIPES:
            stop_fd_passing()


def _started(process: Any) -> bool:
    """Whether ``process`` was started (its sentinel exists only then)."""
    try:
        return process.sentinel is not None
    except ValueError:  # not started, or closed
        return False
