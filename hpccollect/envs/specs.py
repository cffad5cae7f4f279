"""Tensor specs: shape, dtype, bounds and categories of what an env reads and writes.

Names and conventions follow TorchRL (``Bounded``, ``OneHot``, ``Composite``...): a spec's shape
includes the env's batch dims, so a vector env of 4 CartPoles has an observation spec of shape
``[4, 4]`` and a one-hot action spec of shape ``[4, 2]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

__all__ = [
    "Binary",
    "Bounded",
    "Categorical",
    "Composite",
    "MultiCategorical",
    "MultiOneHot",
    "OneHot",
    "TensorSpec",
    "Unbounded",
]


class TensorSpec:
    """One leaf: a tensor of a fixed ``shape`` (batch dims included) and ``dtype``."""

    def __init__(self, shape: Any, dtype: torch.dtype, device: Any = "cpu") -> None:
        self.shape = torch.Size(shape)
        self.dtype = dtype
        self.device = torch.device(device)

    def zero(self, shape: Any = ()) -> torch.Tensor:
        """A zero tensor of this spec, with extra leading dims ``shape``."""
        return torch.zeros((*shape, *self.shape), dtype=self.dtype, device=self.device)

    def rand(self, shape: Any = (), generator: torch.Generator | None = None) -> torch.Tensor:
        """A uniformly random valid value, with extra leading dims ``shape``."""
        raise NotImplementedError

    def is_in(self, value: torch.Tensor) -> bool:
        """Whether ``value`` has this spec's shape (as trailing dims) and is within its bounds."""
        return tuple(value.shape[value.ndim - len(self.shape) :]) == tuple(self.shape)

    def expand(self, *batch: int) -> TensorSpec:
        """The same spec with ``batch`` dims prepended to its shape."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.shape = torch.Size((*batch, *self.shape))
        return clone

    def __repr__(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in self._extra_repr().items())
        return (
            f"{type(self).__name__}(shape={tuple(self.shape)}, dtype={self.dtype}"
            f"{', ' + extra if extra else ''})"
        )

    def _extra_repr(self) -> dict[str, Any]:
        return {}

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and _state(self) == _state(other)

    __hash__ = None  # type: ignore[assignment]


def _state(spec: TensorSpec) -> dict[str, Any]:
    return {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in spec.__dict__.items()}


class Unbounded(TensorSpec):
    """Any real (or integer) value."""

    def __init__(self, shape: Any = (1,), dtype: torch.dtype = torch.float32, device: Any = "cpu"):
        super().__init__(shape, dtype, device)

    def rand(self, shape: Any = (), generator: torch.Generator | None = None) -> torch.Tensor:
        size = (*shape, *self.shape)
        if self.dtype.is_floating_point:
            return torch.randn(size, generator=generator, dtype=self.dtype, device=self.device)
        if self.dtype == torch.bool:
            return torch.randint(0, 2, size, generator=generator, device=self.device).bool()
        return torch.randint(-100, 100, size, generator=generator, device=self.device).to(
            self.dtype
        )


class Bounded(TensorSpec):
    """Values in ``[low, high]`` elementwise (a gymnasium ``Box``)."""

    def __init__(
        self, low: Any, high: Any, shape: Any, dtype: torch.dtype = torch.float32, device="cpu"
    ) -> None:
        super().__init__(shape, dtype, device)
        self.low = torch.broadcast_to(torch.as_tensor(low, dtype=dtype), self.shape).clone()
        self.high = torch.broadcast_to(torch.as_tensor(high, dtype=dtype), self.shape).clone()

    def expand(self, *batch: int) -> Bounded:
        clone = super().expand(*batch)
        clone.low = self.low.expand(clone.shape).clone()
        clone.high = self.high.expand(clone.shape).clone()
        return clone

    def rand(self, shape: Any = (), generator: torch.Generator | None = None) -> torch.Tensor:
        low = self.low.double().clamp(-1e6, 1e6)
        high = self.high.double().clamp(-1e6, 1e6)
        size = (*shape, *self.shape)
        if self.dtype.is_floating_point:
            u = torch.rand(size, generator=generator, dtype=torch.float64)
            return (low + u * (high - low)).to(self.dtype)
        u = torch.rand(size, generator=generator, dtype=torch.float64)
        return torch.floor(low + u * (high - low + 1)).clamp(max=high).to(self.dtype)

    def is_in(self, value: torch.Tensor) -> bool:
        return super().is_in(value) and bool(((value >= self.low) & (value <= self.high)).all())

    def _extra_repr(self) -> dict[str, Any]:
        return {"low": self.low.min().item(), "high": self.high.max().item()}


class OneHot(TensorSpec):
    """One of ``n`` categories, encoded one-hot in the last dim (TorchRL's default for Discrete)."""

    def __init__(self, n: int, shape: Any = None, dtype: torch.dtype = torch.int64, device="cpu"):
        super().__init__((n,) if shape is None else shape, dtype, device)
        self.n = int(n)

    def rand(self, shape: Any = (), generator: torch.Generator | None = None) -> torch.Tensor:
        idx = torch.randint(0, self.n, (*shape, *self.shape[:-1]), generator=generator)
        return torch.nn.functional.one_hot(idx, self.n).to(self.dtype)

    def is_in(self, value: torch.Tensor) -> bool:
        return super().is_in(value) and bool((value.sum(-1) == 1).all())

    def _extra_repr(self) -> dict[str, Any]:
        return {"n": self.n}


class Categorical(TensorSpec):
    """One of ``n`` categories as an integer index (``categorical_action_encoding=True``)."""

    def __init__(self, n: int, shape: Any = (), dtype: torch.dtype = torch.int64, device="cpu"):
        super().__init__(shape, dtype, device)
        self.n = int(n)

    def rand(self, shape: Any = (), generator: torch.Generator | None = None) -> torch.Tensor:
        size = (*shape, *self.shape)
        return torch.randint(0, self.n, size, generator=generator).to(self.dtype)

    def is_in(self, value: torch.Tensor) -> bool:
        return super().is_in(value) and bool(((value >= 0) & (value < self.n)).all())

    def _extra_repr(self) -> dict[str, Any]:
        return {"n": self.n}


class MultiOneHot(TensorSpec):
    """Several categorical variables (``nvec``), their one-hot codes concatenated."""

    def __init__(
        self, nvec: Any, shape: Any = None, dtype: torch.dtype = torch.int64, device="cpu"
    ):
        self.nvec = [int(n) for n in nvec]
        super().__init__((sum(self.nvec),) if shape is None else shape, dtype, device)

    def rand(self, shape: Any = (), generator: torch.Generator | None = None) -> torch.Tensor:
        parts = [
            OneHot(n, (*self.shape[:-1], n), self.dtype).rand(shape, generator) for n in self.nvec
        ]
        return torch.cat(parts, -1)

    def _extra_repr(self) -> dict[str, Any]:
        return {"nvec": self.nvec}


class MultiCategorical(TensorSpec):
    """Several categorical variables (``nvec``) as integer indices."""

    def __init__(
        self, nvec: Any, shape: Any = None, dtype: torch.dtype = torch.int64, device="cpu"
    ):
        self.nvec = [int(n) for n in nvec]
        super().__init__((len(self.nvec),) if shape is None else shape, dtype, device)

    def rand(self, shape: Any = (), generator: torch.Generator | None = None) -> torch.Tensor:
        size = (*shape, *self.shape)
        u = torch.rand(size, generator=generator, dtype=torch.float64)
        return torch.floor(u * torch.tensor(self.nvec, dtype=torch.float64)).to(self.dtype)

    def is_in(self, value: torch.Tensor) -> bool:
        nvec = torch.tensor(self.nvec)
        return super().is_in(value) and bool(((value >= 0) & (value < nvec)).all())

    def _extra_repr(self) -> dict[str, Any]:
        return {"nvec": self.nvec}


class Binary(TensorSpec):
    """``n`` independent 0/1 values (a gymnasium ``MultiBinary``)."""

    def __init__(self, n: int, shape: Any = None, dtype: torch.dtype = torch.int8, device="cpu"):
        super().__init__((n,) if shape is None else shape, dtype, device)
        self.n = int(n)

    def rand(self, shape: Any = (), generator: torch.Generator | None = None) -> torch.Tensor:
        size = (*shape, *self.shape)
        return torch.randint(0, 2, size, generator=generator).to(self.dtype)


class Composite:
    """A nested mapping of specs sharing leading batch dims ``shape`` (TorchRL's ``Composite``)."""

    def __init__(self, specs: dict[str, Any] | None = None, shape: Any = (), **kwargs: Any):
        self.shape = torch.Size(shape)
        self._specs: dict[str, TensorSpec | Composite] = {**(specs or {}), **kwargs}

    def __getitem__(self, key: str | tuple[str, ...]) -> Any:
        if isinstance(key, tuple):
            node: Any = self
            for part in key:
                node = node[part]
            return node
        return self._specs[key]

    def __setitem__(self, key: str, spec: TensorSpec | Composite) -> None:
        self._specs[key] = spec

    def __contains__(self, key: object) -> bool:
        try:
            self[key]  # type: ignore[index]
        except (KeyError, TypeError):
            return False
        return True

    def __len__(self) -> int:
        return len(self._specs)

    def keys(
        self, include_nested: bool = False, leaves_only: bool = False
    ) -> list[str | tuple[str, ...]]:
        """Keys in insertion order; nested ones as tuples when ``include_nested``."""
        return [k for k, _ in self.items(include_nested, leaves_only)]

    def items(self, include_nested: bool = False, leaves_only: bool = False) -> Iterator[Any]:
        for key, spec in self._specs.items():
            is_leaf = not isinstance(spec, Composite)
            if is_leaf or not leaves_only:
                yield key, spec
            if include_nested and not is_leaf:
                for sub, subspec in spec.items(True, leaves_only):
                    yield ((key, *sub) if isinstance(sub, tuple) else (key, sub)), subspec

    def values(self, include_nested: bool = False, leaves_only: bool = False) -> list[Any]:
        return [v for _, v in self.items(include_nested, leaves_only)]

    def zero(self, shape: Any = ()) -> Any:
        from tensordict import TensorDict

        return TensorDict(
            {k: v.zero(shape) for k, v in self._specs.items()}, batch_size=(*shape, *self.shape)
        )

    def rand(self, shape: Any = (), generator: torch.Generator | None = None) -> Any:
        from tensordict import TensorDict

        return TensorDict(
            {k: v.rand(shape, generator) for k, v in self._specs.items()},
            batch_size=(*shape, *self.shape),
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Composite)
            and self.shape == other.shape
            and self._specs == other._specs
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        inner = ",\n    ".join(
            f"{k}: {v!r}".replace("\n", "\n    ") for k, v in self._specs.items()
        )
        return f"Composite(\n    {inner},\n    shape={tuple(self.shape)})"


def torch_dtype(np_dtype: Any) -> torch.dtype:
    """The torch dtype matching a numpy dtype."""
    return torch.from_numpy(np.zeros(0, dtype=np_dtype)).dtype
