"""``BackgroundThread``: a single-process collector's iterator run in a thread of its own
(``start()``), stopped within one env step (``async_shutdown``)."""

from __future__ import annotations

import threading
from typing import Any

from hpccollect.errors import CollectorTimeoutError, WaitAbandoned

__all__ = ["BackgroundThread"]


class BackgroundThread:
    """Runs a collector's iterator in a daemon thread (``start()`` on a single-process collector).

    The thread checks ``stop_requested`` after every env step, so ``stop()`` returns within one
    step's time; an exception in the thread is re-raised by ``stop()``.

    Args:
        iterator_factory: makes the iterator to run (the collector's ``__iter__``).
        name: the thread's name.
    """

    def __init__(self, iterator_factory: Any, name: str) -> None:
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._factory = iterator_factory
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def stop_requested(self) -> bool:
        """Whether ``stop()`` was called: the iterator checks it after every env step."""
        return self._stop.is_set()

    def start(self) -> None:
        """Start running the iterator."""
        self._thread.start()

    def _run(self) -> None:
        try:
            for _ in self._factory():
                if self._stop.is_set():
                    break
        except WaitAbandoned:  # stop() gave up the wait for a batch: that is a stop too
            pass
        except BaseException as err:  # re-raised in the caller's thread by stop()
            self._error = err

    @property
    def ident(self) -> int | None:
        """The thread's ident (None before ``start()``)."""
        return self._thread.ident

    @property
    def alive(self) -> bool:
        """Whether the thread still runs."""
        return self._thread.is_alive()

    def stop(self, timeout: float | None) -> None:
        """Stop the iterator and wait for the thread.

        Args:
            timeout: seconds to wait for the thread (None: no limit).

        Raises:
            CollectorTimeoutError: the thread did not end within ``timeout``.
            BaseException: whatever the iterator raised in the thread.
        """
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise CollectorTimeoutError(
                f"the background collection thread did not stop within {timeout} s; the env step "
                "in progress may be blocking. Call async_shutdown again with a larger timeout."
            )
        if self._error is not None:
            err, self._error = self._error, None
            raise err
