"""A fork server of one job's own, which has imported torch and hpccollect before the job's
processes fork from it.

A spawned process imports torch, tensordict and hpccollect for itself: about 1.5 s of CPU each,
which 32 collector ranks on a few cores pay one after another (tens of seconds before the first
batch). Forked from this server, each costs a fork and the unpickling of its arguments.

The server is Python's ``multiprocessing`` fork server, but a private one per job rather than the
process-wide one:

* its environment is the one at the job's start, without launcher variables (``clean_env``),
  whatever another fork server of this process was started with;
* it preloads only what the job's processes import anyway (the calling script's ``__main__`` is
  imported once, as spawn imports it in every child);
* it ignores the stop signals, as the job's workers and ranks do (``server_signals.py``): a
  scheduler signals every process of a job, and the job's own process stops it;
* ``close()`` ends it with the job, so nothing of the job outlives it.

Caveat, as for any fork server: a script whose top level runs torch operations (outside
``if __name__ == "__main__"``) runs them in the server, before every fork.

Python offers no public way to fork from a fork server other than the process-wide one, so this
module holds every access to ``multiprocessing``'s internals the package makes for it, checked
against CPython 3.10 to 3.13 (``tests/collectors/test_multi.py`` fails when one breaks):
``forkserver.ForkServer`` (its ``ensure_running``, ``connect_to_new_process`` and
``set_forkserver_preload``; the process id, alive descriptor and address it keeps, read and
cleared by ``close``), and the fork-server ``Popen`` with its launch (``_JobPopen``), which this
module makes talk to the job's server. Nothing of ``multiprocessing`` is replaced: the job's
processes are of a ``Process`` class of this module's own (``_JobProcess``), made by the
context ``forking`` yields.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from multiprocessing import forkserver, popen_forkserver, reduction, spawn, util
from multiprocessing.context import set_spawning_popen
from typing import Any

__all__ = ["RANK_MODULES", "JobForkServer"]

#: what a collector rank or worker imports before it collects (the server imports them once)
RANK_MODULES = (
    "hpccollect.launchers.rank",
    "hpccollect.collectors.sync",
    "hpccollect.collectors.multi",
    "hpccollect.envs.gym",
)

#: imported by the server only, before anything else: it ignores the stop signals
_IGNORE_STOP_SIGNALS = "hpccollect.collectors.workers.server_signals"

# the job's processes start one job at a time: ``_STARTING`` held, ``_SERVER[0]`` is its server
_STARTING = threading.Lock()
_SERVER: list[forkserver.ForkServer] = []
_FORKSERVER = mp.get_context("forkserver")


class _JobPopen(popen_forkserver.Popen):
    """The fork-server ``Popen`` of Python's own (the descriptors a process's arguments hold
    go to the child through the server, its sentinel and exit status come back the same way),
    launched through the job's server instead of the process-wide one."""

    def _launch(self, process_obj: Any) -> None:
        server = _SERVER[0]
        data = io.BytesIO()
        set_spawning_popen(self)  # the arguments' descriptors are collected in self._fds
        try:
            for part in (spawn.get_preparation_data(process_obj.name), process_obj):
                reduction.dump(part, data)
        finally:
            set_spawning_popen(None)
        self.sentinel, out = server.connect_to_new_process(self._fds)
        # a copy of the write end stays here until this Popen goes: the child reads its end
        # as this process's life
        kept = os.dup(out)
        self.finalizer = util.Finalize(self, util.close_fds, (kept, self.sentinel))
        with open(out, "wb", closefd=True) as pipe:
            pipe.write(data.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _JobProcess(_FORKSERVER.Process):
    """A process the job's fork server forks (``JobForkServer.forking``)."""

    @staticmethod
    def _Popen(process_obj: Any) -> _JobPopen:
        if not _SERVER:
            raise RuntimeError("a job's process starts only inside JobForkServer.forking()")
        return _JobPopen(process_obj)


class _JobContext(type(_FORKSERVER)):  # type: ignore[misc]
    """The fork-server context whose processes fork from the job's server."""

    Process = _JobProcess


class JobForkServer:
    """One job's fork server (started by ``start()``, ended by ``close()``).

    Args:
        preload: modules the server imports before its first fork, beside ``__main__``.
    """

    def __init__(self, preload: Sequence[str] = RANK_MODULES) -> None:
        self._server = forkserver.ForkServer()
        # the stop signals first: a scheduler may signal the job while the server imports
        self._server.set_forkserver_preload([_IGNORE_STOP_SIGNALS, "__main__", *preload])
        self.context = _JobContext()

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._server._forkserver_pid

    def start(self) -> None:
        """Start the server (it imports ``preload`` while the caller goes on); the environment
        it and every process forked from it will have is the caller's at this moment, without
        launcher variables."""
        from hpccollect.collectors.workers.processes import clean_env

        with clean_env():
            self._server.ensure_running()

    @contextlib.contextmanager
    def forking(self) -> Iterator[Any]:
        """While in this block, processes of ``self.context`` fork from this server."""
        with _STARTING:
            _SERVER[:] = [self._server]
            try:
                yield self.context
            finally:
                _SERVER.clear()

    def close(self, timeout: float = 2.0) -> None:
        """End the server and reap it (call it once the job's processes have ended: what the
        server would still tell of them is lost). Its Python teardown would take longer than
        the whole fork, so it is killed. Safe to call twice.

        Args:
            timeout: s to wait for the killed server to be reaped.
        """
        server = self._server
        pid, alive = server._forkserver_pid, server._forkserver_alive_fd
        if pid is None:
            return
        server._forkserver_pid = server._forkserver_alive_fd = None
        with contextlib.suppress(OSError):
            os.close(alive)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while not _reaped(pid) and time.monotonic() < deadline:
            time.sleep(0.005)
        address = server._forkserver_address
        server._forkserver_address = None
        if isinstance(address, str) and not address.startswith("\0"):
            with contextlib.suppress(OSError):
                os.unlink(address)


def _reaped(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True
