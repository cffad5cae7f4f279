"""Ranks that notice their MPI launcher is gone, and stop as if it had passed SIGTERM on.

A scheduler or Ctrl-C stops an MPI job by signalling its launcher, which forwards SIGTERM to every
rank; but Intel MPI's ``mpirun`` is a shell script around ``mpiexec.hydra`` that dies of SIGTERM
alone, leaving the job orphaned. So every rank watches the launcher processes above it, and when
one ends sends itself SIGTERM once (rank 0 stops the run; collector ranks ignore it). The thread
sleeps in one ``poll`` of their process descriptors (``pidfd_open``, Linux 5.3), else looks every
``_PERIOD``.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time

from hpccollect._launchers import LAUNCHERS, launcher_chain, process

__all__ = ["LAUNCHERS", "launcher_chain", "watch_launcher"]

_PERIOD = 0.5  # s between two looks at the launcher processes, without process descriptors
_LONG = 3600.0  # s: one wait on the process descriptors (it ends when a launcher does)

_watching = threading.Lock()
_watcher: threading.Thread | None = None


def _gone(chain: list[tuple[int, int]]) -> bool:
    for pid, started in chain:
        found = process(pid)
        if found is None or found.started != started:  # ended (its pid may be another's now)
            return True
    return False


def watch_launcher() -> bool:
    """Start watching this process's launcher processes (once per process; Linux only).

    Returns:
        Whether a launcher is watched above this process.
    """
    global _watcher
    with _watching:
        if _watcher is not None:
            return True
        chain = launcher_chain()
        if not chain:
            return False
        _watcher = threading.Thread(
            target=_watch, args=(chain,), name="hpccollect-launcher-watch", daemon=True
        )
        _watcher.start()
        return True


def _watch(chain: list[tuple[int, int]]) -> None:
    with contextlib.ExitStack() as held:
        fds: list[int] = []
        with contextlib.suppress(AttributeError, OSError):  # no pidfd here, or a launcher gone
            for pid, _ in chain:
                fds.append(os.pidfd_open(pid))
                held.callback(os.close, fds[-1])
        # looked at after opening: each descriptor is then the launcher's, not a reused pid's
        if len(fds) == len(chain) and not _gone(chain):
            waiting = select.poll()
            for fd in fds:
                waiting.register(fd, select.POLLIN)
            while not waiting.poll(_LONG * 1000):
                pass
        else:
            while not _gone(chain):
                time.sleep(_PERIOD)
    with contextlib.suppress(OSError):
        os.kill(os.getpid(), signal.SIGTERM)
