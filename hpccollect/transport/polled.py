"""``PolledRankChannel``: a ``RankChannel`` over a group whose receives can be polled
(``can_poll``: the mpi4py transport). It needs no receiving thread: the caller probes for the
next message itself, which saves the hand-over (most of a small batch's cost), and a batch is
sent and received through arrays of the wire buffers made once (the hot path).

A collector rank's weight thread waits in the broadcast by polling too; each look takes the GIL
from the collecting thread, so it looks seldom while the rank collects and often while the rank
waits for rank 0 (``_waiting``).
"""

from __future__ import annotations

import contextlib
import select
import time
from collections.abc import Iterator
from typing import Any

import torch

from hpccollect.errors import CollectorTimeoutError
from hpccollect.protocol import Layout
from hpccollect.transport.batches import Slot
from hpccollect.transport.doorbell import Doorbell
from hpccollect.transport.link_look import LinkLook
from hpccollect.transport.mpi_waits import BUSY_SLEEP, IDLE_SLEEP, SPIN, wait_request
from hpccollect.transport.rank_channel import BATCH, BATCH_REPLY, RankChannel
from hpccollect.transport.wire import BEATS, MESSAGES, WireLayout, first_line

__all__ = ["PolledRankChannel"]

_NOTHING = contextlib.nullcontext()  # ``_waiting`` where there is nothing to do


class _Sent:
    """The work of a send already seen through (``_send_now``)."""

    def wait(self, timeout: Any = None) -> bool:
        return True


_SENT = _Sent()


