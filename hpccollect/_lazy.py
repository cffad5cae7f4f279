"""Registered plug-ins named as ``"module:attr"``: imported on first use, so registering one
loads nothing (a launcher's mpi4py, a collector kind's worker machinery).

Every kind of plug-in (launcher, transport, collector kind, storage format, execution backend)
is registered the same way, ``register_*(name, "module:attr")``, and a package outside can add
one through its entry-point group (``GROUPS``), read once, when the registry is first asked::

    [project.entry-points."hpccollect.launchers"]
    mine = "my_package.launch:MyLauncher"
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from typing import Any

from hpccollect.errors import ArgumentTypeError, ArgumentValueError

__all__ = [
    "GROUPS",
    "add_object",
    "called_on_use",
    "check_target",
    "entry_points",
    "lazy_exports",
    "load_target",
    "loaded_objects",
    "with_entry_points",
]

#: the entry-point group of each kind of plug-in
GROUPS = {
    "launcher": "hpccollect.launchers",
    "transport": "hpccollect.transports",
    "collector kind": "hpccollect.collector_kinds",
    "storage format": "hpccollect.storage_formats",
    "execution backend": "hpccollect.executions",
}


def check_target(target: str) -> str:
    """``target`` if it has the ``"module:attr"`` form; an error naming the form otherwise."""
    if not isinstance(target, str) or ":" not in target:
        raise ArgumentValueError(f"target must be 'module:attr', got {target!r}.")
    return target


def load_target(target: str) -> Any:
    """The object ``"module:attr"`` names, its module imported now."""
    module, _, attr = check_target(target).partition(":")
    return getattr(importlib.import_module(module), attr)


def called_on_use(target: str) -> Callable[..., Any]:
    """A callable that calls ``"module:attr"``'s, its module imported at the first call: a
    plug-in's function or class given where a callable is asked for, loading nothing. It
    pickles by its target."""
    return _CalledOnUse(check_target(target))


class _CalledOnUse:
    def __init__(self, target: str) -> None:
        self.target = target

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return load_target(self.target)(*args, **kwargs)

    def __reduce__(self) -> tuple[Callable[[str], Any], tuple[str]]:
        return called_on_use, (self.target,)

    def __repr__(self) -> str:
        return f"called_on_use({self.target!r})"


def entry_points(kind: str) -> dict[str, str]:
    """The plug-ins of ``kind`` (a key of ``GROUPS``) that installed packages declare: name ->
    ``"module:attr"``, nothing imported."""
    from importlib.metadata import entry_points as declared

    return {point.name: check_target(point.value) for point in declared(group=GROUPS[kind])}


_READ: set[str] = set()


def with_entry_points(kind: str, registry: dict, make: Callable[[str], Any] = str) -> dict:
    """``registry`` with the installed packages' plug-ins of ``kind`` added (read once per
    process; a name already registered keeps its plug-in), each as ``make(target)``."""
    if kind not in _READ:
        _READ.add(kind)
        for name, target in entry_points(kind).items():
            registry.setdefault(name, make(target))
    return registry


def add_object(registry: dict, name: Any, target: str | None, cls: type, call: str) -> None:
    """Register under ``name`` either ``name`` itself, an instance of ``cls`` (under its own
    ``.name``), or the ``"module:attr"`` ``target`` naming one (imported on first use)."""
    if isinstance(name, cls):
        registry[name.name] = name
    elif isinstance(name, str) and target is not None:
        registry[name] = check_target(target)
    else:
        raise ArgumentTypeError(
            f"{call} takes (name, 'module:attr') or a {cls.__name__}, got "
            f"{type(name).__name__} and {target!r}."
        )


def loaded_objects(kind: str, registry: dict, cls: type) -> dict:
    """``registry`` (installed packages' plug-ins of ``kind`` added) with every
    ``"module:attr"`` entry imported and checked to be a ``cls``."""
    for name, entry in with_entry_points(kind, registry).items():
        if isinstance(entry, str):
            found = load_target(entry)
            if not isinstance(found, cls):
                raise ArgumentTypeError(
                    f"the {kind} {name!r} ({entry}) is a {type(found).__name__}, not a "
                    f"{cls.__module__}.{cls.__name__}."
                )
            registry[name] = found
    return registry


def lazy_exports(
    package: str, targets: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` (PEP 562) for names it re-exports, each
    imported on first use: importing the package costs nothing, so ``python -m hpccollect``
    reads its command line and reports a mistake before torch loads.

    Args:
        package: the package's ``__name__``.
        targets: public name -> ``"module:attr"`` (``"module"`` alone: the module itself).
            The package's submodules are attributes too, imported on first use.

    Returns:
        ``(__getattr__, __dir__)``, to be bound at the package's top level; the table is
        ``__getattr__.targets`` (the layer checks read it).
    """

    def __getattr__(name: str) -> Any:
        target = targets.get(name)
        if target is None and not name.startswith("__"):  # a submodule, as an eager import
            submodule = f"{package}.{name}"  # made it an attribute
            target = submodule if importlib.util.find_spec(submodule) is not None else None
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = load_target(target) if ":" in target else importlib.import_module(target)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *targets})

    __getattr__.targets = dict(targets)  # type: ignore[attr-defined]

    return __getattr__, __dir__
