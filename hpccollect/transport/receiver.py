"""``Receiver``: the receiving side of a collector rank's link to rank 0 over a process group
whose receives cannot be polled (gloo), and of rank 0's links where the job has no store to set
up notices through (``notices.py`` is rank 0's way otherwise).

A gloo receive is seen complete only by a thread that waits in it: ``is_completed()`` stays
False until someone calls ``wait()``, a wait cannot be interrupted (``abort`` and ``shutdown``
leave it blocked), and a wait that times out closes the group's connections for good. One
receive from any source for every link is no way around it (tried): it does not fail when a
rank's connection does, only a message ends it, and once one rank was stopped (SIGSTOP, as a
lost node looks) it took no further message from any rank in some runs. So each link served
here has a thread that waits in its receive (it ends when the link does, which is also how a
peer that died is seen at once). A collector rank also runs one that receives rank 0's beats
and answers them on the messages' tag (``rank_liveness.py``).

What the threads receive goes to the link's inbox and rings the process's one ``Doorbell``,
which the waiting thread watches beside the launcher's processes (no pipe per link).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from hpccollect.transport.batches import HEADER
from hpccollect.transport.doorbell import Doorbell
from hpccollect.transport.wire import BEATS

__all__ = ["Receiver"]

#: s a closing receiver waits for its threads, all together: those of links that ended are
#: done by then, and a receive from a peer that is still there (a collector rank's heartbeats
#: from rank 0) or went silent cannot be ended (it ends with the process)
_JOIN = 0.5


class Receiver:
    """Receives for every ``WaitedRankChannel`` of one ``RankGroups`` (see the module)."""

    def __init__(self) -> None:
        self.bell = Doorbell()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def add(self, channel: Any) -> None:
        """Receive ``channel``'s messages from now on."""
        self._start(self._messages, f"hpccollect-rank{channel.peer}-recv", channel)

    def hear_beats(self, channel: Any) -> None:
        """Receive ``channel``'s heartbeats too, and answer each (a collector rank's link,
        once its heartbeats start)."""
        self._start(self._beats, f"hpccollect-rank{channel.peer}-beats", channel)

    def close(self) -> None:
        """Once the groups are aborted: wait a moment for the threads (see ``_JOIN``), and
        release the bell; idempotent."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + _JOIN
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        self.bell.close()

    def _start(self, target: Any, name: str, channel: Any) -> None:
        self._threads = [t for t in self._threads if t.is_alive()]
        thread = threading.Thread(target=target, args=(channel,), name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def drain(self) -> None:
        """Nothing to take in: the threads take every message as it comes."""

    def _messages(self, channel: Any) -> None:
        channel.expect()
        while channel.noticed():  # waits in the posted receive until the message comes
            pass

    def _beats(self, channel: Any) -> None:
        """Rank 0's heartbeats, each received as it comes (a gloo send completes only into a
        posted receive) and answered; ends when the link does, or stays in an answer that rank
        0 never took (it ended the link first: the process's end ends it)."""
        beat = torch.empty(HEADER, dtype=torch.uint8, device=channel.device)
        while True:
            try:
                channel._group().recv([beat], channel.peer, BEATS).wait()
            except Exception:  # the peer is gone, or the groups were aborted
                return
            if channel._closed:  # the peer's beat that lets this thread go (``_peer_done``)
                return
            channel._heard()
            try:
                channel.answer_beat()
            except Exception:  # the link is closed
                return
