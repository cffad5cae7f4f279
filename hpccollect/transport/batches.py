"""Buffers whose layout is agreed once between ranks: one flat byte buffer per batch (or per set
of weights) with a TensorDict of views into it, so a batch crosses the wire as one message
straight into memory allocated at start, and nothing is pickled per batch.

A ``FlatLayout`` is the agreed part (keys, shapes, dtypes, batch size, names); it is small and
pickled once, when a rank announces its batches. ``HEADER`` bytes at the front of every buffer
carry a message's kind and size (see ``wire.py``), so a batch and its announcement are one
message.
"""

from __future__ import annotations

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
        """The TensorDict whose leaves are views into ``flat`` (laid out as ``self``).

        Built from a recipe made once per layout (one typed view of ``flat`` per dtype, then
        one strided view per leaf, nested TensorDicts made without re-checking): rank 0 builds
        one per batch it yields, so this is on its hot path."""
        recipe = self.__dict__.get("_recipe")
        if recipe is None:
            recipe = self.__dict__["_recipe"] = _Recipe(self)
        return recipe.build(flat)

    def copy(self, flat: torch.Tensor) -> TensorDictBase:
        """A batch of its own: ``flat``'s bytes copied at once, with views into the copy."""
        return self.views(flat[: self.nbytes].clone())

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_recipe"}

    def leaves(self, td: TensorDictBase) -> list[torch.Tensor]:
        """``td``'s leaves in this layout's order."""
        return [td.get(key if len(key) > 1 else key[0]) for key in self.keys]


class _Recipe:
    """How ``FlatLayout.views`` lays a TensorDict over a flat buffer (see there)."""

    def __init__(self, layout: FlatLayout) -> None:
        dtypes = sorted(set(layout.dtypes))
        self.dtypes = [getattr(torch, d) for d in dtypes]
        self.batch_size = torch.Size(layout.batch_size)
        self.names = None if layout.names is None else list(layout.names)
        self.leaves = []
        for key, shape, dtype, offset in zip(
            layout.keys, layout.shapes, layout.dtypes, layout.offsets, strict=True
        ):
            size = torch.empty((), dtype=getattr(torch, dtype)).element_size()
            strides, step = [], 1
            for s in reversed(shape):
                strides.append(step)
                step *= s
            where = dtypes.index(dtype), shape, tuple(reversed(strides)), offset // size
            self.leaves.append((key, *where))

    def build(self, flat: torch.Tensor) -> TensorDictBase:
        typed = [flat.view(dt) for dt in self.dtypes]
        tree: dict[str, Any] = {}
        for key, which, shape, strides, start in self.leaves:
            node = tree
            for part in key[:-1]:
                node = node.setdefault(part, {})
            node[key[-1]] = typed[which].as_strided(shape, strides, start)
        return self._nest(tree, flat.device)

    def _nest(self, tree: dict[str, Any], device: torch.device) -> TensorDictBase:
        source = {k: self._nest(v, device) if isinstance(v, dict) else v for k, v in tree.items()}
        # leaves of the agreed shapes: skip tensordict's checks (names too: each level's)
        return TensorDict._new_unsafe(
            source, batch_size=self.batch_size, device=device, names=self.names
        )


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _has_names(td: TensorDictBase) -> bool:
    try:
        return any(n is not None for n in td.names)
    except Exception:  # tensordicts that do not support names
        return False
