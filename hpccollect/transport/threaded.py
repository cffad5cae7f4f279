"""``ThreadedRankChannel``: a ``RankChannel`` over torch process groups, whose receives cannot
be polled: the process's ``Receiver`` (``receiver.py``) receives for it in a thread, puts each
message in its inbox and rings the process's doorbell."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from hpccollect.protocol import Command, message
from hpccollect.transport.doorbell import ready
from hpccollect.transport.rank_channel import RankChannel
from hpccollect.transport.wire import HEARTBEAT

__all__ = ["ThreadedRankChannel"]

_END_GRACE = 2.0  # s: a rank's connection is seen closed this soon after its process ended


class ThreadedRankChannel(RankChannel):
    """A ``RankChannel`` over torch process groups (see the module). Its messages are seen in
    its inbox (``polled``), and its ``handles`` are the shared doorbell and, where the launcher
    has one, the rank's process: waiting on them wakes for a message or the rank's end."""

    polled = True

    def __init__(self, groups: Any, peer: int, **kwargs: Any) -> None:
        super().__init__(groups, peer, **kwargs)
        self._ended = threading.Event()  # nothing more can arrive from the peer
        self._receiver = groups.receiver
        self.bell = self._receiver.bell
        self._receiver.add(self)

    def arrived(self) -> bool:
        """Take the message the receiver just received into this link's buffer: read the rest
        of it and hand it over. False once no more should be received for this link (the peer
        said stop, or the link failed)."""
        try:
            self._heard()
            if self._beat is not None and self._in_head[0] == HEARTBEAT:
                self._beat.answered()  # the rank's answer to rank 0's beat
                return True
            item = self._read_message()
        except Exception as err:  # the peer is gone, or the groups were aborted
            self._closed_by(err)
            return False
        self._hand_over(item)
        if item[0] is Command.SHUTDOWN:
            self._ended.set()  # the peer is done: nothing more is received for it
            return False
        return True

    def link_closed(self, why: str) -> None:
        super().link_closed(why)
        self._ended.set()

    def start_heartbeats(self, timeout: float | None) -> None:
        """Beat as ``RankLiveness`` does; the end that answers (a collector rank) receives
        rank 0's beats in a thread of the receiver, which answers each."""
        super().start_heartbeats(timeout)
        if self._beat is not None and self._beat.answers:
            self._receiver.hear_beats(self)

    def poll(self, timeout: float) -> bool:
        """Whether a message is in the inbox (``timeout`` <= 0: a look, no system call; the
        rank's process is watched by whoever waits on ``handles``), or arrives or the rank's
        process ends within ``timeout`` s."""
        if self._inbox:
            return True
        return timeout > 0 and self._look(timeout) != "timeout"

    def _await(self, timeout: float) -> None:
        if self._look(timeout) == "ended" and not self._inbox:
            # the process ended: its connection's end is seen within moments
            self._ended.wait(_END_GRACE)
            if not self._inbox:
                raise ConnectionError(self.life.death() or "the rank ended")

    def _look(self, timeout: float) -> str:
        """Wait up to ``timeout`` s for a message in the inbox: "took", "ended" (the peer's
        process ended) or "timeout"."""
        deadline = time.monotonic() + timeout
        handles = self.handles()
        bell = self.bell
        while True:
            if self._inbox:
                return "took"
            woke = ready(handles, max(0.0, deadline - time.monotonic()))
            if bell in woke:
                bell.clear()
            if self._inbox:
                return "took"
            if any(h is not bell for h in woke):
                return "ended"
            if time.monotonic() >= deadline:
                return "timeout"

    def join_peer(self, timeout: float) -> bool:
        return self._ended.wait(max(0.0, timeout))

    def gone(self) -> str | None:
        if not self._ended.is_set():
            return None
        return self._failure or "ended its part of the job"

    def _peer_done(self, beat: Any) -> None:
        """The peer said it is done: on rank 0, one last beat lets the rank's thread that
        waits for beats go (it ends at the first one after its channel closed), so that its
        gloo connection closes with its groups; then beating stops."""
        beat.part()

    def _closing(self) -> None:
        """A collector rank that rank 0 stopped says so before it lets go: over gloo, its
        connection outlives its aborted groups while one of its threads still waits in a
        receive there (rank 0 would never see this rank end). Rank 0's receiver takes the
        SHUTDOWN as the link's end."""
        if self._stopped_by_peer and not self._sent_shutdown and self._failure is None:
            with contextlib.suppress(Exception):
                self.send(message(Command.SHUTDOWN, False))
