"""Buffers whose layout is agreed once between ranks: one flat byte buffer per batch (or per set
of weights) with a TensorDict of views into it, so a batch crosses the wire as one message
straight into memory allocated at start, and nothing is pickled per batch.

A ``FlatLayout`` is the agreed part (keys, shapes, dtypes, batch size, names); it is small and
pickled once, when a rank announces its batches. ``HEADER`` bytes at the front of every buffer
carry a message's kind and size (see ``wire.py``), so a batch and its announcement are one
message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from hpccollect.errors import ArgumentTypeError

__all__ = ["HEADER", "FlatLayout"]

#: bytes reserved at the front of every wire buffer for the message header
HEADER = 64
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
        """The layout of ``td``'s tensor leaves, in sorted key order (the same on every rank)."""
        keys, shapes, dtypes, offsets = [], [], [], []
        offset = HEADER
        for key in td.keys(include_nested=True, leaves_only=True, sort=True):
            value = td.get(key)
            if not isinstance(value, torch.Tensor):
                raise ArgumentTypeError(
                    f"the {what} entry {key!r} is a {type(value).__name__}, not a tensor; only "
                    "tensor entries can travel between ranks."
                )
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
        out = TensorDict({}, batch_size=self.batch_size, device=flat.device)
        for key, shape, dtype, offset in zip(
            self.keys, self.shapes, self.dtypes, self.offsets, strict=True
        ):
            dt = getattr(torch, dtype)
            size = _numel(shape) * torch.empty((), dtype=dt).element_size()
            out.set(key, flat[offset : offset + size].view(dt).view(shape))
        if self.names is not None:
            out.names = list(self.names)
        return out

    def leaves(self, td: TensorDictBase) -> list[torch.Tensor]:
        """``td``'s leaves in this layout's order."""
        return [td.get(key if len(key) > 1 else key[0]) for key in self.keys]


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _has_names(td: TensorDictBase) -> bool:
    try:
        return any(n is not None for n in td.names)
    except Exception:  # tensordicts that do not support names
        return False
