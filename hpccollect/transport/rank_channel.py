"""``RankChannel``: protocol messages between rank 0 and one collector rank over a
torch.distributed process group, the same ``Channel`` the pool and the worker loop use for local
processes. What travels, and how it is laid out, is ``wire.py``'s; how messages are waited for
is a subclass's: ``WaitedRankChannel`` (``waited.py``, torch groups) or
``PolledRankChannel`` (``polled.py``, the mpi4py transport). ``RankGroups.channel`` picks one.

How batches cross the link is ``rank_batches.py``'s, weights ``rank_weights.py``'s, the
heartbeats ``rank_liveness.py``'s.
Every message rank 0 sends after a weight broadcast carries the broadcast count, so the rank
hands the update over first. After a rank has announced its batches, other payloads travel in
a message of their own, so a reply never lands in a batch buffer.
"""

from __future__ import annotations

import datetime
import threading
from collections import deque
from itertools import starmap
from typing import Any

import torch
from tensordict import TensorDictBase

from hpccollect.protocol import Command, Message, Reply
from hpccollect.transport.base import Channel
from hpccollect.transport.batches import HEADER, FlatLayout, Slot, Spares
from hpccollect.transport.doorbell import Doorbell
from hpccollect.transport.heartbeat import Heartbeat
from hpccollect.transport.rank_batches import RankBatches
from hpccollect.transport.rank_life import RankLife
from hpccollect.transport.rank_liveness import RankLiveness
from hpccollect.transport.rank_weights import BROADCAST_UPDATE, RankWeights
from hpccollect.transport.wire import (
    BEATS,
    CODE,
    CONTROL,
    KINDS,
    MESSAGES,
    decode,
    encode,
    first_line,
    header,
    put_beat,
    put_header,
)

__all__ = ["BATCH", "BATCH_REPLY", "BEATS", "MESSAGES", "Closed", "RankChannel"]

_SHUTDOWN_TIMEOUT = datetime.timedelta(seconds=5)  # SHUTDOWN is best effort: kill follows
BATCH_REPLY = Reply.BATCH
BATCH = CODE[BATCH_REPLY]


class Closed:
    """What the inbox holds once the peer is gone: every later ``recv`` fails with ``why``."""

    def __init__(self, why: str) -> None:
        self.why = why


