"""``ThreadedRankChannel``: a ``RankChannel`` over torch process groups, whose receives cannot
be polled: a thread blocks in each receive and hands messages over through a pipe."""

from __future__ import annotations

import contextlib
import os
import threading
from multiprocessing.connection import wait
from typing import Any

import torch

from hpccollect.protocol import Command, Message
from hpccollect.transport.batches import HEADER
from hpccollect.transport.rank_channel import BEATS, MESSAGES, Closed, RankChannel
from hpccollect.transport.wire import first_line

__all__ = ["ThreadedRankChannel"]


class ThreadedRankChannel(RankChannel):
    """A ``RankChannel`` over torch process groups: a thread blocks in ``recv`` from the peer
    and hands messages over through a pipe, so ``multiprocessing.connection.wait`` watches
    ranks like local processes (a blocking receive is the only reliable way: gloo cannot poll,
    and a timed-out receive closes the pair for good). A peer that dies closes the connection,
    which ends that receive at once."""

    def __init__(self, groups: Any, peer: int, **kwargs: Any) -> None:
        super().__init__(groups, peer, **kwargs)
        self._writers += 1
        self._thread = threading.Thread(
            target=self._receive_loop, name=f"hpccollect-rank{peer}-recv", daemon=True
        )
        self._thread.start()

    def _receive_loop(self) -> None:
        try:
            while True:
                try:
                    item = self._receive_one()
                except Exception as err:  # the peer is gone, or the groups were aborted
                    self._failure = self._failure or f"closed the connection ({first_line(err)})"
                    self._hand_over(Closed(self._failure))
                    return
                self._hand_over(item)
                if item[0] is Command.SHUTDOWN:
                    return
        finally:
            self._writer_done()

    def _receive_one(self) -> Message:
        """The next message from the peer (noted as a sign of life)."""
        self._group().recv([self._recv_buf], self.peer, MESSAGES).wait()
        self._heard()
        return self._read_message()

    def start_heartbeats(self, timeout: float | None) -> None:
        super().start_heartbeats(timeout)
        if self._beat is not None and self._beat_receiver is None:
            self._beat_receiver = threading.Thread(
                target=self._receive_beats, name=f"hpccollect-rank{self.peer}-beats", daemon=True
            )
            self._beat_receiver.start()

    def _receive_beats(self) -> None:
        """The peer's heartbeats, each received as it comes (a gloo send completes only into a
        posted receive); ends when the link does."""
        beat = torch.empty(HEADER, dtype=torch.uint8, device=self.device)
        while True:
            try:
                self._group().recv([beat], self.peer, BEATS).wait()
            except Exception:  # the peer is gone, or the groups were aborted
                return
            self._heard()

    def poll(self, timeout: float) -> bool:
        return bool(self._inbox) or bool(self._ready(timeout))

    def _await(self, timeout: float) -> None:
        ready = self._ready(timeout)
        if ready and self._rfd not in ready and not self._inbox:
            # the process ended: its connection's end is reported within moments
            wait([self._rfd], 2.0)
            if not self._inbox:
                raise ConnectionError(self.death() or "the rank ended")

    def _taking(self) -> None:
        with contextlib.suppress(OSError):
            os.read(self._rfd, 1)

    def join_peer(self, timeout: float) -> bool:
        self._thread.join(max(0.0, timeout))
        return not self._thread.is_alive()
