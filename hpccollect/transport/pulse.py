"""``PULSE``: the one thread of a process that runs the rank links' periodic work (heartbeats,
connection watches), whatever the number of links. A rank 0 with N collector ranks therefore
runs one such thread, not one or two per rank.

A job (``Periodic``) says when it is next due; the thread sleeps until the earliest, runs the
jobs that are due, and ends once it has none (a later ``add`` starts it again). A job never
blocks: it posts transfers and checks them on its next turn.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["PULSE", "Periodic", "Pulse"]


class Periodic(Protocol):
    """A job the pulse runs."""

    def tick(self, now: float) -> float | None:
        """Do what is due at ``now`` (monotonic s); when to run next, or None to be dropped."""


class Pulse:
    """Runs ``Periodic`` jobs from one daemon thread (see the module)."""

    def __init__(self, name: str = "hpccollect-pulse") -> None:
        self.name = name
        self._due: dict[Periodic, float] = {}
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, job: Periodic, due: float | None = None) -> None:
        """Run ``job`` from ``due`` on (monotonic s; default now)."""
        with self._changed:
            self._due[job] = time.monotonic() if due is None else due
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._changed.notify()

    def remove(self, job: Periodic) -> None:
        """Stop running ``job`` (the thread ends with its last job)."""
        with self._changed:
            if self._due.pop(job, None) is not None:
                self._changed.notify()

    def running(self, job: Periodic) -> bool:
        """Whether ``job`` is still run."""
        return job in self._due and self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        with self._changed:
            while self._due:
                now = time.monotonic()
                due = [job for job, when in self._due.items() if when <= now]
                for job in due:
                    try:
                        nxt = job.tick(now)
                    except Exception:  # a job's link is closed: it reports that on its own
                        nxt = None
                    if job in self._due:  # not removed meanwhile
                        if nxt is None:
                            del self._due[job]
                        else:
                            self._due[job] = nxt
                if self._due:
                    self._changed.wait(max(0.0, min(self._due.values()) - time.monotonic()))
            self._thread = None


#: the process's pulse
PULSE = Pulse()
