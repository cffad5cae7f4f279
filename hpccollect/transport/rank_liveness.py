"""``RankLiveness``: the heartbeats of a rank link (``RankChannel``'s liveness half). Each end
tells the other it lives and notes what it hears; ``silence`` tells a peer silent past the
timeout (``RankChannel.lose`` then fails the link). The beats' pace and watch are
``heartbeat.py``'s.

Over a group whose sends cannot be polled (gloo), rank 0 beats on the heartbeats' tag and the
collector rank answers each beat on the messages' tag: rank 0 takes the answers with that
rank's messages (``notices.py``; the pulse takes them in while the collecting thread is busy
elsewhere), so it runs no thread for heartbeats at all."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hpccollect.transport.heartbeat import Heartbeat
from hpccollect.transport.wire import BEATS, MESSAGES

__all__ = ["RankLiveness"]


class RankLiveness:
    """The liveness methods of ``RankChannel``; what they use of the channel is declared."""

    peer: int
    device: torch.device
    groups: Any
    _beat: Heartbeat | None
    _beat_out: torch.Tensor
    _failure: str | None
    _stopped_by_peer: bool
    _send_lock: Any
    _closed: bool
    _sent_shutdown: bool

    _group: Callable[[], Any]
    _told: Callable[[], None]

    def start_heartbeats(self, timeout: float | None) -> None:
        """Beat to the peer (over gloo, a collector rank answers rank 0's beats instead) and
        watch its beats, so that ``silence`` tells a peer silent for ``timeout`` s (see
        ``heartbeat.py``). None, or wire buffers on a GPU: no heartbeats (a second thread's
        transfers would interleave with the collector's on one communicator)."""
        if timeout is None or self.device.type != "cpu" or self._beat is not None:
            return
        self._beat = Heartbeat(
            timeout,
            self._send_beat,
            self._drain_beats,
            pollable=self.groups.polled,
            answers=self.groups.rank != 0,
        )

    def answer_beat(self) -> None:
        """Answer the beat the peer just sent (the end that ``answers``), and tell the peer
        the answer came where it learns of messages that way; raises when the link is
        closed."""
        self._beat.answer()
        self._told()

    def silence(self) -> str | None:
        beat = self._beat
        return None if beat is None else beat.silence()

    def lost_peer(self) -> str | None:
        """Why the link failed before the peer said stop (it went silent, its connection
        broke), or None."""
        return None if self._stopped_by_peer else self._failure

    def _peer_done(self, beat: Heartbeat) -> None:
        """The peer said it is done: its silence from now on means nothing."""
        beat.stop()

    def _heard(self) -> None:
        """A message came from the peer: it lives."""
        beat = self._beat
        if beat is not None:
            beat.note()

    def _send_beat(self) -> Any:
        """Post one heartbeat; what to wait for. A beat that answers rank 0's goes on the
        messages' tag, between two messages (never between the parts of one)."""
        beat = self._beat
        if beat is not None and beat.answers:
            with self._send_lock:
                if self._closed or self._sent_shutdown:  # nothing would take it after that
                    raise ConnectionError("the channel is closed")
                return self._group().send([self._beat_out], self.peer, MESSAGES)
        return self._group().send([self._beat_out], self.peer, BEATS)

    def _drain_beats(self) -> bool:
        """Take the peer's heartbeats that no receiving thread takes (the pulse calls it);
        whether any came."""
        return False
