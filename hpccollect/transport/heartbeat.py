"""Liveness of a rank link. Each end tells the other every few seconds that it lives and notes
when the other last did, so a rank whose node was lost, whose network was cut or that was
stopped (SIGSTOP) is noticed within ``liveness_timeout`` s, where a send to it would wait for
its whole timeout and a receive forever. How a beat travels and is received is the channel's
(``RankChannel.start_heartbeats``); this module keeps the time and the thread.

What it costs: one header-only message each way every ``beat_interval`` s, sent and checked by
the process's pulse thread (``pulse.py``: one thread for every link); a message received notes
the time (one clock read). Where a send is seen complete only by waiting in it (gloo), each link
has a thread that does, so that a peer that stops taking beats never holds the pulse.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from hpccollect.transport.pulse import PULSE, Pulse

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

    The pulse runs it (``tick``) and never blocks on it: a beat the peer has not taken yet (a
    stopped process) is looked at again on the next turn (``pollable``: the work's
    ``is_completed()`` tells), or waited for by a thread of its own, and no new one is sent
    meanwhile. A pause of this process itself (stopped, or starved of the interpreter) is not
    held against the peer: its beats could not be seen meanwhile.
    """

    def __init__(
        self,
        timeout: float,
        send: Callable[[], Any],
        drain: Callable[[], bool],
        pollable: bool = True,
        name: str = "hpccollect-beat",
        pulse: Pulse = PULSE,
    ) -> None:
        self.timeout = float(timeout)
        self.interval = beat_interval(self.timeout)
        #: silent this long counts as lost: noticed (a look a second) within the timeout
        self.limit = self.timeout - min(4.0, self.timeout / 4)
        self.heard = self._ticked = time.monotonic()
        self._send, self._drain = send, drain
        self._stopped = False
        self._in_flight: Any = None  # a beat the peer has not taken yet
        self._pulse = pulse
        self._sent: queue.SimpleQueue | None = None  # beats to wait for; None: stop
        self._waiter: threading.Thread | None = None
        if not pollable:
            self._sent = queue.SimpleQueue()
            self._waiter = threading.Thread(
                target=self._see_through, name=f"{name}-sent", daemon=True
            )
            self._waiter.start()
        pulse.add(self, self._ticked + self.interval)

    def note(self) -> None:
        """The peer was heard from just now."""
        self.heard = time.monotonic()

    def silence(self) -> str | None:
        """Why the peer counts as lost (silent past the timeout), or None while it is heard,
        once beating stopped (the peer said it is done), or while this process cannot tell
        (it was paused itself)."""
        now = time.monotonic()
        if self._stopped:
            return None
        if now - self._ticked > self._paused_after and self._pulse.running(self):
            return None  # the pulse has not run for a while: this process was paused
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

    def tick(self, now: float) -> float | None:
        """One turn of the pulse: note a pause of this process, take the peer's beats, and
        send the next one once the last was taken; None (dropped) once the link is closed."""
        if self._stopped:
            return None
        if now - self._ticked > self._paused_after:
            self.heard = max(self.heard, now)  # this process was paused: a fresh window
        self._ticked = now
        if self._drain():
            self.note()
        if self._sent is None and self._in_flight is not None and self._in_flight.is_completed():
            self._in_flight = None
        if self._in_flight is None:
            self._beat_now()
        return now + self.interval

    def _beat_now(self) -> None:
        """Post a beat, for the thread that sees beats through where there is one."""
        self._in_flight = self._send()
        if self._sent is not None and self._in_flight is not None:
            self._sent.put(self._in_flight)

    def _see_through(self) -> None:
        assert self._sent is not None
        while (work := self._sent.get()) is not None:
            try:
                work.wait()
            except Exception:  # the link is closed
                return
            self._in_flight = None

    def part(self) -> None:
        """Beat once more now, unless a beat is on its way already, then stop (the peer is
        done, and what waits for its beats there ends with this one)."""
        if not self._stopped and self._in_flight is None:
            with contextlib.suppress(Exception):
                self._beat_now()
        self.stop()

    def stop(self, timeout: float = 0.0) -> None:
        """Stop beating; wait up to ``timeout`` s for the thread that sees beats through,
        if any (a beat the peer never takes keeps it waiting until the link is closed)."""
        self._stopped = True
        self._pulse.remove(self)
        if self._sent is not None and self._waiter is not None:
            self._sent.put(None)
            if self._waiter is not threading.current_thread():
                self._waiter.join(max(0.0, timeout))
