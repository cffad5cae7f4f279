"""The signals that stop a collection job, and the processes that leave the stop to another.

A scheduler or Ctrl-C signals every process of a job; only rank 0 (or the single process) stops
it, after its current batch, and tells the collector ranks and workers, which ignore the signals.
SIGUSR1 stops a job too: Open MPI's ``mpirun`` kills the ranks half a second after passing on a
SIGTERM, but passes SIGUSR1 on as it is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

__all__ = ["STOP_SIGNALS", "handled_by", "ignore_stop_signals", "killed_soon_after"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def killed_soon_after(signum: int, environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process's launcher kills it too soon after ``signum`` to wait for a batch.

    Open MPI 5's ``mpirun`` (PRRTE, which sets ``PRTE_LAUNCHED`` in every rank) kills every rank
    about half a second after a SIGTERM (no setting lengthens it); ``mpiexec``, ``srun``
    (``KillWait``, 30 s by default) and a shell leave time.

    Args:
        signum: the stop signal this process received.
        environ: the process's environment (``os.environ`` when None).
    """
    environ = os.environ if environ is None else environ
    return signum == signal.SIGTERM and "PRTE_LAUNCHED" in environ


def ignore_stop_signals() -> None:
    """Ignore ``STOP_SIGNALS`` in this process (its stop comes from the job's own process)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def handled_by(signums: Iterable[int], handler: Callable[[int, Any], Any]) -> Iterator[bool]:
    """Within: ``handler`` handles ``signums``, whose handlers are put back after; off the main
    thread (where Python runs no handler) nothing is installed.

    Yields:
        Whether the handler was installed (False off the main thread).
    """
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    old = {s: signal.signal(s, handler) for s in signums}
    try:
        yield True
    finally:
        for s, before in old.items():
            signal.signal(s, before)