class RankChannel(RankBatches, RankLiveness, RankWeights, Channel):
    """One end of the link between rank 0 and collector rank ``peer`` (or rank 0 seen from a
    collector rank): the protocol, whatever waits for the messages (a subclass).

    Args:
        groups: this process's ``RankGroups``.
        peer: the other end's rank.
        process: on rank 0, what controls the peer's process when the launcher has one (its
            death, join and kill); None when the launcher cannot (ranks started by mpirun).
        device: where wire buffers live (``cuda`` for nccl).
        send_timeout: seconds a send may wait for the peer to take it.
    """

    def __init__(
        self,
        groups: Any,
        peer: int,
        *,
        process: Any = None,
        device: Any = "cpu",
        send_timeout: float = 600.0,
    ) -> None:
        self.groups, self.peer = groups, peer
        self.rank = peer  # what errors call the peer (its number in the whole MPI job)
        self.device = torch.device(device)
        self.life = RankLife(self, process)
        self.local = False
        self.peer_weights_nbytes: int | None = None
        self._send_timeout = datetime.timedelta(seconds=send_timeout)
        self._send_seconds = send_timeout
        self._in_layout: FlatLayout | None = None  # how the peer's batches are laid out
        self._spares = Spares(self._made_for)  # the buffers batches landed in
        self._use_recv_buf(
            self._spares.slot(torch.empty(HEADER + CONTROL, dtype=torch.uint8, device=self.device))
        )
        self._batch_out: tuple[torch.Tensor, list, list] | None = None
        self._placed: tuple | None = None
        self._in_views: TensorDictBase | None = None  # the views batches arrive in
        self._landed: Slot | None = None  # the buffer the last large batch came into
        self._weights: torch.Tensor | None = None
        self._failure: str | None = None
        self.broadcasts = 0  # weight broadcasts this side sent to the peer
        self._broadcasts_in = 0  # ... and received from it
        self._weights_arrived = threading.Condition()
        self._broadcast_queued = False  # an UPDATE_WEIGHTS from a broadcast awaits the loop
        self._silent_acks = 0  # acknowledgements of broadcast updates, not sent
        # a collector rank's weight updates handed to its loop (the version its batches are
        # collected with, sent in each batch's header); on rank 0, the last batch's
        self._broadcasts_taken = self._updates_taken = 0
        self.batch_version = 0
        self._inbox: deque = deque()
        self._posted: list[Any] = []  # receives posted from the peer, not yet seen complete
        self._broadcaster: threading.Thread | None = None
        #: rung when a thread other than the caller's puts a message in the inbox (a
        #: subclass's receiving threads, the broadcast thread); None while none does
        self.bell: Doorbell | None = None
        self._closed = False
        self._beat: Heartbeat | None = None
        self._lost = False  # the peer went silent (``lose``)
        self._stopped_by_peer = False  # the peer sent SHUTDOWN
        self._sent_shutdown = False  # ... and this side did
        self._unsent: tuple[Any, torch.Tensor] | None = None  # a command's send (see _send_blob)
        #: tells the peer that it took the head of a message this side sent, where the peer
        #: learns of messages so (rank 0 over gloo: ``notices.py``); None elsewhere
        self._tell: Any = None
        # held while a message's parts are posted: a beat that answers the peer's travels with
        # the messages, between two of them (``RankLiveness._send_beat``)
        self._send_lock = threading.Lock()
        self._beat_out = torch.zeros(HEADER, dtype=torch.uint8)
        head_out = torch.zeros(HEADER, dtype=torch.uint8)
        self._head_out = (head_out, header(head_out))
        put_beat(self._beat_out)

    # ------------------------------------------------------------------ sending
    def send(self, message_: Message) -> None:
        kind, payload = message_
        if self._failure is not None:
            raise ConnectionError(self._failure)
        if kind is BATCH_REPLY:
            flat, dst, src = self._batch_out
            if dst:
                torch._foreach_copy_(dst, src)
            head = self._out_head
            head[0] = BATCH
            head[2] = payload
            head[3] = self._broadcasts_taken + self._updates_taken
            self._send_batch(flat)
            return
        if kind is Reply.ACK and self._silent_acks:
            self._silent_acks -= 1  # a broadcast update's: rank 0 does not wait for it
            return
        if kind is Reply.LAYOUT:
            payload = self._announce(payload)
        value, blob = encode(kind, payload)
        try:
            self._send_blob(kind, value, blob)
        finally:
            if kind is Command.SHUTDOWN:
                self.groups.stop_sent()

    def told_to_stop_or_lost(self) -> bool:
        """Whether this side sent the peer ``SHUTDOWN``, or the link or the peer's process
        failed: the peer takes no weight broadcast again."""
        return self._sent_shutdown or self._failure is not None or self.life.death() is not None

    def wait_sent(self, work: Any) -> None:
        """Wait for a ``post_weights`` send, bounded like every send."""
        self._wait(work)

    def _send_blob(self, kind: Command | Reply, value: int, blob: bytes) -> None:
        # once this side has announced its batches, the peer receives into the batch buffer: a
        # payload then travels apart, so a reply never overwrites a batch not read yet
        room = 0 if self._batch_out is not None else CONTROL
        inline = min(len(blob), room)
        timeout = None
        if kind is Command.SHUTDOWN:
            timeout, self._sent_shutdown = _SHUTDOWN_TIMEOUT, True
        self._settle(timeout)
        alone = not blob and self._failure is None and self.device.type == "cpu"
        if alone:  # a header alone (most commands): the channel's own buffer, free once settled
            head, out = self._head_out
            out[0], out[1], out[2], out[3], out[4] = CODE[kind], 0, value, self.broadcasts, 0
            parts = [head]
        else:
            head = torch.empty(HEADER + inline, dtype=torch.uint8)
            put_header(head, kind, len(blob), value, self.broadcasts, inline)
            if inline:
                head[HEADER:] = torch.frombuffer(bytearray(blob[:inline]), dtype=torch.uint8)
            parts = [head.to(self.device)]
        if len(blob) > inline:
            rest = torch.frombuffer(bytearray(blob[inline:]), dtype=torch.uint8)
            parts.append(rest.to(self.device))
        with self._send_lock:
            for part in parts[:-1]:
                self._wait(self._post(part, MESSAGES), timeout)
            if len(parts) > 1:
                self._told()  # the peer took the head, and receives the rest once it looks
            last = self._post_header() if alone else self._post(parts[-1], MESSAGES)
        if isinstance(kind, Command) and kind is not Command.SHUTDOWN:
            # rank 0 does not wait for a command to be taken: a gloo send completes only into
            # a receive the peer posted, and a rank stopped just before posting it would hold
            # this thread where no liveness check runs. Seen through before the next send;
            # meanwhile rank 0 waits for the reply, and notices a silent rank there.
            self._unsent = (last, parts[-1])
        else:
            self._wait(last, timeout)
            if len(parts) == 1:
                self._told()

    def _told(self) -> None:
        """The peer took the head of a message from this side: tell it so, where it learns of
        messages that way (``_tell``)."""
        if self._tell is not None:
            try:
                self._tell()
            except ConnectionError as err:
                self._failure = self._failure or str(err)
                raise ConnectionError(self._failure) from err

    def _settle(self, timeout: datetime.timedelta | None = None) -> None:
        """See the last command sent through (``_send_blob``) before the next message goes."""
        if self._unsent is not None:
            work, self._unsent = self._unsent[0], None
            self._wait(work, timeout)

    def _post(self, tensor: torch.Tensor, tag: int) -> Any:
        """Start sending ``tensor``; ``ConnectionError`` when the peer is gone."""
        try:
            return self._start_send(tensor, tag)
        except RuntimeError as err:
            self._failure = self._failure or f"closed the connection ({first_line(err)})"
            raise ConnectionError(self._failure) from err

    def _post_header(self) -> Any:
        """Start sending the channel's own header buffer, filled in for a message that is a
        header alone (most commands): its work."""
        return self._post(self._head_out[0], MESSAGES)

    def _start_send(self, tensor: torch.Tensor, tag: int) -> Any:
        """The group's send of ``tensor`` to the peer (its work)."""
        return self._group().send([tensor], self.peer, tag)

    def _send_batch(self, flat: torch.Tensor) -> None:
        """Send the batch buffer, header filled in, and see it through."""
        with self._send_lock:
            work = self._post(flat, MESSAGES)
        self._wait(work)
        self._told()

    def _wait(
        self,
        work: Any,
        timeout: datetime.timedelta | None = None,
        why: str = "stopped taking messages",
    ) -> None:
        try:
            work.wait(timeout or self._send_timeout)
        except Exception as err:
            self._failure = self._failure or f"{why} ({first_line(err)})"
            raise ConnectionError(self._failure) from err

    def _post_receive(self, buffer: torch.Tensor, tag: int) -> None:
        """Post the receive of the peer's next message on ``tag`` into ``buffer``, kept in
        ``_posted`` until it is seen complete.

        The post and its keeping are C calls alone (``list.extend`` over ``starmap``), with no
        Python line between them: Python raises a ``KeyboardInterrupt`` (Ctrl-C) where a C
        call returns to Python code, and one raised after the post, before the receive was
        kept, dropped a posted gloo receive. Its message then stayed in gloo's socket for
        good, and releasing the groups never returned (``RankGroups.close``). A receive kept
        here is dropped only by ``unexpect``, while the groups still hold gloo's context."""
        group = self._group()
        self._posted.extend(starmap(group.recv, (([buffer], self.peer, tag),)))

    def unexpect(self) -> None:
        """Drop the receives posted from the peer (the groups are aborted, and still open)."""
        self._posted.clear()

    def _await_rest(self, buffer: torch.Tensor, tag: int = MESSAGES) -> None:
        """Receive into ``buffer`` the rest of a message whose header came, bounded like a
        send: a peer stopped mid-message (SIGSTOP, a lost node) fails this link, named,
        instead of holding this side (rank 0's collecting thread, over mpi4py) for good."""
        self._post_receive(buffer, tag)
        self._wait(self._posted[-1], why="stopped mid-message")
        self._posted.pop()

    def _group(self) -> Any:
        group = self.groups.messages
        if group is None:
            raise ConnectionError("the channel is closed")
        return group

    # ------------------------------------------------------------------ receiving
    def _hand_over(self, item: Any, ring: bool = True) -> None:
        """Put ``item`` in the inbox, the one way in, and ring the bell unless ``ring`` is
        False (the thread that waits on it put it there)."""
        self._inbox.append(item)
        bell = self.bell
        if ring and bell is not None:
            bell.ring()

    def _read_message(self) -> Message:
        """The message whose header was just received into ``_recv_buf``, with the rest of its
        payload (and the weights it announces) received from the peer."""
        code, length, value, broadcasts, inline = self._in_head.tolist()
        if code == BATCH:  # from a collector rank: the weights version it was collected with
            self.batch_version = broadcasts
            self._batch_landed()
            return BATCH_REPLY, value
        if broadcasts > self._broadcasts_in:  # sent after a weight broadcast: hand that over first
            with self._waiting(), self._weights_arrived:
                if not self._weights_arrived.wait_for(
                    lambda: self._broadcasts_in >= broadcasts, self._send_timeout.total_seconds()
                ):
                    raise ConnectionError("a weight broadcast announced by rank 0 never came")
        kind = KINDS[code]
        if kind is Command.SHUTDOWN:
            self._stopped_by_peer = True
            if self._beat is not None:
                self._peer_done(self._beat)
        blob = self._recv_buf[HEADER : HEADER + inline].cpu().numpy().tobytes()
        if length > len(blob):
            rest = torch.empty(length - len(blob), dtype=torch.uint8, device=self.device)
            self._await_rest(rest)
            blob += rest.cpu().numpy().tobytes()
        if kind is Command.UPDATE_WEIGHTS:
            self._receive_weights()
            return kind, None
        payload = decode(kind, value, blob)
        if kind is Reply.LAYOUT:
            payload = self._adopt(payload)
        return kind, payload

    def recv(self) -> Message:
        inbox = self._inbox
        while not inbox:
            if self._closed:
                raise ConnectionError("the channel is closed")
            self._await(1.0)
        if self._broadcaster is None:  # no broadcast updates (rank 0's end)
            item = inbox.popleft()
        else:
            with self._weights_arrived:  # taking a broadcast update and its flag is one step
                item = inbox.popleft()
                if item is BROADCAST_UPDATE:
                    self._broadcast_queued = False
                    self._silent_acks += 1
                    self._broadcasts_taken = self._broadcasts_in  # it loads the newest weights
                elif item.__class__ is not Closed and item[0] is Command.UPDATE_WEIGHTS:
                    self._updates_taken += 1
        if item.__class__ is Closed:
            inbox.appendleft(item)  # every later recv fails the same way
            raise ConnectionError(item.why)
        return item

    def _await(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for a message to reach the inbox; ``ConnectionError`` when
        the peer's process ended with none."""
        raise NotImplementedError

    def _closed_by(self, err: BaseException) -> str:
        """The peer is gone or the groups were closed: every later receive fails alike."""
        self.link_closed(f"closed the connection ({first_line(err)})")
        return "took"

    def link_closed(self, why: str) -> None:
        """Nothing more can arrive from the peer (its connection closed, or the groups were
        aborted): every later receive fails with ``why``."""
        self._failure = self._failure or why
        self._hand_over(Closed(self._failure))

    def lose(self, why: str) -> None:
        """Count the peer as gone for ``why`` (it went silent): every later receive and send
        fails with it, and a receive waiting now wakes to fail."""
        self._failure = self._failure or why
        self._lost = True
        self._hand_over(Closed(self._failure))

    def handles(self) -> list[Any]:
        handles: list[Any] = [] if self.bell is None else [self.bell]
        if self.life.sentinel is not None:
            handles.append(self.life.sentinel)
        return handles

    # ------------------------------------------------------------------ the peer's life
    def join_peer(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the peer's end, seen through the connection."""
        raise NotImplementedError

    def gone(self) -> str | None:
        """How the connection ended, once nothing more can arrive on it; None while open."""
        return self._failure

    def describe(self) -> str:
        pid = f"pid {self.pid}, " if self.pid is not None else ""
        where = self.life.where
        return f"collector rank {self.rank} ({pid}{self.host}{', ' + where if where else ''})"

    def join_threads(self, timeout: float) -> None:
        """Stop the heartbeats and wait up to ``timeout`` s for the thread that broadcasts
        weights, once the groups are closed (a thread still inside MPI when the process
        finalises it would fail there)."""
        if self._beat is not None:
            self._beat.stop()
        if self._broadcaster is not None:
            self._broadcaster.join(max(0.0, timeout))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._unsent = None  # the groups' end fails it, if it never went
        if self._beat is not None:
            self._beat.release(0.0 if self._lost else 0.5)
        self._closing()
        self.life.close()

    def _closing(self) -> None:
        """Release what a subclass holds for this link (called once, by ``close``)."""
