"""What must happen at exit before a transport closes its groups: a collector still open tells
its ranks to stop over them first. Layers above register here; a transport's exit handler runs
them, so the transport never reaches up into the collectors."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

__all__ = ["before_transports_close", "run_before_close"]

_FIRST: list[Callable[[], None]] = []


def before_transports_close(fn: Callable[[], None]) -> Callable[[], None]:
    """Have ``fn`` run (once per exit, errors ignored) before any transport closes at exit."""
    _FIRST.append(fn)
    return fn


def run_before_close() -> None:
    """Run what was registered, in order; called by a transport's exit handler."""
    for fn in list(_FIRST):
        with contextlib.suppress(Exception):
            fn()
