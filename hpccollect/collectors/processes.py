"""Worker processes for multi-process collectors: start, talk, notice death, stop.

Every wait is bounded and also watches each worker's process sentinel, so a worker that dies
(an exception, a segfault, ``kill -9``) is reported at once as a ``WorkerError`` instead of
being waited on. Nothing here knows what the workers compute.

Workers ignore SIGTERM and SIGINT: a batch scheduler signals every process of a job, and the
stop belongs to the parent, which then sends ``SHUTDOWN``. A worker that does not obey in time
is killed (SIGKILL, since SIGTERM is ignored); one that never answered yet, or stopped answering,
is killed at once. Workers exit by themselves when the parent's end of their pipe closes.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import signal
import socket
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing import resource_sharer
from multiprocessing.connection import Connection, wait
from typing import Any

from hpccollect.collectors.messages import Command, Reply
from hpccollect.errors import ArgumentValueError, CollectorTimeoutError, WorkerError

__all__ = ["WorkerPool", "clean_env"]

#: Environment variables a worker must not inherit: it would believe it is an MPI rank or a
#: SLURM step of its own and, for instance, call MPI_Init against the parent's launcher.
LAUNCHER_PREFIXES = (
    "OMPI_",
    "PMI_",
    "PMIX_",
    "MPI_",
    "MPICH_",
    "HYDRA_",
    "I_MPI_",
    "MV2_",
    "SLURM_",
)


@contextlib.contextmanager
def clean_env(prefixes: Sequence[str] = LAUNCHER_PREFIXES) -> Iterator[None]:
    """Remove launcher variables from ``os.environ`` while child processes are started."""
    removed = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith(tuple(prefixes))}
    try:
        yield
    finally:
        os.environ.update(removed)


_LIVE_POOLS: weakref.WeakSet = weakref.WeakSet()


@dataclass
class _Worker:
    index: int
    process: Any
    conn: Connection
    inbox: deque = field(default_factory=deque)
    #: the worker has replied at least once and has not missed a deadline since
    responsive: bool = False


class WorkerPool:
    """A fixed set of worker processes, one ``Pipe`` each.

    Args:
        target: the worker entry point, called as ``target(index, conn, *args[index])``.
        args: one tuple of extra arguments per worker.
        start_method: ``"spawn"`` (default), ``"forkserver"`` or ``"fork"``.
        name: prefix of the worker process names.
    """

    def __init__(
        self,
        target: Callable,
        args: Sequence[tuple],
        start_method: str = "spawn",
        name: str = "worker",
    ) -> None:
        methods = mp.get_all_start_methods()
        if start_method not in methods:
            raise ArgumentValueError(
                f"mp_start_method={start_method!r} is not available here; use one of {methods}."
            )
        self.host = socket.gethostname()
        self._closed = False
        ctx = mp.get_context(start_method)
        self.workers: list[_Worker] = []
        _LIVE_POOLS.add(self)
        try:
            for index, extra in enumerate(args):
                parent, child = ctx.Pipe()
                process = ctx.Process(
                    target=target, args=(index, child, *extra), name=f"{name}-{index}", daemon=True
                )
                # registered before it starts, so an exception (a signal) during start() still
                # finds it at shutdown
                self.workers.append(_Worker(index, process, parent))
                with clean_env():
                    process.start()
                child.close()
        except BaseException:
            self.shutdown(timeout=5)
            raise

    def __len__(self) -> int:
        return len(self.workers)

    # ------------------------------------------------------------------ messages
    def send(self, index: int, command: Command, argument: Any = None) -> None:
        """Send one command; a worker that is gone raises ``WorkerError``."""
        worker = self.workers[index]
        try:
            worker.conn.send((command, argument))
        except (BrokenPipeError, ConnectionResetError, OSError) as err:
            raise self._death(worker) from err

    def recv(self, index: int, expected: Reply, timeout: float) -> Any:
        """The payload of worker ``index``'s next ``expected`` reply; other replies are kept."""
        worker = self.workers[index]
        for i, (kind, payload) in enumerate(worker.inbox):
            if kind is expected:
                del worker.inbox[i]
                return payload
        deadline = time.monotonic() + timeout
        while True:
            kind, payload = self._next(worker, deadline, expected, timeout)
            if kind is expected:
                return payload
            worker.inbox.append((kind, payload))

    def wait_any(self, indices: Sequence[int], expected: Reply, timeout: float) -> tuple[int, Any]:
        """The first of ``indices`` to send ``expected``: (index, payload)."""
        for index in indices:
            worker = self.workers[index]
            for i, (kind, payload) in enumerate(worker.inbox):
                if kind is expected:
                    del worker.inbox[i]
                    return index, payload
        deadline = time.monotonic() + timeout
        watched = [self.workers[i] for i in indices]
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._timeout(watched, expected, timeout)
            ready = wait(
                [w.conn for w in watched] + [w.process.sentinel for w in watched], remaining
            )
            for worker in watched:
                if worker.conn in ready or worker.process.sentinel in ready:
                    kind, payload = self._next(worker, deadline, expected, timeout)
                    if kind is expected:
                        return worker.index, payload
                    worker.inbox.append((kind, payload))

    def _next(
        self, worker: _Worker, deadline: float, expected: Reply, timeout: float
    ) -> tuple[Reply, Any]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise self._timeout([worker], expected, timeout)
        ready = wait([worker.conn, worker.process.sentinel], remaining)
        if worker.conn in ready:
            try:
                kind, payload = worker.conn.recv()
            except (EOFError, OSError) as err:
                raise self._death(worker) from err
            worker.responsive = True
            if kind is Reply.ERROR:
                type_name, message, trace = payload
                raise WorkerError(
                    f"{type_name}: {message}",
                    worker=worker.index,
                    host=self.host,
                    remote_traceback=trace,
                )
            return kind, payload
        if worker.process.sentinel in ready:
            raise self._death(worker)
        raise self._timeout([worker], expected, timeout)

    def _death(self, worker: _Worker) -> WorkerError:
        worker.process.join(1)
        code = worker.process.exitcode
        if code is None:
            how = "closed its pipe"
        elif code < 0:
            how = f"was killed by signal {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        return WorkerError(
            f"the worker process (pid {worker.process.pid}) {how}; collection cannot go on. "
            "Check the worker's memory use and the env's own logs.",
            worker=worker.index,
            host=self.host,
        )

    def _timeout(self, workers: list[_Worker], expected: Reply, timeout: float) -> Exception:
        for worker in workers:
            worker.responsive = False
        which = ", ".join(str(w.index) for w in workers)
        return CollectorTimeoutError(
            f"no {expected.name} reply from worker(s) {which} within {timeout:g} s; they are alive but "
            "busy or stuck. Pass a larger worker_timeout for slow envs or large batches."
        )

    # ------------------------------------------------------------------ shutdown
    def shutdown(self, timeout: float = 10.0, close_env: bool = True) -> None:
        """Ask every worker to exit; kill those that do not within ``timeout`` s, and at once
        those that never answered or missed a deadline (they cannot be listening); idempotent."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout
        started = [w for w in self.workers if _started(w.process)]
        for worker in started:
            if worker.process.is_alive():
                with contextlib.suppress(Exception):
                    worker.conn.send((Command.SHUTDOWN, close_env))
        for worker in started:
            if not worker.responsive:
                _kill(worker.process)
        for worker in started:
            worker.process.join(max(0.0, deadline - time.monotonic()))
        for worker in self.workers:
            if _started(worker.process):
                _kill(worker.process)
            worker.conn.close()
            with contextlib.suppress(ValueError):
                worker.process.close()
        _LIVE_POOLS.discard(self)
        if not _LIVE_POOLS:
            # Sending shared tensors down a pipe starts the stdlib's fd-passing thread in this
            # process; with no worker left to fetch from it, stop it (it restarts on demand).
            resource_sharer.stop(timeout=1)

    @property
    def closed(self) -> bool:
        return self._closed


def _started(process: Any) -> bool:
    return getattr(process, "_popen", None) is not None


def _kill(process: Any) -> None:
    """SIGKILL ``process`` if it still runs, and reap it (bounded)."""
    if process.is_alive():
        with contextlib.suppress(OSError):
            process.kill()
    process.join(5)


@atexit.register
def _shutdown_live_pools() -> None:
    # Runs before multiprocessing's own exit handler, whose terminate() the workers ignore and
    # whose join() has no timeout.
    for pool in list(_LIVE_POOLS):
        with contextlib.suppress(Exception):
            pool.shutdown(timeout=2)
