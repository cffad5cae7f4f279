"""The signals that stop a collection job, and the processes that leave the stop to another.

A scheduler (SLURM's preemption, ``scancel``, the time limit) or a user's Ctrl-C signals every
process of a job. Only the process that runs the job (rank 0, or the single process) stops it,
after its current batch; collector ranks and worker processes ignore the stop signals and are
told to stop by it. SIGUSR1 stops a job as SIGTERM does: Open MPI's ``mpirun`` kills the ranks
half a second after a SIGTERM, and passes SIGUSR1 on as it is.
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
    """Whether the launcher that started this process kills it too soon after sending it
    ``signum`` for a batch under way to be waited for.

    Open MPI 5's ``mpirun`` (PRRTE's ``prterun``, whose daemons set ``PRTE_LAUNCHED`` in every
    rank they start, on this node or another) passes a SIGTERM on a quarter of a second late and
    kills every rank a quarter of a second after that (measured; no setting lengthens it).
    MPICH's and Intel MPI's ``mpiexec``, an ``srun`` step (SLURM's ``KillWait``, 30 s by default)
    and a shell leave time for it.

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
    """Within: ``handler`` handles each of ``signums``; their handlers before are put back
    after. Python runs handlers in the main thread only: elsewhere nothing is installed.

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
