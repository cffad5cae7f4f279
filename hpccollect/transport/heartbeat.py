"""Liveness of a rank link. Each end tells the other every few seconds that it lives and notes
when the other last did, so a rank whose node was lost, whose network was cut or that was
stopped (SIGSTOP) is noticed within ``liveness_timeout`` s, where a send to it would wait for
its whole timeout and a receive forever. How a beat travels and is received is the channel's
(``RankChannel.start_heartbeats``); this module keeps the time.

What it costs: one header-only message each way every ``beat_interval`` s, sent (over gloo:
rank 0's) and checked by the process's pulse thread (``pulse.py``: one thread for every link);
a message received notes the time (one clock read). Where a send is seen complete only by a
thread that waits in it (gloo), the beats go as a ping and its answer: rank 0 sends a beat and
the rank answers it, so the answer tells rank 0 that its beat was taken and rank 0 needs no
thread to wait in the send. The rank answers from the thread that receives rank 0's beats,
which may wait in its send.
"""

from __future__ import annotations

import contextlib
import datetime
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
    stopped process) is looked at again on the next turn, and no new one is sent meanwhile.
    Whether it was taken, ``pollable`` sends tell (the work's ``is_completed()``); otherwise
    the peer's answer does (``answered``), and the end that ``answers`` sends no beat of its
    own: it answers each beat it receives (``answer``, from the thread that received it). A
    pause of this process itself (stopped, or starved of the interpreter) is not held against
    the peer: its beats could not be seen meanwhile.
    """

    def __init__(
        self,
        timeout: float,
        send: Callable[[], Any],
        drain: Callable[[], bool],
        pollable: bool = True,
        answers: bool = False,
        pulse: Pulse = PULSE,
    ) -> None:
        self.timeout = float(timeout)
        self.interval = beat_interval(self.timeout)
        #: silent this long counts as lost: noticed (a look a second) within the timeout
        self.limit = self.timeout - min(4.0, self.timeout / 4)
        self.heard = self._ticked = time.monotonic()
        self._send, self._drain = send, drain
        self._pollable = pollable
        #: this end answers the peer's beats instead of sending its own (see the class)
        self.answers = answers and not pollable
        self._stopped = False
        # a beat the peer has not taken yet; held until then (a gloo send whose work is
        # dropped before the peer takes it is never delivered)
        self._in_flight: Any = None
        self._lock = threading.Lock()  # around _in_flight's changes (see _beat_unless_in_flight)
        self._pulse = pulse
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
        if self._pollable and self._in_flight is not None and self._in_flight.is_completed():
            self._in_flight = None
        if not self.answers:
            self._beat_unless_in_flight()
        return now + self.interval

    def _beat_unless_in_flight(self) -> None:
        """Send a beat unless one is on its way. The peer may answer it before ``send``
        returns (the send lets go of the interpreter): ``answered`` waits for the lock, so
        it always finds the beat it answers."""
        with self._lock:
            if self._in_flight is None and not self._stopped:  # release() may have run
                self._in_flight = self._send()

    def answered(self) -> None:
        """The peer answered this end's beat: it was taken, the next one may go (the send's
        wait returns at once: the peer received it before it answered)."""
        with self._lock:
            work, self._in_flight = self._in_flight, None
        if work is not None:
            with contextlib.suppress(Exception):  # the link is closed
                work.wait()

    def answer(self) -> None:
        """Answer the beat just received (the peer's next one waits for it): send one and wait
        until the peer has taken it. Raises when the link is closed."""
        self._send().wait()

    def part(self) -> None:
        """Beat once more now, unless a beat is on its way already, then stop (the peer is
        done, and what waits for its beats there ends with this one). The end that answers
        has nothing to let go: the peer receives its answers with its messages."""
        if not self.answers:
            with contextlib.suppress(Exception):
                self._beat_unless_in_flight()  # none once stopped
        self.stop()

    def stop(self) -> None:
        """Stop beating (a beat still on its way is held: see ``release``)."""
        self._stopped = True
        self._pulse.remove(self)

    def release(self, timeout: float) -> None:
        """Once the link closes: give a beat still on its way up to ``timeout`` s to be
        taken (0: not at all, a silent peer's), then let it go (a gloo beat holds the link's
        groups, and their port, open). A polled send is left as it is: its request keeps its
        buffer, which the transport may still read."""
        self.stop()
        if self._pollable:
            return
        with self._lock:
            work, self._in_flight = self._in_flight, None
        if work is not None and timeout > 0:
            with contextlib.suppress(Exception):  # not taken: the link is closing anyway
                work.wait(datetime.timedelta(seconds=timeout))