class PolledRankChannel(RankChannel):
    """A ``RankChannel`` whose caller receives each message itself (see the module)."""

    polled = True

    def __init__(self, groups: Any, peer: int, **kwargs: Any) -> None:
        self._mpi = groups.messages  # makes the receive buffers' wire arrays
        #: the look this link shares with its group's other links (``link_look.py``); None
        #: where its peer's process is watched by its sentinel, which only its own look sees
        self.look: LinkLook | None = None
        super().__init__(groups, peer, **kwargs)
        self._out_wire: Any = None
        self._pace: Any = None  # how often the broadcast thread looks (see ``_waiting``)
        self._idle = False
        self._beat_in = self._mpi.wire(torch.empty_like(self._beat_out))
        self._head_wire = self._mpi.wire(self._head_out[0])  # a command's header goes from it
        self._poller = select.poll()  # the bell (once there is one) and the rank's process
        if self.life.sentinel is not None:
            self._poller.register(self.life.sentinel, select.POLLIN)
        else:
            self.look = LinkLook.of(self._mpi)
            self.look.add(self)

    # ------------------------------------------------------------------ buffers
    def _announce(self, layout: Layout) -> WireLayout:
        wire = super()._announce(layout)
        self._out_wire = self._mpi.wire(self._batch_out[0])
        return wire

    def _made_for(self, flat: torch.Tensor) -> tuple:
        return (*super()._made_for(flat), self._mpi.wire(flat))

    def _use_recv_buf(self, slot: Slot) -> None:
        super()._use_recv_buf(slot)
        self._in_wire = slot.made[-1]

    def _post_header(self) -> Any:
        if self._sent_shutdown:  # seen through within the shutdown's own timeout
            return super()._post_header()
        # from its kept array, seen through at once (so small a send completes without the
        # peer): a work object kept until the next command and waited on then made a third of
        # what rank 0 spent on each COLLECT
        self._send_now(self._head_wire, MESSAGES)
        return _SENT

    def _send_batch(self, flat: torch.Tensor) -> None:
        self._send_now(self._out_wire, MESSAGES)

    def _send_now(self, wire: Any, tag: int) -> None:
        """Send ``wire`` and see it through in one call, making no work object (failing as
        ``_post`` and ``_wait`` do)."""
        try:
            self._mpi.send_now(wire, self.peer, tag, self._send_seconds)
        except RuntimeError as err:  # the group was closed or the peer said goodbye
            self._failure = self._failure or f"closed the connection ({first_line(err)})"
            raise ConnectionError(self._failure) from err
        except Exception as err:
            self._failure = self._failure or f"stopped taking messages ({first_line(err)})"
            raise ConnectionError(self._failure) from err

    # ------------------------------------------------------------------ receiving
    def holds(self) -> bool:
        """Whether ``recv`` returns at once (a message, or the link's end, is in the inbox)."""
        return bool(self._inbox)

    def _hand_over(self, item: Any, ring: bool = True) -> None:
        super()._hand_over(item, ring)
        if self.look is not None:
            self.look.holding(self)

    def poll(self, timeout: float) -> bool:
        if self._inbox:
            return True
        # the hot path: the next message is here, or comes within a spin
        if self._try_take(SPIN if timeout > SPIN else timeout):
            return True
        if timeout <= 0 and not self._may_have_ended():
            # a look (rank 0 makes one per link each time it looks for a batch): MPICH moves
            # a message in only inside a call, so the message that call brought is taken now
            return self._try_take(0.0)
        deadline = time.monotonic() + timeout
        while not self._inbox and not self._closed:
            took = self._take(deadline - time.monotonic())
            if took == "ended":
                return True
            if took == "timeout":
                break
        return bool(self._inbox)

    def _try_take(self, spin: float) -> bool:
        """Receive the next message into the inbox if it is here or comes within ``spin`` s;
        whether the inbox has something now (that message, or the link's end)."""
        try:
            if not self._mpi.try_recv(self._in_wire, self.peer, MESSAGES, spin, self._send_seconds):
                return False
            self._received()
        except Exception as err:
            self._closed_by(err)
        return True

    def _may_have_ended(self) -> bool:
        """Whether ``_take`` has more than a message to look for: the peer said goodbye, its
        process ended, or the bell rang. One test of each, where ``_take`` would make three of
        its receive and raise its wait's timeout."""
        if self._poller.poll(0):
            return True
        try:
            return self._mpi.stopped(self.peer) is not None
        except Exception:
            return True

    def _await(self, timeout: float) -> None:
        if self._take(timeout) == "ended":
            raise ConnectionError(self.life.death(2.0) or "the rank ended")

    def _take(self, timeout: float) -> str:
        """Wait up to ``timeout`` s for the next message and put it in the inbox. "took",
        "woken" (the broadcast thread queued an update), "ended" (the peer's process ended
        with nothing to receive) or "timeout"."""
        why = "timeout"
        group = self._mpi
        with self._waiting():
            try:
                # a message that is here or comes within moments (a look, 0 s, does not spin)
                if group.try_recv(
                    self._in_wire, self.peer, MESSAGES, min(timeout, SPIN), self._send_seconds
                ):
                    return self._took()
                timeout = max(0.0, timeout)

                def come() -> bool:
                    nonlocal why
                    if group.try_recv(self._in_wire, self.peer, MESSAGES, 0.0, self._send_seconds):
                        why = "took"
                        return True
                    for fd, _ in self._poller.poll(0):
                        if self.bell is not None and fd == self.bell.fileno():
                            self.bell.clear()
                            why = "woken"
                        else:
                            why = "ended"
                    return why != "timeout"

                wait_request(come, timeout, "a message", lambda: group.stopped(self.peer), spin=0.0)
            except CollectorTimeoutError:
                return why
            except Exception as err:
                return self._closed_by(err)
            return self._took() if why == "took" else why

    def _took(self) -> str:
        """Read the message just received into ``_recv_buf`` into the inbox: "took"."""
        try:
            self._received()
        except Exception as err:
            return self._closed_by(err)
        return "took"

    def _received(self) -> None:
        """Put the message just received into ``_recv_buf`` into the inbox (a batch's header
        is read inline: the hot path)."""
        self._heard()
        head = self._in_head
        if head[0] == BATCH:  # from a collector rank: the weights version it was collected with
            self.batch_version = head[3]
            item = (BATCH_REPLY, head[2])
            self._batch_landed()
        else:
            item = self._read_message()
        self._hand_over(item, ring=False)

    # ------------------------------------------------------------------ heartbeats
    def _drain_beats(self) -> bool:
        """The peer's heartbeats, taken by the pulse thread (this side's receives are the
        caller's, who may not look for a while)."""
        came = False
        while self._mpi.try_recv(self._beat_in, self.peer, BEATS):
            came = True
        return came

    def _closing(self) -> None:
        if self.bell is not None:
            self.bell.close()

    def join_peer(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout  # receive until the peer's goodbye
        while self._failure is None and not self._closed and time.monotonic() < deadline:
            self._take(deadline - time.monotonic())
        return self._failure is not None

    # ------------------------------------------------------------------ pacing the weights
    def _weights_thread_starts(self) -> None:
        if self.look is not None:  # its waits watch its bell from now on, not the look
            self.look.leave(self)
            self.look = None
        self.bell = Doorbell()  # the broadcast thread wakes a wait for rank 0 with it
        self._poller.register(self.bell.fileno(), select.POLLIN)
        self._pace = getattr(self.groups.broadcast, "pace", None)
        if self._pace is not None:
            self._pace.set(BUSY_SLEEP)

    def _waiting(self) -> contextlib.AbstractContextManager:
        """This collector rank waits for rank 0 instead of collecting: meanwhile its weight
        thread looks for a broadcast every ``IDLE_SLEEP``, otherwise every ``BUSY_SLEEP`` (each
        look takes the GIL from the collection). Nothing to do on rank 0, or inside a wait
        already: then a context made once (rank 0 enters it on every look for a batch)."""
        if self._pace is None or self._idle:
            return _NOTHING
        return self._idle_while()

    @contextlib.contextmanager
    def _idle_while(self) -> Iterator[None]:
        pace = self._pace
        self._idle = True
        pace.set(IDLE_SLEEP)
        try:
            yield
        finally:
            self._idle = False
            pace.set(BUSY_SLEEP)
