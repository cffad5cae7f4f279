"""The signals that stop a collection job, and the processes that leave the stop to another.

A scheduler (SLURM's preemption, ``scancel``, the time limit) or a user's Ctrl-C signals every
process of a job. Only the process that runs the job (rank 0, or the single process) stops it,
after its current batch; collector ranks and worker processes ignore the stop signals and are
told to stop by it. SIGUSR1 stops a job as SIGTERM does: Open MPI's ``mpirun`` kills the ranks
half a second after a SIGTERM, and passes SIGUSR1 on as it is.
"""

from __future__ import annotations

import signal

__all__ = ["STOP_SIGNALS", "ignore_stop_signals"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def ignore_stop_signals() -> None:
    """Ignore ``STOP_SIGNALS`` in this process (its stop comes from the job's own process)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
