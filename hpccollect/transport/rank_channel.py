"""``RankChannel``: the protocol's messages between rank 0 and one collector rank (or a gatherer
and one of its ranks); the same ``Channel`` the pool and the worker loop use for local processes.

Every message is a frame on the link's control connection (``control.py``); tensors alone go
on the data plane (``groups.py``), each transfer announced by its frame. A batch is sent from
its flat buffer (``batches.FlatLayout``, agreed once in ``LAYOUT``) into the receive rank 0
keeps posted for it, then its ``BATCH`` frame says it is there: a rank stopped mid-transfer
never holds rank 0 (its frame never comes, its heartbeats stop). A report's bytes ride in its
frame. Weights are an ``UPDATE_WEIGHTS`` frame and a point-to-point send, or a ``BROADCAST``
frame on every link and one broadcast. Rank 0 reads its links in the thread that waits for them
(no thread per rank); a collector rank reads its link in a thread of its own, which joins each
broadcast as it is announced and queues one update for the collector's loop.
"""

from __future__ import annotations

import datetime
import pickle
import threading
import time
from collections import deque
from dataclasses import dataclass
from itertools import starmap
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from hpccollect._compat import foreach_copy_
from hpccollect.protocol import Command, Layout, Message, Reply, message
from hpccollect.transport.base import Channel, PeerLife
from hpccollect.transport.batches import HEADER, FlatLayout, Slot, Spares
from hpccollect.transport.control import BEAT, BEATS, Frame, Link

__all__ = ["BATCH", "BROADCAST", "Closed", "RankChannel", "first_line"]

KINDS: list[Command | Reply] = [*Command, *Reply]
CODE = {kind: i for i, kind in enumerate(KINDS)}
BATCH = CODE[Reply.BATCH]
BROADCAST = len(KINDS)  # weights follow in the job's broadcast (not a protocol message)
#: data-plane tags: batches, and weights sent point to point
_BATCHES, _WEIGHTS = 0, 1
#: bytes from which a batch keeps the buffer it arrived in rather than being copied out
_KEEP_AT = 1 << 18
_GRACE = 2.0  # s: a rank's connection is seen closed this soon after its process ended
#: the message a collector rank's reading thread queues for a broadcast (its ACK is not sent)
_BROADCAST_UPDATE = (Command.UPDATE_WEIGHTS, None)


@dataclass(frozen=True)
class _WireLayout:
    """``LAYOUT`` as it travels: the batch's flat layout instead of the batch."""

    batch: FlatLayout
    host: str
    pid: int
    weights_nbytes: int
    frames: int = 0
    inline: bool = False  # its batches are reports, their bytes in their frames


class Closed:
    """What the inbox holds once the peer is gone: every later ``recv`` fails with ``why``."""

    def __init__(self, why: str) -> None:
        self.why = why


