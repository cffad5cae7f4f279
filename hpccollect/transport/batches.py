"""Buffers whose layout is agreed once between ranks: one flat byte buffer per batch (or set of
weights) with a TensorDict of views into it, so a batch crosses the wire as one message straight
into memory allocated at start, and nothing is pickled per batch. A ``FlatLayout`` is the agreed
part (keys, shapes, dtypes, batch size, names), pickled once, when a rank announces its batches.
The first ``HEADER`` bytes of every buffer are left unused: a message's kind and size travel in
its control frame (``control.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from tensordict import TensorDictBase

from hpccollect._compat import new_unchecked, storage_holds
from hpccollect.errors import ArgumentTypeError

__all__ = ["HEADER", "FlatLayout", "Slot", "Spares"]

HEADER = 64  # bytes before the first leaf of every flat buffer
_ALIGN = 64


@dataclass(frozen=True)
class FlatLayout:
    """Where each leaf of a TensorDict lives in one flat byte buffer (after ``HEADER`` bytes)."""

    keys: tuple[tuple[str, ...], ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    offsets: tuple[int, ...]
    batch_size: tuple[int, ...]
    names: tuple[str | None, ...] | None
    nbytes: int  # HEADER included

    @classmethod
    def of(cls, td: TensorDictBase, what: str = "batch") -> FlatLayout:
        """The layout of ``td``'s tensor leaves, grouped by dtype, each group in sorted key
        order (the same on every rank)."""
        keys, shapes, dtypes, offsets = [], [], [], []
        offset = HEADER
        leaves = []
        for key in td.keys(include_nested=True, leaves_only=True, sort=True):
            value = td.get(key)
            if not isinstance(value, torch.Tensor):
                raise ArgumentTypeError(
                    f"the {what} entry {key!r} is a {type(value).__name__}, not a tensor; only "
                    "tensor entries can travel between ranks."
                )
            leaves.append((str(value.dtype), key, value))
        leaves.sort(key=lambda leaf: leaf[0])  # stable: keys stay sorted within a dtype
        for _, key, value in leaves:
            keys.append(key if isinstance(key, tuple) else (key,))
            shapes.append(tuple(value.shape))
            dtypes.append(str(value.dtype).removeprefix("torch."))
            offsets.append(offset)
            offset += _aligned(value.numel() * value.element_size())
        names = tuple(td.names) if _has_names(td) else None
        return cls(
            tuple(keys),
            tuple(shapes),
            tuple(dtypes),
            tuple(offsets),
            tuple(td.batch_size),
            names,
            offset,
        )

    def allocate(self, device: Any = "cpu") -> tuple[torch.Tensor, TensorDictBase]:
        """A new flat buffer and the TensorDict of views into it."""
        flat = torch.zeros(self.nbytes, dtype=torch.uint8, device=device)
        return flat, self.views(flat)

    def views(self, flat: torch.Tensor) -> TensorDictBase:
        """The TensorDict whose leaves are views into ``flat`` (laid out as ``self``)."""
        return self._recipe().assemble(self.leaf_views(flat), flat.device)

    def leaf_views(self, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each leaf's view into ``flat``, in this layout's order: what ``own`` and ``alias``
        make a batch from (a receiver makes them once per buffer)."""
        return self._recipe().leaf_views(flat)

    def own(self, leaves: Sequence[torch.Tensor], copy: bool = True) -> TensorDictBase:
        """A batch of its own from a buffer's ``leaf_views``, as ``TensorDict.clone`` gives:
        each leaf copied into a storage of its own, except, with ``copy=False``, the leaves of
        the dtype with the most bytes, which stay in the buffer (one no one writes again). No
        storage is seen as several dtypes, which ``torch.save`` refuses."""
        return self._recipe().own(leaves, copy)

    def alias(self, leaves: Sequence[torch.Tensor]) -> TensorDictBase:
        """The batch over a buffer's ``leaf_views``, each leaf a new view: it holds the buffer
        while it or any leaf of it is kept (``Spares`` counts on that)."""
        return self._recipe().alias(leaves)

    def _recipe(self) -> _Recipe:
        recipe = self.__dict__.get("_made")
        if recipe is None:
            recipe = self.__dict__["_made"] = _Recipe(self)
        return recipe

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_made"}

    def leaves(self, td: TensorDictBase) -> list[torch.Tensor]:
        """``td``'s leaves in this layout's order."""
        return [td.get(key if len(key) > 1 else key[0]) for key in self.keys]


