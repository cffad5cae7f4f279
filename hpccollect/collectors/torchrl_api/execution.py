"""``Collector(..., backend=..., num_collectors=..., sync=...)``: TorchRL 0.14.1's one entry
point that builds the collector an execution backend names (TorchRL's word; a transport's
``backend=`` is another registry, ``hpccollect/transport/backends.py``).

``"direct"`` (the default without ``num_collectors``) is the single-process collector itself,
``"process"`` (the default with ``num_collectors``) a ``MultiCollector`` with one worker per
env constructor, ``"distributed"`` and ``"submitit"`` a ``DistributedDataCollector``, ``"rpc"``
an ``RPCCollector``. TorchRL's ``"ray"`` has no counterpart here and is refused, naming what to
use.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from hpccollect._lazy import check_target, load_target, with_entry_points
from hpccollect.errors import ArgumentTypeError, ArgumentValueError

__all__ = ["ByExecution", "execution_names", "register_execution"]

#: execution backend -> ("module:Class" it builds, "module:Class" whose constructor's defaults
#: it has); each is imported on its first use, so a local collector never loads the
#: distributed layer. ``hpccollect/__init__.py`` registers them all: the collectors they
#: name import this module (the single-process collector is built by its metaclass)
_EXECUTIONS: dict[str, tuple[str, str]] = {}
_ALIASES = {"multiprocessing": "process"}  # TorchRL's long spelling, kept as an alias there
_THEIRS = {"ray": "RayCollector"}
_SELECTORS = frozenset({"backend_options", "num_collectors", "num_workers", "sync"})


class ByExecution(abc.ABCMeta):
    """Metaclass of the single-process collector: ``backend``, ``backend_options``,
    ``num_collectors`` and ``sync`` select what calling the class itself builds."""

    @property
    def __signature__(cls) -> inspect.Signature:
        """The constructor's signature (not this ``__call__``'s), for ``help()`` and IDEs."""
        signature = inspect.signature(cls.__init__)
        return signature.replace(parameters=list(signature.parameters.values())[1:])

    def __call__(
        cls,
        *args: Any,
        backend: Any = None,
        backend_options: Any = None,
        num_collectors: Any = None,
        sync: Any = None,
        **kwargs: Any,
    ) -> Any:
        selectors = (backend, backend_options, num_collectors, sync)
        if cls.__dict__.get("_dispatches") is not True:
            if any(value is not None and value != "direct" for value in selectors):
                raise ArgumentValueError(
                    f"backend, backend_options, num_collectors and sync select a collector only "
                    f"when hpccollect.Collector itself is called, not {cls.__name__}; build "
                    "the collector you want directly."
                )
            return super().__call__(*args, **kwargs)
        if len(args) > 2:
            raise ArgumentTypeError(
                "Collector takes at most create_env_fn and policy positionally; pass the rest "
                "by name."
            )
        _check_num_collectors(num_collectors)
        if backend is None:
            backend = "direct" if num_collectors is None else "process"
        backend = _ALIASES.get(backend, backend)
        options = _options(backend_options, args, kwargs)
        if backend not in execution_names():
            raise ArgumentValueError(_unknown(backend))
        if backend == "direct":
            if num_collectors not in (None, 1):
                raise ArgumentValueError(
                    f"backend='direct' supports at most one collector (it runs in this "
                    f"process), got num_collectors={num_collectors}: use backend='process' for "
                    "several."
                )
            if sync is not None or options:
                raise ArgumentValueError(
                    "backend='direct' is one collector in this process: num_collectors, sync and "
                    "backend_options apply to the other backends ('process', 'distributed')."
                )
            # a list of env constructors is one vector env here (hpccollect's own), as before
            return super().__call__(*args, **kwargs)
        if sync is None:
            sync = False
        elif not isinstance(sync, bool):
            raise ArgumentTypeError(f"sync must be True, False or None, got {sync!r}.")
        kwargs.update(options)
        args, kwargs = _env_per_collector(args, kwargs, num_collectors)
        target, init = _target(backend)
        _drop_defaults_the_target_has_otherwise(cls, init, kwargs)
        if backend == "submitit" and kwargs.setdefault("launcher", "submitit") != "submitit":
            raise ArgumentValueError(
                f"backend='submitit' runs its collectors as SLURM jobs: drop "
                f"launcher={kwargs['launcher']!r}, or use backend='distributed'."
            )
        return target(*args, sync=sync, **kwargs)


def _check_num_collectors(num_collectors: Any) -> None:
    if num_collectors is None:
        return
    if isinstance(num_collectors, bool) or not isinstance(num_collectors, int):
        raise ArgumentTypeError(
            f"num_collectors must be a positive integer (how many collectors to run), got "
            f"{num_collectors!r}."
        )
    if num_collectors < 1:
        raise ArgumentValueError(
            f"num_collectors must be a positive integer (how many collectors to run), got "
            f"{num_collectors}."
        )


def _unknown(backend: Any) -> str:
    if backend in _THEIRS:
        return (
            f"backend={backend!r} needs TorchRL's {_THEIRS[backend]}, which hpccollect does not "
            "have: use backend='process' (worker processes on this machine) or "
            "'distributed'/'submitit' (ranks over torch.distributed or MPI, started by mp, "
            "mpiexec or SLURM)."
        )
    return f"backend must be one of {list(execution_names())}, got {backend!r}."


def _options(backend_options: Any, args: tuple, kwargs: dict) -> dict:
    """``backend_options`` as a dict, checked not to repeat a selector or another argument."""
    options = dict(backend_options or {})
    clash = _SELECTORS & options.keys()
    if clash:
        raise ArgumentValueError(
            f"backend_options contains reserved selector keys {sorted(clash)}: pass them to "
            "Collector itself."
        )
    given = set(kwargs) | {"create_env_fn", "policy"}.intersection(
        ("create_env_fn", "policy")[: len(args)]
    )
    twice = options.keys() & given
    if twice:
        raise ArgumentValueError(
            f"backend_options duplicate top-level collector arguments {sorted(twice)}: give "
            "each once."
        )
    return options


def _env_arg(args: tuple, kwargs: dict) -> tuple[bool, Any]:
    if args:
        return True, args[0]
    return False, kwargs.get("create_env_fn")


def _with_env(args: tuple, kwargs: dict, positional: bool, env: Any) -> tuple[tuple, dict]:
    if positional:
        return (env, *args[1:]), kwargs
    return args, {**kwargs, "create_env_fn": env}


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _env_per_collector(args: tuple, kwargs: dict, num_collectors: Any) -> tuple[tuple, dict]:
    """One env constructor per collector, from a list or from one repeated ``num_collectors``
    times (one, when not given)."""
    positional, env = _env_arg(args, kwargs)
    if env is None:
        return args, kwargs
    if _is_list(env):
        if not env:
            raise ArgumentValueError("create_env_fn is an empty list; give at least one env.")
        if num_collectors is not None and num_collectors != len(env):
            raise ArgumentValueError(
                f"num_collectors does not match the number of env constructors: "
                f"num_collectors={num_collectors} but create_env_fn lists {len(env)}; give one "
                "per collector, or one constructor and num_collectors."
            )
        env = list(env)
    else:
        env = [env] * (num_collectors or 1)
    return _with_env(args, kwargs, positional, env)


def register_execution(name: str, target: str, *, defaults_from: str | None = None) -> None:
    """Make ``Collector(backend=name)`` build a collector of another kind.

    Args:
        name: the ``backend`` value that selects it.
        target: ``"module:Class"`` of what it builds, imported on its first use.
        defaults_from: ``"module:Class"`` whose constructor's defaults it has, when not
            ``target``'s own (a class that dispatches to others).
    """
    defaults = target if defaults_from is None else defaults_from
    _EXECUTIONS[name] = (check_target(target), check_target(defaults))


def _executions() -> dict[str, tuple[str, str]]:
    """The registered backends, installed packages' ``hpccollect.executions`` included (whose
    defaults are their class's own)."""
    return with_entry_points("execution backend", _EXECUTIONS, lambda target: (target, target))


def execution_names() -> tuple[str, ...]:
    """Every ``Collector(backend=...)`` value: ``"direct"`` and the registered ones."""
    return ("direct", *_executions())


def _target(backend: str) -> tuple[type, Callable]:
    target, defaults = _executions()[backend]
    return load_target(target), load_target(defaults).__init__


def _drop_defaults_the_target_has_otherwise(cls: type, init: Callable, kwargs: dict) -> None:
    """An argument left at ``Collector``'s default is dropped where the target has no such
    argument or another default (a structured config lists every default, as TorchRL's)."""
    ours = inspect.signature(cls.__init__).parameters
    theirs = inspect.signature(init).parameters
    for name in list(kwargs):
        mine = ours.get(name)
        if mine is None or mine.default is inspect.Parameter.empty:
            continue
        if not _same(kwargs[name], mine.default):
            continue
        other = theirs.get(name)
        if other is None or other.default != mine.default:
            del kwargs[name]


def _same(value: Any, default: Any) -> bool:
    if value is default:
        return True
    try:
        return bool(type(value) is type(default) and value == default)
    except (TypeError, ValueError, RuntimeError):  # tensors and the like: never a default
        return False
