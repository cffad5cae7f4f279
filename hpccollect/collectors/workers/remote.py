"""Reaching into a collector by attribute path, here or in its workers (TorchRL's
``get_distant_attr``/``map_fn``): one ``Call`` describes the lookup, the same code answers it in
this process and in a worker (``Command.CALL``)."""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from hpccollect.errors import ArgumentValueError

__all__ = ["Call", "calls_here", "calls_per_worker", "resolve_attr"]

_PART = re.compile(r"\.?([A-Za-z_][A-Za-z0-9_]*)|\[([^\]]+)\]")


def _parts(path: str) -> list[tuple[str, Any]]:
    """``"a.b['k'][0].c"`` as ``[("attr", "a"), ("attr", "b"), ("item", "k"), ...]``."""
    parts, pos = [], 0
    while pos < len(path):
        found = _PART.match(path, pos)
        if found is None or (pos == 0 and path.startswith(".")):
            raise ArgumentValueError(
                f"attribute path {path!r} cannot be read at position {pos}; write it as "
                "name.name['key'][0]."
            )
        name, item = found.groups()
        if name is not None:
            parts.append(("attr", name))
        else:
            try:
                parts.append(("item", ast.literal_eval(item.strip())))
            except (ValueError, SyntaxError):
                raise ArgumentValueError(
                    f"attribute path {path!r}: [{item}] must hold a literal, e.g. ['policy'] or "
                    "[0]."
                ) from None
        pos = found.end()
    if not parts:
        raise ArgumentValueError("the attribute path is empty; name an attribute, e.g. 'frames'.")
    return parts


def _walk(obj: Any, parts: list[tuple[str, Any]]) -> Any:
    for kind, part in parts:
        obj = getattr(obj, part) if kind == "attr" else obj[part]
    return obj


def resolve_attr(obj: Any, path: str) -> Any:
    """The object at ``path`` (attributes and ``[literal]`` items) starting from ``obj``."""
    return _walk(obj, _parts(path))


def _assign(obj: Any, path: str, value: Any) -> None:
    *head, (kind, last) = _parts(path)
    obj = _walk(obj, head)
    if kind == "attr":
        setattr(obj, last, value)
    else:
        obj[last] = value


@dataclass
class Call:
    """One lookup on a collector: ``get`` the object at ``path``, ``call`` it with ``args`` and
    ``kwargs``, or ``set`` it to ``args[0]``. Travels cloudpickled (hooks may be closures)."""

    kind: str
    path: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def apply(self, collector: Any) -> Any:
        if self.kind == "get":
            return resolve_attr(collector, self.path)
        if self.kind == "set":
            _assign(collector, self.path, self.args[0])
            return None
        method = resolve_attr(collector, self.path)
        if not callable(method):
            raise AttributeError(f"{self.path} of {type(collector).__name__} is not callable.")
        return method(*self.args, **self.kwargs)

    def dumps(self) -> bytes:
        return cloudpickle.dumps(self)

    @staticmethod
    def loads(blob: bytes) -> Call:
        return cloudpickle.loads(blob)


def calls_here(
    list_of_args: Sequence[tuple] | None, list_of_kwargs: Sequence[dict] | None
) -> tuple[list[tuple], list[dict]]:
    """The calls ``map_fn`` makes in this process: as many as given (one without arguments when
    none are); args and kwargs must pair up."""
    if list_of_args is None:
        list_of_args = [()] * len(list_of_kwargs) if list_of_kwargs else [()]
    if list_of_kwargs is None:
        list_of_kwargs = [{}] * len(list_of_args)
    if len(list_of_args) != len(list_of_kwargs):
        raise ArgumentValueError(
            f"list_of_args and list_of_kwargs must have the same length; got "
            f"{len(list_of_args)} and {len(list_of_kwargs)}."
        )
    return [tuple(a) for a in list_of_args], [dict(k) for k in list_of_kwargs]


def calls_per_worker(
    n: int, list_of_args: Sequence[tuple] | None, list_of_kwargs: Sequence[dict] | None
) -> tuple[list[tuple], list[dict]]:
    """The calls ``map_fn`` makes on ``n`` workers: one per worker, in worker order."""
    if list_of_args is None:
        list_of_args = [()] * (n if list_of_kwargs is None else len(list_of_kwargs))
    if list_of_kwargs is None:
        list_of_kwargs = [{}] * len(list_of_args)
    if len(list_of_args) != n:
        raise ArgumentValueError(
            f"Expected {n} argument entries (one per worker), got {len(list_of_args)}."
        )
    if len(list_of_kwargs) != n:
        raise ArgumentValueError(
            f"Expected {n} keyword-argument entries (one per worker), got {len(list_of_kwargs)}."
        )
    return [tuple(a) for a in list_of_args], [dict(k) for k in list_of_kwargs]
