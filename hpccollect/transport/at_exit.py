"""What must happen at exit, in order: a collector still open tells its ranks to stop (over its
transport's groups: they must still be open), then the transports close their groups. Layers
above and the transports register here; the exit handler of the MPI job's end
(``mpi_job_end``) runs both, so the transport never reaches up into the collectors."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

__all__ = ["before_transports_close", "run_exit_steps", "when_transports_close"]

_FIRST: list[Callable[[], None]] = []
_CLOSE: list[Callable[[], None]] = []


def before_transports_close(fn: Callable[[], None]) -> Callable[[], None]:
    """Have ``fn`` run at exit before any transport closes its groups."""
    _FIRST.append(fn)
    return fn


def when_transports_close(fn: Callable[[], None]) -> Callable[[], None]:
    """Have ``fn`` close a transport's groups at exit, once what ``before_transports_close``
    registered has run."""
    _CLOSE.append(fn)
    return fn


def run_exit_steps() -> None:
    """Run what was registered, in order (errors ignored): first what must happen before the
    transports close, then their closing. Called once, by the exit handler."""
    for fn in [*_FIRST, *_CLOSE]:
        with contextlib.suppress(Exception):
            fn()