class _Recipe:
    """How ``FlatLayout`` lays a TensorDict over a flat buffer, worked out once per layout so
    that rank 0, building a batch per message it yields, makes one torch call per leaf (each
    costs it microseconds there, as the receiving threads and ranks share its cores)."""

    def __init__(self, layout: FlatLayout) -> None:
        names = sorted(set(layout.dtypes), key=layout.dtypes.index)
        self.dtypes = [getattr(torch, d) for d in names]
        self.batch_size = torch.Size(layout.batch_size)
        self.names = None if layout.names is None else list(layout.names)
        #: per leaf: (its dtype's index in ``dtypes``, shape, strides, offset in elements)
        self.leaves = []
        sizes = [0] * len(names)
        self.tree: dict[str, Any] = {}  # the nesting, each leaf's index at its key
        for i, (key, shape, dtype, offset) in enumerate(
            zip(layout.keys, layout.shapes, layout.dtypes, layout.offsets, strict=True)
        ):
            which = names.index(dtype)
            size = self.dtypes[which].itemsize
            strides, step = [], 1
            for s in reversed(shape):
                strides.append(step)
                step *= s
            sizes[which] += step * size
            self.leaves.append((which, shape, tuple(reversed(strides)), offset // size))
            node = self.tree
            for part in key[:-1]:
                node = node.setdefault(part, {})
            node[key[-1]] = i
        #: the dtype with the most bytes: what ``own(copy=False)`` leaves in place
        self.home = max(range(len(names)), key=sizes.__getitem__, default=0)
        self._home_leaves = [leaf[0] == self.home for leaf in self.leaves]

    def leaf_views(self, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        bases = [flat.view(dt) for dt in self.dtypes]
        return tuple(
            bases[which].as_strided(shape, strides, start)
            for which, shape, strides, start in self.leaves
        )

    def own(self, leaves: Sequence[torch.Tensor], copy: bool) -> TensorDictBase:
        if copy:
            return self.assemble([leaf.clone() for leaf in leaves])
        return self.assemble(
            [
                leaf.detach() if home else leaf.clone()
                for leaf, home in zip(leaves, self._home_leaves, strict=True)
            ]
        )

    def alias(self, leaves: Sequence[torch.Tensor]) -> TensorDictBase:
        return self.assemble([leaf.detach() for leaf in leaves])

    def assemble(self, tensors: Sequence[torch.Tensor], device: Any = None) -> TensorDictBase:
        """The TensorDict of ``tensors`` (in the layout's order) on ``device`` (None: theirs)."""
        if device is None and tensors:
            device = tensors[0].device
        return self._nest(self.tree, tensors, device)

    def _nest(self, tree: dict[str, Any], tensors: Any, device: Any) -> TensorDictBase:
        source = {
            k: self._nest(v, tensors, device) if v.__class__ is dict else tensors[v]
            for k, v in tree.items()
        }
        # leaves of the agreed shapes: skip tensordict's checks (names too: each level's)
        return new_unchecked(source, batch_size=self.batch_size, device=device, names=self.names)


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _has_names(td: TensorDictBase) -> bool:
    try:
        return any(n is not None for n in td.names)
    except Exception:  # tensordicts that do not support names
        return False


class Slot(NamedTuple):
    """A receive buffer with what its channel made from it once, for ``Spares``.

    Attributes:
        buffer: the flat receive buffer.
        made: what the channel made from it (its leaves' views), not counted as holders.
        free: the holds on its memory when only the slot holds it (-1: uncounted, never reused).
        address: where its memory was when the slot was made (where ``made`` points): a buffer
            whose memory moved (``share_memory_()`` on a batch in it) is not received into.
    """

    buffer: torch.Tensor
    made: tuple
    free: int
    address: int


class Spares:
    """The receive buffers a link's large batches landed in, received into again once no one
    holds them. A new buffer would cost page faults, and the allocator keeps freed buffers of
    that size (rank 0 grew by 30 MB a rank at 2.7 MB batches); ``make``'s views are kept in the
    ``Slot``, as after a 2.7 MB transfer even one view costs rank 0 tens of microseconds.

    Args:
        make: what a channel needs of a receive buffer (called once per buffer).
        keep: the landed buffers watched at most (older ones are forgotten, not freed).
    """

    def __init__(self, make: Callable[[torch.Tensor], tuple], keep: int = 4):
        self._make = make
        self._slots: list[Slot] = []
        self._keep = keep

    def slot(self, buffer: torch.Tensor) -> Slot:
        """A slot for a receive buffer.

        Args:
            buffer: a new buffer, held by no one else yet.

        Returns:
            ``buffer`` with what ``make`` makes from it.
        """
        made = self._make(buffer)
        free = storage_holds(buffer)  # the tensor, its views, arrays of it; or None
        return Slot(buffer, made, -1 if free is None else free, buffer.data_ptr())

    def next_after(self, landed: Slot) -> Slot:
        """The slot to receive the next message into.

        Args:
            landed: the slot a batch just came into; handed out again once no one holds it.

        Returns:
            A spare like ``landed`` that no one holds, else a new one.
        """
        fresh = None
        shape = landed.buffer.shape
        for i, slot in enumerate(self._slots):
            if slot.buffer.shape == shape and _free(slot):
                fresh = self._slots.pop(i)
                break
        if landed.free >= 0 and all(slot is not landed for slot in self._slots):
            self._slots.append(landed)
            del self._slots[: -self._keep]
        return self.slot(torch.empty_like(landed.buffer)) if fresh is None else fresh


def _free(slot: Slot) -> bool:
    """Whether no one but ``slot`` holds its buffer, and its memory did not move (a taker's
    ``share_memory_()``; CUDA storages all count as shared, so the address tells)."""
    buffer = slot.buffer
    if buffer.data_ptr() != slot.address:
        return False
    holds = storage_holds(buffer)
    return holds is not None and holds <= slot.free
