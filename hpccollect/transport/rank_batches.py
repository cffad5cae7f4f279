"""``RankBatches``: how batches cross a rank link (``RankChannel``'s batches half).

A collector rank writes its batches where they leave from (``batch_buffers``), and announces
their layout once (``_announce``); each batch then crosses as one message. Rank 0 receives it
into a buffer laid out as announced (``_adopt``). A small batch is copied out of the link's one
receive buffer; a large one keeps the buffer it landed in, and the next message comes into a
spare that no one holds any more (``batches.Spares``). What a buffer needs is made once, with
it: its header view and each leaf's view, which the yielded batch is made from (``own``,
``latest``).
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from hpccollect.protocol import Layout
from hpccollect.transport.batches import HEADER, FlatLayout, Slot, Spares
from hpccollect.transport.wire import CONTROL, WireLayout, header

__all__ = ["RankBatches"]

#: bytes from which a batch keeps the buffer it arrived in rather than being copied out
_KEEP_AT = 1 << 18


class RankBatches:
    """The batch methods of ``RankChannel``; what they use of the channel is declared."""

    device: torch.device
    life: Any
    peer_weights_nbytes: int | None
    _weights: torch.Tensor | None
    _spares: Spares
    _in_layout: FlatLayout | None
    _in_slot: Slot
    _recv_buf: torch.Tensor
    _in_head: torch.Tensor
    _in_views: TensorDictBase | None
    _landed: Slot | None
    _placed: tuple | None
    _batch_out: tuple[torch.Tensor, list, list] | None
    _out_head: torch.Tensor

    def batch_buffers(self, batch: TensorDictBase) -> TensorDictBase:
        """Buffers laid out like ``batch`` in the memory batches leave from: the collector
        writes there and a batch is sent as it lies."""
        flat_layout = FlatLayout.of(batch)
        flat, views = flat_layout.allocate(self.device)
        self._placed = (flat_layout, flat, views)
        return views

    def _announce(self, layout: Layout) -> WireLayout:
        """Set up the buffer batches leave from: the placed one, or a copy of ``layout.batch``."""
        if self._placed is not None and layout.batch is self._placed[2]:
            flat_layout, flat, _ = self._placed
            self._batch_out = (flat, [], [])
        else:
            flat_layout = FlatLayout.of(layout.batch)
            flat, views = flat_layout.allocate(self.device)
            self._batch_out = (flat, flat_layout.leaves(views), flat_layout.leaves(layout.batch))
        self._out_head = header(flat)
        weights = 0 if self._weights is None else self._weights.numel()
        return WireLayout(flat_layout, layout.host, layout.pid, weights, layout.frames)

    def _adopt(self, wire: WireLayout) -> Layout:
        """The peer's batches arrive in a buffer laid out as it announced; the views into that
        buffer are the batch the collector reads."""
        size = max(wire.batch.nbytes, HEADER + CONTROL)
        self._in_layout = wire.batch
        slot = self._spares.slot(torch.zeros(size, dtype=torch.uint8, device=self.device))
        self.peer_weights_nbytes = wire.weights_nbytes
        self.life.host = wire.host
        self.life.pid = wire.pid
        batch = wire.batch.views(slot.buffer)  # holds the buffer for good: never a spare
        self._use_recv_buf(slot)
        self._in_views = batch
        return Layout(batch, wire.host, wire.pid, frames=wire.frames)

    def _made_for(self, flat: torch.Tensor) -> tuple:
        """What receiving into ``flat`` needs, made once per buffer: its header, and, once the
        peer announced its batches, the layout with each leaf's view (``_leaves``)."""
        layout = self._in_layout
        if layout is None or flat.numel() < layout.nbytes:
            return (header(flat), None)
        return (header(flat), (layout, layout.leaf_views(flat)))

    def _leaves(self, slot: Slot) -> tuple[torch.Tensor, ...]:
        """The leaf views of the batch in ``slot``'s buffer (made with the slot, unless the
        peer announced another layout since)."""
        layout, made = self._in_layout, slot.made[1]
        if made is not None and made[0] is layout:
            return made[1]
        return layout.leaf_views(slot.buffer)

    def _use_recv_buf(self, slot: Slot) -> None:
        """Receive the next message into ``slot``'s buffer."""
        self._in_slot = slot
        self._recv_buf, self._in_head = slot.buffer, slot.made[0]

    def _batch_landed(self) -> None:
        """A batch came into the receive buffer. A large one keeps that buffer (``latest``,
        ``own``), and the next message comes into another: the caller keeps the batch
        without a copy. The peer sends its next batch only when asked, so at most one batch
        is in flight per link. A small batch is copied instead (``own``): a new buffer, made
        on the receiving thread, costs more than copying a few kB."""
        if self._in_views is not None and self._recv_buf.numel() >= _KEEP_AT:
            self._landed = self._in_slot
            self._use_recv_buf(self._spares.next_after(self._in_slot))

    def latest(self, batch: TensorDictBase) -> TensorDictBase:
        """The batch that arrived last, laid out as ``batch`` (the announced layout)."""
        if self._landed is None or not self._arrived_as(batch):
            return batch  # where every batch arrives
        return self._in_layout.alias(self._leaves(self._landed))

    def own(self, batch: TensorDictBase) -> TensorDictBase:
        """The batch that arrived last, the caller's to keep: no later message lands in it."""
        if not self._arrived_as(batch):
            return batch.clone()
        if self._landed is None:
            return self._in_layout.own(self._leaves(self._in_slot))
        return self._in_layout.own(self._leaves(self._landed), copy=False)

    def _arrived_as(self, batch: TensorDictBase) -> bool:
        """Whether ``batch`` is the layout this link's batches arrive in (the one announced
        over it, not buffers of the caller's own)."""
        return self._in_views is not None and batch is self._in_views
