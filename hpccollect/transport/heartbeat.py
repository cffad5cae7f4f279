"""Liveness of a rank link. Each end tells the other every few seconds that it lives and notes
when the other last did, so a rank whose node was lost, whose network was cut or that was
stopped (SIGSTOP) is noticed within ``liveness_timeout`` s, where a send to it would wait for
its whole timeout and a receive forever. How a beat travels and is received is the channel's
(``RankChannel.start_heartbeats``); this module keeps the time and the thread.

What it costs: one header-only message each way every ``beat_interval`` s, sent from threads
of their own; a message received notes the time (one clock read).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["DEFAULT_LIVENESS_TIMEOUT", "Heartbeat", "beat_interval"]

DEFAULT_LIVENESS_TIMEOUT = 30.0
_MAX_INTERVAL = 5.0


def beat_interval(timeout: float) -> float:
    """Seconds between two beats for a liveness timeout of ``timeout`` s: six beats fit in it,
    so a few late ones never count as silence."""
    return min(_MAX_INTERVAL, timeout / 6)


class Heartbeat:
    """Beats to a peer (``send`` posts one and returns what to wait for, or None), takes the
    peer's beats that no other thread receives (``drain``: whether any came), and says when
    the peer has been silent too long (``silence``).

    The beating thread never blocks: a beat the peer has not taken yet (a stopped process) is
    waited for by a second thread, and no new one is sent meanwhile. A pause of this process
    itself (stopped, or starved of the interpreter) is not held against the peer: its beats
    could not be seen meanwhile.
    """

    def __init__(
        self,
        timeout: float,
        send: Callable[[], Any],
        drain: Callable[[], bool],
        name: str,
    ) -> None:
        self.timeout = float(timeout)
        self.interval = beat_interval(self.timeout)
        #: silent this long counts as lost: noticed (a look a second) within the timeout
        self.limit = self.timeout - min(4.0, self.timeout / 4)
        self.heard = self._ticked = time.monotonic()
        self._send, self._drain = send, drain
        self._stop = threading.Event()
        self._sent: queue.SimpleQueue = queue.SimpleQueue()  # beats to see through; None: stop
        self._in_flight = False  # a beat the peer has not taken yet
        self._threads = [
            threading.Thread(target=self._beat, name=name, daemon=True),
            threading.Thread(target=self._see_through, name=f"{name}-sent", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def note(self) -> None:
        """The peer was heard from just now."""
        self.heard = time.monotonic()

    def silence(self) -> str | None:
        """Why the peer counts as lost (silent past the timeout), or None while it is heard,
        once beating stopped (the peer said it is done), or while this process cannot tell
        (it was paused itself)."""
        now = time.monotonic()
        if self._stop.is_set():
            return None
        if now - self._ticked > self._paused_after and self._threads[0].is_alive():
            return None  # the beating thread has not run for a while: this process was paused
        quiet = now - self.heard
        if quiet <= self.limit:
            return None
        return (
            f"has sent nothing, not even a heartbeat, for {quiet:.0f} s "
            f"(liveness_timeout={self.timeout:g} s)"
        )

    @property
    def _paused_after(self) -> float:
        return 2 * self.interval + 1.0

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            if now - self._ticked > self._paused_after:
                self.heard = max(self.heard, now)  # this process was paused: a fresh window
            self._ticked = now
            try:
                if self._drain():
                    self.note()
                if not self._in_flight:
                    work = self._send()
                    if work is not None:
                        self._in_flight = True
                        self._sent.put(work)
            except Exception:  # the link is closed: its channel reports that on its own
                return

    def _see_through(self) -> None:
        while (work := self._sent.get()) is not None:
            try:
                work.wait()
            except Exception:  # the link is closed
                return
            self._in_flight = False

    def stop(self, timeout: float = 0.0) -> None:
        """Stop beating; wait up to ``timeout`` s for the threads (a beat the peer never takes
        keeps one waiting until the link is closed)."""
        self._stop.set()
        self._sent.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
