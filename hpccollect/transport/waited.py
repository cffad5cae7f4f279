"""``WaitedRankChannel``: a ``RankChannel`` over torch process groups, whose receives cannot
be polled (gloo): a receive is seen complete only by a thread that waits in it. The link keeps
one receive posted, and waits in it when it knows the message is there, or from a thread that
can wait for as long as it takes:

- on rank 0 (many links), the ``NoticeBoard`` (``notices.py``) tells which links' messages came,
  from the collector ranks' notices, so no thread waits for any one rank;
- on a collector rank (one link), the process's ``Receiver`` (``receiver.py``) waits in it in a
  thread, and in rank 0's beats in another; rank 0's own links fall back to it where the job
  has no store to publish the notices' port in.

Either way each message lands in the link's inbox and the process's bell is rung for it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from hpccollect.protocol import Command, message
from hpccollect.transport.doorbell import ready
from hpccollect.transport.rank_channel import RankChannel
from hpccollect.transport.wire import HEARTBEAT, MESSAGES, first_line

__all__ = ["WaitedRankChannel"]

_END_GRACE = 2.0  # s: a rank's connection is seen closed this soon after its process ended


class WaitedRankChannel(RankChannel):
    """A ``RankChannel`` over torch process groups (see the module). Its messages are seen in
    its inbox (``polled``), and its ``handles`` are the shared doorbell and, where the launcher
    has one, the rank's process: waiting on them wakes for a message or the rank's end."""

    polled = True

    def __init__(self, groups: Any, peer: int, **kwargs: Any) -> None:
        super().__init__(groups, peer, **kwargs)
        self._ended = threading.Event()  # nothing more can arrive from the peer
        self._receiver = groups.receiver
        self._tell = groups.notifier.tell if groups.notifier is not None else None
        self.bell = self._receiver.bell
        self._receiver.add(self)

    def expect(self) -> None:
        """Post the receive of the next message from the peer (kept: ``_post_receive``)."""
        try:
            self._post_receive(self._recv_buf, MESSAGES)
        except Exception as err:  # the groups were closed: nothing was posted
            self.link_closed(f"closed the connection ({first_line(err)})")

    def noticed(self) -> bool:
        """Wait in the posted receive (rank 0: its message is known to be here), take the
        message in and post the next receive; False once no more should be received. The
        receive stays in ``_posted`` until it is complete (see ``_post_receive``)."""
        posted = self._posted
        if not posted:
            return False
        try:
            posted[0].wait()
        except Exception as err:  # the peer is gone, or the groups were aborted
            posted.clear()
            self.link_closed(f"closed the connection ({first_line(err)})")
            return False
        posted.clear()
        if not self.arrived():
            return False
        self.expect()
        return bool(posted)

    def notice_line_closed(self) -> None:
        """The peer's notice connection closed: its process ended (a peer that said stop
        first has ended its link already)."""
        if not self._ended.is_set():
            self.link_closed("closed the connection (its process ended)")

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
            self._until_ended(_END_GRACE)
            if not self._inbox:
                raise ConnectionError(self.life.death() or "the rank ended")

    def _until_ended(self, timeout: float) -> bool:
        """Take messages in until nothing more can arrive from the peer, for up to
        ``timeout`` s; whether it came to that."""
        deadline = time.monotonic() + timeout
        bell = self.bell
        while not self._ended.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            # a look every 50 ms: the link's end is marked just after its bell rang
            if ready([bell], min(remaining, 0.05)):
                bell.clear()
        return True

    def _drain_beats(self) -> bool:
        """Rank 0: take in what came, the beats' answers with it, while the collecting thread
        is busy elsewhere (the pulse calls it); the answers note themselves."""
        self._receiver.drain()
        return False

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
        return self._until_ended(max(0.0, timeout))

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
