"""How a job meets SIGTERM and SIGINT (SLURM's preemption, ``scancel``, the time limit,
``timeout``, Ctrl-C), the same on a local and a distributed job.

* during start-up (env probe, worker start, before the first batch) nothing is worth finishing:
  ``Stopped`` is raised, the workers are stopped at once and no dataset is written;
* while collecting, SIGTERM, SIGUSR1 (what to send Open MPI's ``mpirun``, see ``_signals.py``)
  and a first SIGINT stop the run after the current batch; a second SIGINT interrupts at once
  (committed data is still kept). Where the stop cannot wait for a batch, the signal also ends
  the wait for the next one (``cutting_waits``): a job whose rank 0 takes reports, not batches,
  has no batch of its own to finish, and Open MPI's ``mpirun`` kills the ranks a quarter of a
  second after it passes SIGTERM on (``killed_soon_after``), so the file is closed at once with
  what was committed (the batches under way are not written).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

from hpccollect._signals import STOP_SIGNALS, handled_by, killed_soon_after
from hpccollect.transport.base import cut_wait, cut_waits_by

__all__ = ["StopSignals", "Stopped", "WaitCut"]


class Stopped(BaseException):
    """A stop signal during start-up (a BaseException, so ``except Exception`` lets it pass)."""


class WaitCut(BaseException):
    """A stop signal ended the wait for the collector's next report (``cutting_waits``)."""


class StopSignals:
    """SIGTERM/SIGINT: raise ``Stopped`` during start-up, set ``signal`` while collecting; a
    second SIGINT while collecting raises ``KeyboardInterrupt``. Each raises at most once, so
    the shutdown that follows is not interrupted.

    Args:
        cut_always: whether every stop signal ends the wait for the next batch at once (rank 0
            takes only reports); otherwise only one the launcher kills soon after does.
    """

    def __init__(self, cut_always: bool = False) -> None:
        self.signal: str | None = None
        self.collecting = False
        self.cut_always = cut_always
        self._cut = self._raised = self._deferred = False

    def _handle(self, signum: int, frame: Any) -> None:
        first = self.signal is None
        self.signal = self.signal or signal.Signals(signum).name
        if first and self.collecting:
            self._cut = self.cut_always or killed_soon_after(signum)
            if self._cut:
                cut_wait()  # raises WaitCut in a wait that ``cutting_waits`` armed
            return
        if self._raised or self._deferred:
            return
        if not self.collecting:
            self._raised = True
            raise Stopped
        if signum == signal.SIGINT:
            self._raised = True
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A start-up step that must not be cut in half: a signal stops after it."""
        self._deferred = True
        try:
            yield
        finally:
            self._deferred = False
        if self.signal is not None and not self.collecting and not self._raised:
            self._raised = True
            raise Stopped

    @contextlib.contextmanager
    def cutting_waits(self) -> Iterator[None]:
        """A wait for the collector's next batch or report, which a stop signal that cannot
        wait for it (see the module) ends at once by raising ``WaitCut`` where the wait has taken
        nothing (``transport/base.py: cut_wait``); such a signal that came before raises it at once."""
        with cut_waits_by(WaitCut):
            if self._cut:
                raise WaitCut
            yield

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A step during which a signal is only recorded in ``signal``: the caller decides."""
        self._deferred = True
        try:
            yield
        finally:
            self._deferred = False

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopSignals]:
        with handled_by(STOP_SIGNALS, self._handle):
            yield self
