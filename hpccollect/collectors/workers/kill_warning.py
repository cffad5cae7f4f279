"""A worker with a sink (a collector rank's shard) closes it when its launcher is about to kill it.

A worker ignores the stop signals: the collector stops it between two batches (``_signals.py``).
Where the launcher kills soon after its signal (Open MPI's ``mpirun``: a quarter of a second,
``killed_soon_after``), a batch under way that takes longer is killed with the process, and the
shard stays unfinished. There, SIGTERM raises ``KillWarning`` in the worker's main thread: the
batch under way is dropped and the worker's ``finally`` closes the shard with every committed
episode. A signal that comes while the sink writes is held until the write is done, so the
shard is never closed half written.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

from hpccollect._signals import handled_by, killed_soon_after

__all__ = ["KillWarning", "SinkGuard"]


class KillWarning(BaseException):
    """The launcher kills this process moments from now (a BaseException: nothing on the way
    takes it for the collector's failure)."""


class SinkGuard:
    """Raises ``KillWarning`` for a SIGTERM the launcher kills soon after, but never inside
    ``writing()``. Installed by ``installed()``; where the launcher leaves time (or off the main
    thread), it installs nothing and SIGTERM stays ignored."""

    def __init__(self) -> None:
        self._writing = self._pending = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self._writing:
            self._pending = True
            return
        raise KillWarning

    @contextlib.contextmanager
    def installed(self) -> Iterator[SinkGuard]:
        """Within: SIGTERM raises ``KillWarning`` where the launcher kills soon after it."""
        signums = [signal.SIGTERM] if killed_soon_after(signal.SIGTERM) else []
        with handled_by(signums, self._handle):
            yield self

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """A write to the sink: a SIGTERM during it raises ``KillWarning`` once it is done."""
        self._writing = True
        try:
            yield
        finally:
            self._writing = False
        if self._pending:
            raise KillWarning
