"""Typed errors raised by hpccollect.

Every message states the bad value, what was expected and how to fix it. The classes also derive
from the matching builtin (``TypeError``, ``ValueError``, ``RuntimeError``, ``TimeoutError``) so
code written against TorchRL's exceptions keeps catching them.
"""

from __future__ import annotations

from typing import TypeVar

_E = TypeVar("_E", bound="HpcCollectError")

__all__ = [
    "ArgumentTypeError",
    "ArgumentValueError",
    "CollectorTimeoutError",
    "EnvError",
    "HpcCollectError",
    "PolicyError",
    "StorageError",
    "WorkerError",
    "as_worker_error",
    "with_builtin",
]


class HpcCollectError(Exception):
    """Base class of every error hpccollect raises on purpose."""


class ArgumentTypeError(HpcCollectError, TypeError):
    """An argument has the wrong type."""


class ArgumentValueError(HpcCollectError, ValueError):
    """An argument has the right type but a value that cannot work."""


class EnvError(HpcCollectError, RuntimeError):
    """An environment raised, or returned something the collector cannot record.

    Attributes:
        env_name: the env id (or class name) that failed.
        step: the collector-wide step index at which it failed, or None during reset/creation.
    """

    def __init__(self, message: str, *, env_name: str = "", step: int | None = None) -> None:
        super().__init__(message)
        self.env_name = env_name
        self.step = step


class PolicyError(HpcCollectError, RuntimeError):
    """The policy raised, or wrote outputs that do not match the environment's action spec."""


class StorageError(HpcCollectError, OSError):
    """Writing a dataset file failed (full disk, file-size limit, I/O error, read-only disk).

    The message is one line naming the file and the cause; rows committed before it are kept.
    """


class CollectorTimeoutError(HpcCollectError, TimeoutError):
    """A blocking wait ran past its timeout."""


class WorkerError(HpcCollectError, RuntimeError):
    """A collector worker (process or rank) raised, or died.

    An exception raised in a worker is re-raised in the collector as a subclass of both this and
    the worker's exception class (see ``as_worker_error``): a worker's ``EnvError`` is caught by
    ``except EnvError`` and by ``except WorkerError``.

    Attributes:
        worker: the worker's index.
        host: the host it ran on (the worker's own, for an exception it raised).
        remote_traceback: the worker's formatted traceback ("" when it died without one).
        num_workers: how many workers the collector has (None when not known).
        rank: the worker's torch.distributed rank when it is a collector rank, else None.
    """

    def __init__(
        self,
        message: str,
        *,
        worker: int,
        host: str,
        remote_traceback: str = "",
        num_workers: int | None = None,
        rank: int | None = None,
    ) -> None:
        who = f"Worker {worker}" if rank is None else f"Rank {rank} (worker {worker})"
        head = f"{who} on {host}: {message}"
        if remote_traceback:
            of = f" of {num_workers}" if num_workers is not None else ""
            head += (
                f"\n\n--- traceback in {who.lower()}{of} on {host} ---\n{remote_traceback.rstrip()}"
            )
        super().__init__(head)
        self.worker = worker
        self.host = host
        self.remote_traceback = remote_traceback
        self.num_workers = num_workers
        self.rank = rank


def _builtin_base(original: BaseException | type[BaseException]) -> type[BaseException] | None:
    """The first builtin exception class ``original`` is an instance (or subclass) of."""
    cls = original if isinstance(original, type) else type(original)
    for base in cls.__mro__:
        if base.__module__ == "builtins" and issubclass(base, Exception):
            return base
    return None


_VARIANTS: dict[tuple[type, type], type] = {}


def with_builtin(cls: type[_E], original: BaseException | type[BaseException]) -> type[_E]:
    """``cls``, or a subclass of it that is also ``original``'s builtin exception class.

    A policy's ``ValueError`` becomes a ``PolicyError`` that ``except ValueError`` still catches,
    as the ``ValueError`` TorchRL lets through would be. The subclass is made once per pair,
    named like ``PolicyValueError`` and kept in this module (so it pickles); builtins whose
    instance layout cannot be combined with ``cls`` give ``cls`` itself.
    """
    base = _builtin_base(original)
    if base is None or issubclass(cls, base):
        return cls
    name = f"{cls.__name__.removesuffix('Error')}{base.__name__}"
    return _variant(cls, base, name, f"A {cls.__name__} that is also a builtin {base.__name__}.")


def as_worker_error(original: type[BaseException]) -> type[WorkerError]:
    """A subclass of ``WorkerError`` that is also ``original`` (named like ``WorkerEnvError``),
    for re-raising a worker's exception in the collector with its type; ``WorkerError`` itself
    when ``original`` is already one of its bases or cannot be combined with it."""
    if issubclass(WorkerError, original):
        return WorkerError
    return _variant(
        WorkerError,
        original,
        f"Worker{original.__name__}",
        f"A {original.__name__} raised in a collector worker.",
    )


def _variant(cls: type, base: type, name: str, doc: str) -> type:
    """The class ``name(cls, base)``, made once and kept in this module (so it pickles by name)."""
    key = (cls, base)
    if key not in _VARIANTS:
        try:
            variant = type(name, (cls, base), {"__str__": BaseException.__str__})
        except TypeError:  # incompatible instance layouts
            variant = cls
        else:
            variant.__module__ = __name__
            variant.__doc__ = doc
            globals()[name] = variant
        _VARIANTS[key] = variant
    return _VARIANTS[key]
