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
import copy
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


class _AroundImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it makes module ``name`` run inside ``around()`` (a context
    manager) the first time it is imported. It stays on ``sys.meta_path`` (one comparison per
    import after that): taking it off while another thread walks the list could make that
    thread skip a finder. A look-up alone (``importlib.util.find_spec``) leaves it armed."""

    def __init__(self, name: str, around: Callable[[], contextlib.AbstractContextManager]) -> None:
        self.name, self.around, self.done = name, around, False
        self._looking = threading.local()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or self.done or getattr(self._looking, "now", False):
            return None
        self._looking.now = True
        try:
            spec = importlib.util.find_spec(fullname)  # what the finders after this one find
        finally:
            self._looking.now = False
        if spec is None or spec.loader is None:
            return spec
        spec = copy.copy(spec)
        spec.loader = _AroundLoader(spec.loader, self)
        return spec


class _AroundLoader(importlib.abc.Loader):
    """``inner``, whose module runs inside its finder's ``around()``; the module keeps
    ``inner`` as its loader."""

    def __init__(self, inner: Any, finder: _AroundImport) -> None:
        self.inner, self.finder = inner, finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.inner
        if module.__spec__ is not None:
            module.__spec__.loader = self.inner
        self.finder.done = True
        with self.finder.around():
            self.inner.exec_module(module)


@contextlib.contextmanager
def _then_register_pending() -> Iterator[None]:
    """Around dynamo's first import: the records handed to it once it has run."""
    yield
    _register_pending()


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
    """Around tensordict's first import: its marks recorded, not handed to dynamo (above)."""
    import torch.compiler

    originals = torch.compiler.allow_in_graph, torch.compiler.assume_constant_result
    torch.compiler.allow_in_graph = _record
    torch.compiler.assume_constant_result = _mark_constant
    try:
        yield
    finally:
        torch.compiler.allow_in_graph, torch.compiler.assume_constant_result = originals
        if _DYNAMO in sys.modules:  # something imported dynamo meanwhile
            _register_pending()


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
        if not any(isinstance(finder, _AroundImport) for finder in sys.meta_path):
            sys.meta_path[:0] = [
                _AroundImport(_TENSORDICT, _marks_recorded),
                _AroundImport(_DYNAMO, _then_register_pending),
            ]