class RankChannel(Channel):
    """One end of the link between rank 0 and collector rank ``peer`` (or rank 0 seen from a
    collector rank).

    Args:
        groups: this process's ``RankGroups`` (the data plane).
        peer: the other end's rank.
        link: the link's control connection.
        process: on rank 0, what controls the peer's process when the launcher has one (its
            death, join and kill); None when the launcher cannot (ranks started by mpirun).
        device: where the data plane's buffers live (``cuda`` for nccl).
        send_timeout: seconds a transfer may take once announced.
    """

    polled = True  # messages may wait in the inbox: waiters look at ``poll(0)`` first

    def __init__(
        self,
        groups: Any,
        peer: int,
        link: Link,
        *,
        process: Any = None,
        device: Any = "cpu",
        send_timeout: float = 600.0,
    ) -> None:
        self.groups, self.peer, self.link = groups, peer, link
        self.rank = peer  # what errors call the peer (its number in the whole MPI job)
        self.device = torch.device(device)
        self.life = RankLife(self, process)
        self.local = False
        self.peer_weights_nbytes: int | None = None
        self._timeout = send_timeout
        self._failure: str | None = None
        self._closed = False
        self._inbox: deque = deque()
        self._arrived = threading.Condition()  # a collector rank's reading thread fills the inbox
        self._reader: threading.Thread | None = None
        self._reading = threading.Lock()  # rank 0: the thread reading the link now
        self._told_stop = False  # the peer sent SHUTDOWN
        # batches: what this side sends from, and what the peer's arrive in
        self._placed: tuple | None = None
        self._inline = False  # batches are reports: their bytes ride in their frames
        self._batch_out: tuple[torch.Tensor, list, list] | None = None
        self._in_layout: FlatLayout | None = None
        self._in_views: TensorDictBase | None = None
        self._spares = Spares(self._made_for)
        self._in_slot: Slot | None = None
        self._landed: Slot | None = None
        self._posted: list[Any] = []  # the receive the peer's next batch lands in
        self._held: deque = deque()  # frames read during a transfer, for their turn
        # weights: a collector rank counts the updates its loop took (each batch says the
        # version it was collected with), and folds broadcasts that come while one is queued
        # into it (the loop loads the newest)
        self._weights: torch.Tensor | None = None
        self._queued = False
        self._silent_acks = 0
        self._taken = 0
        self.batch_version = 0

    # ------------------------------------------------------------------ sending
    def send(self, message_: Message) -> None:
        kind, payload = message_
        if self._failure is not None:
            raise ConnectionError(self._failure)
        if kind is Reply.BATCH:
            self._send_batch(payload)
            return
        if kind is Reply.ACK and self._silent_acks:
            self._silent_acks -= 1  # a broadcast update's: rank 0 does not wait for it
            return
        if kind is Reply.LAYOUT:
            payload = self._announce(payload)
        value, blob = _encode(kind, payload)
        self._send_frame(Frame(CODE[kind], value, 0, 0, blob))

    def _send_frame(self, frame: Frame) -> None:
        try:
            self.link.send(frame)
        except ConnectionError as err:
            self._failure = self._failure or str(err)
            raise ConnectionError(self._failure) from err

    def _send_batch(self, value: int) -> None:
        """Torch's groups move a posted receive on their own: the batch goes into the receive
        rank 0 keeps posted, and only then is it announced, so rank 0 never waits on a sender
        stopped mid-way (a torch wait that times out closes the group). MPI moves a message
        only while both ends are inside MPI: the send is posted, announced, then seen through,
        and rank 0 receives it as it reads the frame (its wait watches the link)."""
        flat, dst, src = self._batch_out
        if dst:
            foreach_copy_(dst, src)
        if self._inline:  # a report: a control message like any other
            self._send_frame(Frame(BATCH, value, self._taken, 0, flat.numpy().tobytes()))
            return
        frame = Frame(BATCH, value, self._taken, flat.numel())
        work = self._data().send([flat], self.peer, _BATCHES)
        if self._announce_first():
            self._send_frame(frame)
            self._transfer(work, "its batch")
        else:
            self._transfer(work, "its batch")
            self._send_frame(frame)

    def _announce_first(self) -> bool:
        """Whether a batch is announced before it is sent (see ``_send_batch``)."""
        return not getattr(self.groups.messages, "progresses_alone", True)

    def post_weights(self, flat: torch.Tensor) -> Any:
        """Send ``UPDATE_WEIGHTS`` with ``flat`` following point to point (the work to wait
        for, with ``wait_sent``)."""
        self._send_frame(Frame(CODE[Command.UPDATE_WEIGHTS], 0, 0, flat.numel()))
        try:
            return self._data().send([flat], self.peer, _WEIGHTS)
        except RuntimeError as err:
            self._failure = self._failure or f"closed the connection ({first_line(err)})"
            raise ConnectionError(self._failure) from err

    def wait_sent(self, work: Any) -> None:
        """Wait for a ``post_weights`` send, bounded like every transfer."""
        self._transfer(work, "the weights")

    def announce_broadcast(self, nbytes: int) -> None:
        """Tell the peer that weights of ``nbytes`` follow in the job's broadcast (before the
        broadcast itself); ``ConnectionError`` when the peer is gone."""
        self._send_frame(Frame(BROADCAST, 0, 0, nbytes))

    def _transfer(self, work: Any, what: str) -> None:
        """Wait for a data-plane transfer announced on the control plane, bounded."""
        try:
            work.wait(datetime.timedelta(seconds=self._timeout))
        except Exception as err:
            self._failure = self._failure or f"did not complete {what} ({first_line(err)})"
            raise ConnectionError(self._failure) from err

    def _data(self) -> Any:
        group = self.groups.messages
        if group is None:
            raise ConnectionError("the channel is closed")
        return group

    # ------------------------------------------------------------------ receiving
    def poll(self, timeout: float) -> bool:
        if self._inbox:
            return True
        if self._reader is not None:  # a collector rank: its reading thread fills the inbox
            with self._arrived:
                return self._arrived.wait_for(lambda: bool(self._inbox), max(0.0, timeout))
        self._take_in(timeout)
        return bool(self._inbox)

    def recv(self) -> Message:
        inbox = self._inbox
        while not inbox:
            if self._closed:
                raise ConnectionError("the channel is closed")
            if not self.poll(1.0) and self._reader is None and self.life.death() is not None:
                self._take_in(_GRACE)  # the process ended: its connection's end comes next
                if not inbox:
                    raise ConnectionError(self.life.death() or "the rank ended")
        with self._arrived:
            item = inbox.popleft()
            if item is _BROADCAST_UPDATE:
                self._queued = False
                self._silent_acks += 1
                self._taken += 1
            elif item.__class__ is not Closed and item[0] is Command.UPDATE_WEIGHTS:
                self._taken += 1
        if item.__class__ is Closed:
            inbox.appendleft(item)  # every later recv fails the same way
            raise ConnectionError(item.why)
        return item

    def pending(self) -> bool:
        """Whether ``recv`` returns at once, or a frame read meanwhile waits its turn."""
        return bool(self._inbox or self._held)

    def _take_in(self, timeout: float = 0.0) -> None:
        """Rank 0: read every frame that came (up to ``timeout`` s for the first) into the
        inbox, receiving a batch's or weights' data as its frame is read."""
        link = self.link
        with self._reading:  # one thread reads the link at a time
            if self._closed or self._failure is not None:
                return
            wait = timeout
            while self._held or link.ready(wait):
                wait = 0.0
                if not self._one_frame():
                    return

    def _one_frame(self) -> bool:
        """Read one frame and act on it; False once nothing more comes on the link."""
        try:
            frame = self._held.popleft() if self._held else self.link.take()
            item = self._read(frame)
        except Exception as err:  # the peer is gone, or the groups were closed
            self.link_closed(f"closed the connection ({first_line(err)})")
            return False
        if item is not None:
            with self._arrived:
                self._inbox.append(item)
                self._arrived.notify_all()
        return not (item is not None and item[0] is Command.SHUTDOWN)

    def _read(self, frame: Frame) -> Any:
        """The inbox item ``frame`` makes (None: none), its data received."""
        kind = frame.kind
        if kind == BEAT:
            return None
        if kind == BATCH:  # in the buffer already, or received now (``_send_batch``)
            self.batch_version = frame.version
            if frame.payload:  # a report: its bytes came in the frame
                report = torch.frombuffer(bytearray(frame.payload), dtype=torch.uint8)
                self._in_slot.buffer[: report.numel()].copy_(report)
            else:
                if not self._posted:
                    receive = self._data().recv([self._in_slot.buffer], self.peer, _BATCHES)
                    self._posted.append(receive)
                self._transfer(self._posted[0], "a batch")
            self._batch_landed()
            self._post_batch_receive()
            return Reply.BATCH, frame.value
        if kind == BROADCAST:
            self._transfer(self.groups.broadcast.broadcast(self._weights, 0), "a broadcast")
            with self._arrived:
                if self._queued:
                    return None  # the queued update loads these newest weights
                self._queued = True
            return _BROADCAST_UPDATE
        what = KINDS[kind]
        if what is Command.UPDATE_WEIGHTS:
            if self._weights is None:
                raise RuntimeError("weights arrived for a policy without parameters")
            self._transfer(self._data().recv([self._weights], self.peer, _WEIGHTS), "weights")
            return what, None
        if what is Command.SHUTDOWN:
            self._told_stop = True
        payload = _decode(what, frame.value, frame.payload)
        if what is Reply.LAYOUT:
            payload = self._adopt(payload)
        return what, payload

    def unexpect(self) -> None:
        """Drop the receive posted for the next batch (the groups were aborted; it holds them,
        and their store's port, while kept)."""
        self._posted.clear()

    def _silent_mid_transfer(self) -> str | None:
        """While rank 0 receives a batch announced first: why the peer counts as lost, or None.
        Its heartbeats are taken here (a slow transfer from a live peer is never silence), other
        frames kept for their turn; a link that ended ends the wait at once."""
        link = self.link
        while link.ready(0):
            if link.ended():  # what it sent before is kept; the transfer cannot complete
                return "closed its control connection mid-transfer (its process ended)"
            frame = link.take()
            if frame.kind != BEAT:
                self._held.append(frame)
        return link.silence()

    def start_reading(self) -> None:
        """A collector rank: read the link in a thread of its own, which joins each weight
        broadcast as it is announced while the collector collects."""
        self._reader = threading.Thread(
            target=self._read_loop, name=f"hpccollect-rank{self.peer}-link", daemon=True
        )
        self._reader.start()

    def _read_loop(self) -> None:
        while not self._closed and self._one_frame():
            pass

    def link_closed(self, why: str) -> None:
        """Count the peer as gone for ``why`` (its link ended, or it went silent): every later
        send and receive fails with it, and a receive waiting now wakes to fail."""
        self._failure = self._failure or why
        with self._arrived:
            self._inbox.append(Closed(self._failure))
            self._arrived.notify_all()

    def handles(self) -> list[Any]:
        if self._closed:
            return []
        handles: list[Any] = [self.link]
        if self.life.sentinel is not None:
            handles.append(self.life.sentinel)
        return handles

    # ------------------------------------------------------------------ batches
    def batch_buffers(self, batch: TensorDictBase) -> TensorDictBase:
        """Buffers laid out like ``batch`` in the memory batches leave from: the collector
        writes there and a batch is sent as it lies."""
        layout = FlatLayout.of(batch)
        flat, views = layout.allocate(self.device)
        self._placed = (layout, flat, views)
        return views

    def report_buffers(self, report: TensorDictBase) -> TensorDictBase:
        """Buffers laid out like ``report``, whose bytes travel in each report's frame: the data
        plane's per-transfer cost is paid for batches only."""
        layout = FlatLayout.of(report)
        flat, views = layout.allocate("cpu")
        self._placed, self._inline = (layout, flat, views), True
        return views

    def _announce(self, layout: Layout) -> _WireLayout:
        """Set up the buffer batches leave from: the placed one, or a copy of ``layout.batch``."""
        if self._placed is not None and layout.batch is self._placed[2]:
            flat_layout, flat, _ = self._placed
            self._batch_out = (flat, [], [])
        else:
            flat_layout = FlatLayout.of(layout.batch)
            flat, views = flat_layout.allocate(self.device)
            self._batch_out = (flat, flat_layout.leaves(views), flat_layout.leaves(layout.batch))
        weights = 0 if self._weights is None else self._weights.numel()
        return _WireLayout(
            flat_layout, layout.host, layout.pid, weights, layout.frames, self._inline
        )

    def _adopt(self, wire: _WireLayout) -> Layout:
        """Receive the peer's batches into a buffer laid out as announced, whose views are the
        batch the collector reads."""
        self._in_layout = wire.batch
        self._inline = wire.inline
        self.peer_weights_nbytes = wire.weights_nbytes
        self.life.host, self.life.pid = wire.host, wire.pid
        self._in_slot = self._spares.slot(
            torch.zeros(max(wire.batch.nbytes, HEADER), dtype=torch.uint8, device=self.device)
        )
        batch = wire.batch.views(self._in_slot.buffer)  # holds it for good: never a spare
        self._in_views = batch
        watch = getattr(self._data(), "watch", None)
        if watch is not None:  # a transfer announced first: its wait ends if the peer goes silent
            watch(self.peer, self._silent_mid_transfer)
        self._post_batch_receive()
        return Layout(batch, wire.host, wire.pid, frames=wire.frames)

    def _post_batch_receive(self) -> None:
        """Keep a receive posted for the peer's next batch (one in flight at most), until the
        groups are aborted: a gloo receive dropped while pending holds gloo's loop for good
        once its message comes. The post and its keeping are C calls alone (``list.extend``
        over ``starmap``): a Ctrl-C's ``KeyboardInterrupt`` cannot land between them."""
        group = self._data()
        self._posted.clear()
        if not self._announce_first() and not self._inline:
            self._posted.extend(
                starmap(group.recv, (([self._in_slot.buffer], self.peer, _BATCHES),))
            )

    def _made_for(self, flat: torch.Tensor) -> tuple:
        """Each leaf's view into ``flat`` (made once per buffer)."""
        layout = self._in_layout
        return (layout, None if layout is None else layout.leaf_views(flat))

    def _batch_landed(self) -> None:
        """A large batch keeps the buffer it came into and the next comes into another, so the
        caller keeps it without a copy (one batch in flight per link); ``own`` copies a small
        one."""
        if self._in_slot.buffer.numel() >= _KEEP_AT:
            self._landed = self._in_slot
            self._in_slot = self._spares.next_after(self._in_slot)

    def latest(self, batch: TensorDictBase) -> TensorDictBase:
        """The batch that arrived last, laid out as ``batch`` (the announced layout)."""
        if self._landed is None or batch is not self._in_views:
            return batch
        return self._in_layout.alias(self._leaves(self._landed))

    def own(self, batch: TensorDictBase) -> TensorDictBase:
        """The batch that arrived last, the caller's to keep: no later message lands in it."""
        if self._in_views is None or batch is not self._in_views:
            return batch.clone()
        if self._landed is None:
            return self._in_layout.own(self._leaves(self._in_slot))
        return self._in_layout.own(self._leaves(self._landed), copy=False)

    def _leaves(self, slot: Slot) -> tuple[torch.Tensor, ...]:
        layout, leaves = slot.made
        if layout is self._in_layout and leaves is not None:
            return leaves
        return self._in_layout.leaf_views(slot.buffer)

    # ------------------------------------------------------------------ weights
    def weights_buffer(self, policy: Any) -> TensorDictBase | None:
        """The views into the flat buffer weights arrive in on a collector rank (laid out as
        rank 0 lays out its own), which ``UPDATE_WEIGHTS`` loads."""
        if not isinstance(policy, nn.Module):
            return None
        weights = TensorDict.from_module(policy).data
        if weights.is_empty():
            return None
        layout = FlatLayout.of(weights, "policy weight")
        self._weights, views = layout.allocate(self.device)
        return views

    # ------------------------------------------------------------------ the peer's life
    def start_heartbeats(self, timeout: float | None) -> None:
        """Beat to the peer; ``silence`` then tells a peer silent past the link's timeout."""
        BEATS.add(self.link)

    def silence(self) -> str | None:
        if self._told_stop:
            return None
        if self._reader is None:
            self._take_in()  # the beats that came while no one looked
        return self.link.silence()

    def lost_peer(self) -> str | None:
        """Why the link failed before the peer said stop (it went silent, its connection
        broke), or None."""
        return None if self._told_stop else self._failure

    def join_peer(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the peer's end, seen through its connection."""
        deadline = time.monotonic() + timeout
        while self._failure is None and not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._reader is None:
                self._take_in(min(left, 0.1))
            else:
                time.sleep(min(left, 0.05))
        return True

    def gone(self) -> str | None:
        """How the connection ended, once nothing more can arrive on it; None while open."""
        return self._failure

    def describe(self) -> str:
        pid = f"pid {self.pid}, " if self.pid is not None else ""
        where = self.life.where
        return f"collector rank {self.rank} ({pid}{self.host}{', ' + where if where else ''})"

    def join_threads(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the reading thread (it ends with the link)."""
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(max(0.0, timeout))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.link.close()
        self.life.close()


class RankLife(PeerLife):
    """A collector rank's life as rank 0 sees it: what the launcher's process tells (when it
    has one), else the connection (a rank that closed it is gone)."""

    def __init__(self, channel: RankChannel, process: PeerLife | None) -> None:
        self._channel, self._process = channel, process
        self.host = getattr(process, "host", "") or "?"
        self.pid = getattr(process, "pid", None)
        self.sentinel = getattr(process, "sentinel", None)
        self.where = getattr(process, "where", "")
        self.can_end = process is not None and process.can_end

    def death(self, wait: float = 0.0) -> str | None:
        if self._process is not None:
            how = self._process.death(wait)
            if how is not None:
                return how
        return self._channel.gone()

    def join(self, timeout: float) -> bool:
        if self._process is not None:
            return self._process.join(timeout)
        return self._channel.join_peer(timeout)

    def kill(self) -> None:
        if self._process is not None:
            self._process.kill()

    def close(self) -> None:
        if self._process is not None:
            self._process.close()


def _encode(kind: Command | Reply, payload: Any) -> tuple[int, bytes]:
    """The frame's int value and the pickled payload (empty for None, ints and bools)."""
    if payload is None:
        return 0, b""
    if isinstance(payload, int) and kind.payload in (int, bool):
        return int(payload), b""
    return 0, pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)


def _decode(kind: Command | Reply, value: int, blob: bytes) -> Any:
    """The payload ``_encode`` made, checked against ``kind`` (a ``_WireLayout`` as it is)."""
    if kind.payload is bool:
        return bool(value)
    if kind.payload is int:
        return value
    if not blob:
        return None
    payload = pickle.loads(blob)
    return payload if isinstance(payload, _WireLayout) else message(kind, payload)[1]


def first_line(err: BaseException) -> str:
    """The first line of an error's text, for a one-line reason."""
    text = str(err).strip().splitlines()
    return text[0][:200] if text else type(err).__name__
