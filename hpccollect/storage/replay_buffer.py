"""An in-memory circular replay buffer of transitions, safe to fill from a collector thread."""

from __future__ import annotations

import threading
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from hpccollect._checks import check_int
from hpccollect.errors import ArgumentTypeError, ArgumentValueError

__all__ = ["ReplayBuffer"]


class ReplayBuffer:
    """Circular TensorDict storage of ``capacity`` transitions with uniform sampling.

    ``extend`` flattens every batch dim, so a ``[T]`` or ``[N, T]`` collector batch adds ``T``
    or ``N * T`` transitions; once full, the oldest are overwritten. Storage is allocated on the
    first ``extend`` from that batch's keys, shapes and dtypes. All methods take one lock, so a
    collector thread may ``extend`` while the training thread ``sample``s.

    Args:
        capacity: the most transitions kept.
        batch_size: default number of transitions ``sample()`` returns.
        device: where the storage lives.
        generator: torch generator for sampling (seed it for reproducible samples).
    """

    def __init__(
        self,
        capacity: int,
        *,
        batch_size: int | None = None,
        device: Any = "cpu",
        generator: torch.Generator | None = None,
    ) -> None:
        self.capacity = check_int("capacity", capacity, minimum=1)
        self.batch_size = (
            None if batch_size is None else check_int("batch_size", batch_size, minimum=1)
        )
        self.device = torch.device(device)
        self.generator = generator
        self._storage: TensorDictBase | None = None
        self._keys: set = set()
        self._cursor = 0
        self._len = 0
        self.write_count = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._len

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        """Append every transition of ``data``; return the storage indices written."""
        if not isinstance(data, TensorDictBase):
            raise ArgumentTypeError(f"extend() takes a TensorDict, got {type(data).__name__}.")
        flat = data.reshape(-1) if data.batch_dims != 1 else data
        if flat.names[0] is not None:
            flat = flat.clone(recurse=False)
            flat.names = None
        n = flat.shape[0]
        if n == 0:
            return torch.empty(0, dtype=torch.long)
        if n > self.capacity:
            flat, n = flat[-self.capacity :], self.capacity
        keys = set(flat.keys(True, True))
        with self._lock:
            if self._storage is None:
                self._storage = self._allocate(flat)
                self._keys = keys
            elif keys != self._keys:
                raise ArgumentValueError(
                    "extend(): the batch's keys or shapes differ from what the buffer holds: "
                    f"missing {sorted(map(str, self._keys - keys))}, "
                    f"new {sorted(map(str, keys - self._keys))}. Use one buffer per data layout."
                )
            index = (self._cursor + torch.arange(n)) % self.capacity
            try:
                self._storage[index] = flat.to(self.device)
            except (KeyError, RuntimeError) as err:
                raise ArgumentValueError(
                    f"extend(): the batch's keys or shapes differ from what the buffer holds: {err}"
                ) from err
            self._cursor = (self._cursor + n) % self.capacity
            self._len = min(self._len + n, self.capacity)
            self.write_count += n
        return index

    def add(self, transition: TensorDictBase) -> int:
        """Append one transition (a TensorDict with empty batch size)."""
        return int(self.extend(transition.unsqueeze(0))[0])

    def _allocate(self, example: TensorDictBase) -> TensorDictBase:
        return (
            example[0]
            .to(self.device)
            .apply(
                lambda x: torch.zeros((self.capacity, *x.shape), dtype=x.dtype, device=self.device),
                batch_size=[self.capacity],
            )
        )

    def sample(self, batch_size: int | None = None) -> TensorDictBase:
        """Draw ``batch_size`` transitions uniformly, with replacement (a copy)."""
        size = batch_size if batch_size is not None else self.batch_size
        if size is None:
            raise ArgumentValueError(
                "sample() needs a batch_size: pass it here or to ReplayBuffer(..., batch_size=...)."
            )
        size = check_int("batch_size", size, minimum=1)
        with self._lock:
            if self._len == 0 or self._storage is None:
                raise ArgumentValueError("sample() on an empty ReplayBuffer: extend it first.")
            index = torch.randint(0, self._len, (size,), generator=self.generator)
            return self._storage[index]

    def empty(self) -> None:
        """Forget every transition (storage stays allocated)."""
        with self._lock:
            self._cursor = self._len = 0

    def __getitem__(self, index: Any) -> TensorDictBase:
        with self._lock:
            if self._storage is None:
                return TensorDict({}, batch_size=[0])
            return self._storage[: self._len][index]

    def __repr__(self) -> str:
        return f"ReplayBuffer(capacity={self.capacity}, len={self._len})"
