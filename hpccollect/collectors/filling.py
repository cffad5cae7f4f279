"""How a collector fills its ``replay_buffer`` in the background between ``start()`` and
``async_shutdown()``: from a thread of this process running its iterator (``ThreadFilling``), or
by its worker processes writing into a shared-memory buffer themselves (``WorkerFilling``)."""

from __future__ import annotations

from typing import Any

from hpccollect.collectors.base import BackgroundThread
from hpccollect.protocol import Command, Reply

__all__ = ["ThreadFilling", "WorkerFilling"]


class ThreadFilling:
    """``start()``/``async_shutdown()`` for a collector whose iterator runs in this process: a
    background thread runs it, extending ``replay_buffer``, until ``async_shutdown()``."""

    _background: BackgroundThread | None = None
    replay_buffer: Any = None

    def start(self) -> None:
        """Fill ``replay_buffer`` from a background thread until ``async_shutdown()``."""
        if self.replay_buffer is None:
            raise RuntimeError(
                "start() needs a replay_buffer: pass replay_buffer=... to the collector, or "
                "iterate over the collector instead."
            )
        if self._background is not None and self._background.alive:
            raise RuntimeError("start() was already called; call async_shutdown() first.")
        self._background = BackgroundThread(self.__iter__, f"{type(self).__name__}-collect")
        self._background.start()

    def async_shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop the background thread (within ``timeout`` s); shut down if ``close_env``."""
        bg, self._background = self._background, None
        try:
            if bg is not None:
                bg.stop(timeout if timeout is not None else 60.0)
        finally:
            if close_env:
                self.shutdown()


class WorkerFilling:
    """``start()``/``async_shutdown()`` for local worker processes: each extends the
    shared-memory ``replay_buffer`` itself (``Command.FILL_BUFFER``) until told to stop."""

    _filling = False

    def start(self) -> None:
        """Workers extend the (shared-memory) ``replay_buffer`` themselves until
        ``async_shutdown()``."""
        buffer = self.replay_buffer
        if buffer is None or not hasattr(buffer, "share_memory_"):
            raise RuntimeError(
                "start() on a multi-process collector needs replay_buffer=hpccollect.ReplayBuffer"
                "(...): the workers write into it through shared memory."
            )
        if self._filling:
            raise RuntimeError("start() was already called; call async_shutdown() first.")
        buffer.share_memory_()
        buffer.allocate_like(self._layouts[0])
        self._drain(self._active)
        if self.interruptor is not None:
            self.interruptor.start_collection()  # no preemption while filling
        for i in self._active:
            self._pool.send(i, Command.FILL_BUFFER, buffer)
        self._filling = True

    def async_shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop the workers filling the buffer (within ``timeout`` s), then shut down if
        ``close_env``."""
        try:
            if self._filling and not self._closed:
                self._filling = False
                for i in self._active:
                    self._pool.send(i, Command.STOP_FILLING)
                for i in self._active:
                    self._pool.recv(
                        i, Reply.ACK, timeout if timeout is not None else self.worker_timeout
                    )
        finally:
            if close_env:
                self.shutdown(timeout)
