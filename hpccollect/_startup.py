"""Import tensordict without importing ``torch._dynamo``: half of every process's start-up.

While tensordict imports, it marks a few of its functions for ``torch.compile`` through
``torch.compiler.allow_in_graph`` and ``torch.compiler.assume_constant_result``. Each call
imports ``torch._dynamo`` first, which takes about 1.2 s of the 2.6 s a collector rank or
worker spends importing before it collects (torch 2.13, tensordict 0.15, this project's
2-core machine). Nothing needs dynamo until something compiles, so tensordict's first import after
``import hpccollect`` (``defer_dynamo``), whoever makes it, runs with the two functions
replaced:

* ``assume_constant_result`` only sets ``fn._dynamo_marked_constant``; that is done at once.
* ``allow_in_graph`` records ``fn``. The records are handed to the real ``allow_in_graph``
  right after ``torch._dynamo`` is first imported, by ``torch.compile`` or by anyone else, so
  dynamo holds the same registrations before it can trace anything.

The two originals are put back as soon as tensordict is imported. Nothing changes where
tensordict or dynamo is already imported (say, the user's script imported tensordict before
hpccollect), or where the environment sets ``HPCCOLLECT_EAGER_DYNAMO=1``.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

__all__ = ["defer_dynamo"]

_DYNAMO = "torch._dynamo"
_TENSORDICT = "tensordict"
_lock = threading.Lock()
_pending: list[Any] = []


def _register_pending() -> None:
    import torch.compiler

    with _lock:
        pending = list(_pending)
        _pending.clear()
    for fn in pending:
        torch.compiler.allow_in_graph(fn)


class _RegisterWhenDynamoLoads(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it makes the loader of ``torch._dynamo`` register the records
    once the module has run, then takes itself off ``sys.meta_path``."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _DYNAMO:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module: ModuleType) -> None:
            exec_module(module)
            _register_pending()

        spec.loader.exec_module = exec_then_register  # type: ignore[method-assign]
        return spec


def _record(fn: Callable) -> Callable:
    if _DYNAMO in sys.modules:
        import torch._dynamo

        return torch._dynamo.allow_in_graph(fn)
    if isinstance(fn, (list, tuple)):
        return [_record(one) for one in fn]
    if not callable(fn):
        raise AssertionError("allow_in_graph expects a callable")
    with _lock:
        _pending.append(fn)
    return fn


def _mark_constant(fn: Callable) -> Callable:
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


@contextlib.contextmanager
def _marks_recorded() -> Iterator[None]:
    """While tensordict imports: its marks recorded, not handed to dynamo (see above)."""
    import torch.compiler

    sys.meta_path.insert(0, _RegisterWhenDynamoLoads())
    originals = torch.compiler.allow_in_graph, torch.compiler.assume_constant_result
    torch.compiler.allow_in_graph = _record
    torch.compiler.assume_constant_result = _mark_constant
    try:
        yield
    finally:
        torch.compiler.allow_in_graph, torch.compiler.assume_constant_result = originals
        if _DYNAMO in sys.modules:  # something imported dynamo meanwhile, finder already gone
            _register_pending()


class _WhenTensordictLoads(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it makes tensordict's first import run under
    ``_marks_recorded``, then takes itself off ``sys.meta_path``."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TENSORDICT:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        if _DYNAMO in sys.modules:  # nothing left to save
            return None
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_with_marks_recorded(module: ModuleType) -> None:
            with _marks_recorded():
                exec_module(module)

        spec.loader.exec_module = exec_with_marks_recorded  # type: ignore[method-assign]
        return spec


def defer_dynamo() -> None:
    """Make tensordict's first import, whoever makes it, leave ``torch._dynamo`` unimported
    (see the module's docstring); ``import hpccollect`` calls it. It imports nothing itself.

    Does nothing where tensordict or dynamo is already imported, where
    ``HPCCOLLECT_EAGER_DYNAMO=1``, or where it was already called.
    """
    if _TENSORDICT in sys.modules or _DYNAMO in sys.modules:
        return
    if os.environ.get("HPCCOLLECT_EAGER_DYNAMO", "") not in ("", "0"):
        return
    with _lock:
        if not any(isinstance(finder, _WhenTensordictLoads) for finder in sys.meta_path):
            sys.meta_path.insert(0, _WhenTensordictLoads())
