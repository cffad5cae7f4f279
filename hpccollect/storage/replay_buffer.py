"""An in-memory circular replay buffer of transitions, safe to fill from threads or processes."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
import weakref
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from hpccollect._checks import check_int
from hpccollect.errors import ArgumentTypeError, ArgumentValueError

__all__ = ["ReplayBuffer"]

_CURSOR, _LEN, _WRITES = 0, 1, 2


class _Lock:
    """A thread lock; after ``share()``, also an ``flock`` on a file, so processes exclude
    each other. Pickles as the file's path (a lock cannot be pickled otherwise after start)."""

    def __init__(self) -> None:
        self._thread = threading.Lock()
        self.path: str | None = None
        self._fd: int | None = None

    def share(self) -> str:
        fd, self.path = tempfile.mkstemp(prefix="hpccollect-rb-", suffix=".lock")
        os.close(fd)
        return self.path

    def __enter__(self) -> None:
        self._thread.acquire()
        if self.path is not None:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR)
            fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: Any) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._thread.release()

    def __getstate__(self) -> dict:
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__()
        self.path = state["path"]


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class ReplayBuffer:
    """Circular TensorDict storage of ``capacity`` transitions with uniform sampling.

    ``extend`` flattens every batch dim, so a ``[T]`` or ``[N, T]`` collector batch adds ``T``
    or ``N * T`` transitions; once full, the oldest are overwritten. Storage is allocated on the
    first ``extend`` from that batch's keys, shapes and dtypes. Every method holds one lock, so a
    collector thread may ``extend`` while the training thread ``sample``s. After
    ``share_memory_()`` the storage and counters live in shared memory and the lock works across
    processes: multi-process collectors' workers then extend it themselves.

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
        self._meta = torch.zeros(3, dtype=torch.int64)  # cursor, length, writes
        self._lock = _Lock()
        self._shared = False

    # ------------------------------------------------------------------ sharing
    def share_memory_(self) -> ReplayBuffer:
        """Move storage and counters to shared memory; make the lock inter-process. Idempotent.

        Returns:
            The buffer itself, which worker processes may now fill.
        """
        if self._shared:
            return self
        with self._lock:
            self._meta.share_memory_()
            if self._storage is not None:
                self._storage.share_memory_()
            path = self._lock.share()
            weakref.finalize(self, _remove, path)
            self._shared = True
        return self

    @property
    def is_shared(self) -> bool:
        return self._shared

    def allocate_like(self, example: TensorDictBase) -> None:
        """Allocate storage for transitions shaped like ``example``'s (if not allocated yet).

        Args:
            example: a batch of transitions (any batch shape; its leaves give the layout).
        """
        with self._lock:
            if self._storage is None:
                self._allocate(self._flatten(example))

    def __getstate__(self) -> dict:
        if not self._shared:
            raise TypeError(
                "a ReplayBuffer is sent to another process only after share_memory_(); "
                "a copy would be filled without the original seeing it."
            )
        return dict(self.__dict__)

    # ------------------------------------------------------------------ data
    def __len__(self) -> int:
        return int(self._meta[_LEN])

    @property
    def write_count(self) -> int:
        """Transitions written since creation (including overwritten ones)."""
        return int(self._meta[_WRITES])

    @staticmethod
    def _flatten(data: TensorDictBase) -> TensorDictBase:
        flat = data.reshape(-1) if data.batch_dims != 1 else data
        if flat.names[0] is not None:
            flat = flat.clone(recurse=False)
            flat.names = None
        return flat

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        """Append every transition of ``data`` (past ``capacity``, the oldest are overwritten).

        Args:
            data: a TensorDict of transitions, flattened over its batch dims.

        Returns:
            The storage indices written.

        Raises:
            ArgumentTypeError: ``data`` is not a TensorDict.
            ArgumentValueError: its keys or shapes differ from what the buffer holds.
        """
        if not isinstance(data, TensorDictBase):
            raise ArgumentTypeError(f"extend() takes a TensorDict, got {type(data).__name__}.")
        flat = self._flatten(data)
        n = flat.shape[0]
        if n == 0:
            return torch.empty(0, dtype=torch.long)
        if n > self.capacity:
            flat, n = flat[-self.capacity :], self.capacity
        keys = set(flat.keys(True, True))
        with self._lock:
            if self._storage is None:
                self._allocate(flat)
            elif keys != self._keys:
                raise ArgumentValueError(
                    "extend(): the batch's keys or shapes differ from what the buffer holds: "
                    f"missing {sorted(map(str, self._keys - keys))}, "
                    f"new {sorted(map(str, keys - self._keys))}. Use one buffer per data layout."
                )
            cursor = int(self._meta[_CURSOR])
            index = (cursor + torch.arange(n)) % self.capacity
            try:
                self._storage[index] = flat.to(self.device)
            except (KeyError, RuntimeError) as err:
                raise ArgumentValueError(
                    f"extend(): the batch's keys or shapes differ from what the buffer holds: {err}"
                ) from err
            self._meta[_CURSOR] = (cursor + n) % self.capacity
            self._meta[_LEN] = min(int(self._meta[_LEN]) + n, self.capacity)
            self._meta[_WRITES] += n
        return index

    def add(self, transition: TensorDictBase) -> int:
        """Append one transition (or one step of several envs, written in order).

        Args:
            transition: a TensorDict with an empty batch size (or ``[N]``: N transitions).

        Returns:
            The storage index of the (first) transition written.
        """
        return int(self.extend(transition.unsqueeze(0))[0])

    def _allocate(self, example: TensorDictBase) -> None:
        storage = (
            example[0]
            .to(self.device)
            .apply(
                lambda x: torch.zeros((self.capacity, *x.shape), dtype=x.dtype, device=self.device),
                batch_size=[self.capacity],
            )
        )
        if self._shared:
            storage.share_memory_()
        self._storage, self._keys = storage, set(example.keys(True, True))

    def sample(self, batch_size: int | None = None) -> TensorDictBase:
        """Draw transitions uniformly, with replacement (a copy).

        Args:
            batch_size: how many (None: the buffer's own ``batch_size``).

        Returns:
            A TensorDict of ``batch_size`` transitions.

        Raises:
            ArgumentValueError: no batch size anywhere, or the buffer is empty.
        """
        size = batch_size if batch_size is not None else self.batch_size
        if size is None:
            raise ArgumentValueError(
                "sample() needs a batch_size: pass it here or to ReplayBuffer(..., batch_size=...)."
            )
        size = check_int("batch_size", size, minimum=1)
        with self._lock:
            length = int(self._meta[_LEN])
            if length == 0 or self._storage is None:
                raise ArgumentValueError("sample() on an empty ReplayBuffer: extend it first.")
            index = torch.randint(0, length, (size,), generator=self.generator)
            return self._storage[index]

    def empty(self) -> None:
        """Forget every transition (storage stays allocated)."""
        with self._lock:
            self._meta[_CURSOR] = 0
            self._meta[_LEN] = 0

    def __getitem__(self, index: Any) -> TensorDictBase:
        with self._lock:
            if self._storage is None:
                return TensorDict({}, batch_size=[0])
            return self._storage[: len(self)][index]

    def __repr__(self) -> str:
        return f"ReplayBuffer(capacity={self.capacity}, len={len(self)}, shared={self._shared})"
