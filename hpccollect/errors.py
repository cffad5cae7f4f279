"""Typed errors raised by hpccollect.

Every message states the bad value, what was expected and how to fix it. The classes also derive
from the matching builtin (``TypeError``, ``ValueError``, ``RuntimeError``, ``TimeoutError``) so
code written against TorchRL's exceptions keeps catching them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

_E = TypeVar("_E", bound="HpcCollectError")

__all__ = [
    "ArgumentTypeError",
    "ArgumentValueError",
    "CollectorTimeoutError",
    "EnvError",
    "HpcCollectError",
    "JobError",
    "NotProvidedError",
    "PolicyError",
    "StorageError",
    "WaitAbandoned",
    "WorkerError",
    "as_worker_error",
    "with_builtin",
]


class HpcCollectError(Exception):
    """Base class of every error hpccollect raises on purpose.

    Instances pickle with their class, message and attributes, in any process (see
    ``__reduce__``), so they can be sent through queues, pools and job results.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        """Rebuild without ``__init__`` (keyword-only arguments, a message formatted once) and
        name a ``with_builtin``/``as_worker_error`` variant by its recipe, not by its name, so a
        process that never made it makes it again.

        ``__cause__``, ``__context__`` and ``__traceback__`` are not kept (as for any exception);
        attributes are, ``WorkerError.remote_traceback`` among them.
        """
        reduced = super().__reduce__()  # (class, args[, state]); OSError's args have filenames
        state = reduced[2] if len(reduced) > 2 else None
        return (_rebuild, (_picklable_recipe(type(self)), reduced[1]), state)


class NotProvidedError(HpcCollectError, NotImplementedError):
    """A TorchRL name hpccollect does not provide (yet): importing it works, so code written for
    TorchRL loads; building one raises this, saying what to use instead."""


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


class WaitAbandoned(HpcCollectError, RuntimeError):
    """A wait for workers given up because the collector shuts down: the background thread
    (``start()``) that was waiting for a batch ends with it, quietly (see
    ``WorkerPool.abandon_waits_of``). Only that thread's waits raise it."""


class JobError(HpcCollectError, RuntimeError):
    """A job submitted for the user (the main job of ``submitit_delayed_launcher``) failed; the
    message holds its traceback and names its log."""


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

#: a class as pickle can name it: a class importable by module and name, or a variant's maker
#: and the recipes of its arguments (``(as_worker_error, (KeyError,))``)
_Recipe: TypeAlias = "type | tuple[Callable[..., type], tuple[_Recipe, ...]]"

#: how each variant was made: its maker and the classes that maker was called with
_RECIPES: dict[type, tuple[Callable[..., type], tuple[type, ...]]] = {}


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
    doc = f"A {cls.__name__} that is also a builtin {base.__name__}."
    return _variant(cls, base, name, doc, (with_builtin, (cls, base)))


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
        (as_worker_error, (original,)),
    )


def _variant(
    cls: type,
    base: type,
    name: str,
    doc: str,
    recipe: tuple[Callable[..., type], tuple[type, ...]],
) -> type:
    """The class ``name(cls, base)``, made once; ``recipe`` (maker, arguments) remakes it in
    another process. It is also kept in this module's namespace, for code that looks it up."""
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
            _RECIPES[variant] = recipe
        _VARIANTS[key] = variant
    return _VARIANTS[key]


def _importable(cls: type) -> bool:
    """Whether pickle can name ``cls`` by module and qualified name (not a class made in a
    function, nor one its module no longer holds under that name)."""
    obj: Any = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        obj = getattr(obj, part, None)
    return obj is cls


def _recipe(cls: type) -> _Recipe | None:
    """``cls`` as pickle can name it, or None when it cannot."""
    if cls in _RECIPES:
        maker, parts = _RECIPES[cls]
        recipes = tuple(_recipe(part) for part in parts)
        return None if None in recipes else (maker, recipes)
    return cls if _importable(cls) else None


def _picklable_recipe(cls: type) -> _Recipe:
    """The recipe of ``cls`` or, when it cannot be named, of its nearest base that can: a
    worker's error of a class made in a function comes back a plain ``WorkerError``."""
    for base in cls.__mro__:
        found = _recipe(base)
        if found is not None:
            return found
    raise AssertionError("unreachable: HpcCollectError is importable")


def _class(recipe: _Recipe) -> type:
    """The class ``recipe`` names, remaking the variants it takes."""
    if isinstance(recipe, type):
        return recipe
    maker, parts = recipe
    return maker(*(_class(part) for part in parts))


def _rebuild(recipe: _Recipe, args: tuple[Any, ...]) -> BaseException:
    """An unpickled hpccollect error: of the class ``recipe`` names, with its ``args`` (the
    final message) and no ``__init__`` call; pickle then restores its attributes."""
    cls = _class(recipe)
    return cls.__new__(cls, *args)
