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
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from multiprocessing import forkserver
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

# Python's fork-server processes take the server from a module attribute: while one job's
# processes start, it points at that job's server (one job at a time)
_STARTING = threading.Lock()


class JobForkServer:
    """One job's fork server (started by ``start()``, ended by ``close()``).

    Args:
        preload: modules the server imports before its first fork, beside ``__main__``.
    """

    def __init__(self, preload: Sequence[str] = RANK_MODULES) -> None:
        self._server = forkserver.ForkServer()
        # the stop signals first: a scheduler may signal the job while the server imports
        self._server.set_forkserver_preload([_IGNORE_STOP_SIGNALS, "__main__", *preload])
        self.context = mp.get_context("forkserver")

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
            saved = forkserver.connect_to_new_process
            forkserver.connect_to_new_process = self._server.connect_to_new_process
            try:
                yield self.context
            finally:
                forkserver.connect_to_new_process = saved

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
