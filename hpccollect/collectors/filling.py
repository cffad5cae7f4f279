"""How a collector fills its ``replay_buffer`` in the background between ``start()`` and
``async_shutdown()``: from a thread of this process running its iterator (``ThreadFilling``), or
by its worker processes writing into a shared buffer themselves (``WorkerFilling``). Either
stops writing inside ``pause()``."""

from __future__ import annotations

import contextlib
import shutil
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from hpccollect._compat import lay_out_on_first_write
from hpccollect.collectors.background import BackgroundThread
from hpccollect.collectors.loops.buffers import store
from hpccollect.protocol import Command, Reply

__all__ = ["ThreadFilling", "WorkerFilling", "inherited_buffer"]


def inherited_buffer(
    buffer: Any, fake_batch: Callable[[], Any], policy_in_workers_only: bool = False
) -> Any:
    """``buffer`` made ready to reach worker processes as one of their start arguments, or None
    when it does not go that way: a TorchRL replay buffer (it has ``share()``) is shared, its
    lazy storage laid out from ``fake_batch()`` first (as TorchRL does), since its shared
    counters travel only to a process being started. hpccollect's own buffer goes to the
    workers at ``start()`` instead (``share_memory_``).

    A storage that lays itself out at its first write (TorchRL's ``shared_init``) is left to
    the workers; so is one that can, when the policy exists only in the workers
    (``policy_factory``), so that no policy is built here."""
    if (
        buffer is None
        or hasattr(buffer, "share_memory_")
        or not callable(getattr(buffer, "share", None))
    ):
        return None
    storage = getattr(buffer, "storage", None)
    if (
        storage is not None
        and not getattr(storage, "initialized", True)
        and not _first_writer_lays_out(storage, policy_in_workers_only)
    ):
        store(buffer, fake_batch(), True)
        buffer.empty()
    if not getattr(buffer, "shared", False):
        buffer.share()
    return buffer


def _first_writer_lays_out(storage: Any, may_enable: bool) -> bool:
    """Whether ``storage`` lays itself out in the process that writes first: TorchRL's
    ``shared_init``, turned on here (as TorchRL's collector turns it on) if ``may_enable``."""
    if getattr(storage, "shared_init", False):
        return True
    if not may_enable or not hasattr(storage, "shared_init"):
        return False
    if not lay_out_on_first_write(storage):
        return False
    # the directory TorchRL's first writer lays the storage out in goes with the storage
    # (TorchRL's collector leaves it in the temp folder)
    weakref.finalize(storage, shutil.rmtree, storage.scratch_dir, True)
    return True


class _RefusedWhileFilling:
    """``iter()`` and ``next()`` refused while ``start()`` fills the replay buffer: the filling
    steps the same envs and policy. Each way of filling says whether it fills now
    (``_filling_now``), and asks the next one in the collector's classes too."""

    def __iter__(self) -> Iterator[Any]:
        """The collector's batches; refused while ``start()`` fills the replay buffer."""
        self._refuse_while_filling()
        return super().__iter__()  # type: ignore[misc]

    def next(self) -> Any:
        """TorchRL's ``next()``; refused while ``start()`` fills the replay buffer."""
        self._refuse_while_filling()
        return super().next()  # type: ignore[misc]

    def _filling_now(self) -> bool:
        return False

    def _refuse_while_filling(self) -> None:
        if self._filling_now():
            raise RuntimeError(
                f"{type(self).__name__} is filling its replay_buffer (start()): call "
                "async_shutdown(close_env=False) before iterating over it."
            )


class ThreadFilling(_RefusedWhileFilling):
    """``start()``/``async_shutdown()`` for a collector whose iterator runs in this process: a
    background thread runs it, extending ``replay_buffer``, until ``async_shutdown()``."""

    _background: BackgroundThread | None = None
    replay_buffer: Any = None

    def _filling_now(self) -> bool:
        bg = self._background  # the thread itself runs the iterator
        running = bg is not None and bg.alive and bg.ident != threading.get_ident()
        return running or super()._filling_now()

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

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Stop the background thread (after the step in progress) for the block's duration."""
        bg = self._background
        if bg is None or not bg.alive:
            yield
            return
        bg.stop(60.0)
        self._background = None
        try:
            yield
        finally:
            self.start()

    def async_shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop the background thread (within ``timeout`` s); shut down if ``close_env``."""
        try:
            self._stop_background(timeout, abandon=close_env)
        finally:
            if close_env:
                self.shutdown()

    def _stop_background(self, timeout: float | None, abandon: bool) -> None:
        """Stop the background thread (within ``timeout`` s, None: 60). ``abandon`` (the
        collector shuts down): with workers (``_pool``), its wait for their batch is given up
        rather than waited out."""
        bg = self._background
        if bg is None:
            return
        pool = getattr(self, "_pool", None)
        if abandon and pool is not None and bg.ident is not None:
            pool.abandon_waits_of(bg.ident)
        try:
            bg.stop(timeout if timeout is not None else 60.0)
        finally:
            if not bg.alive:  # one that would not stop is still the collector's, and refused
                self._background = None


class WorkerFilling(_RefusedWhileFilling):
    """``start()``/``async_shutdown()`` for local worker processes: each extends the
    ``replay_buffer`` itself (``Command.FILL_BUFFER``) until told to stop: hpccollect's buffer
    sent then, in shared memory, or a TorchRL buffer the workers got when they started (see
    ``inherited_buffer``)."""

    _filling = False
    _inherited: Any = None  # the buffer the workers were started with, if any

    def _filling_now(self) -> bool:
        return self._filling or super()._filling_now()

    def start(self) -> None:
        """Workers extend the ``replay_buffer`` themselves until ``async_shutdown()``."""
        buffer = self.replay_buffer
        if buffer is None or (self._inherited is None and not hasattr(buffer, "share_memory_")):
            raise RuntimeError(
                "start() on a multi-process collector needs a replay buffer the workers can "
                "write into: replay_buffer=hpccollect.ReplayBuffer(...) or a TorchRL "
                "ReplayBuffer, passed when the collector is built."
            )
        if self._filling:
            raise RuntimeError("start() was already called; call async_shutdown() first.")
        if self._inherited is None:
            buffer.share_memory_()
            buffer.allocate_like(self._layouts[0])
        self._drain(self._active)
        if self.interruptor is not None:
            self.interruptor.start_collection()  # no preemption while filling
        self._send_fill()

    def _send_fill(self) -> None:
        payload = None if self._inherited is not None else self.replay_buffer
        for i in self._active:
            self._pool.send(i, Command.FILL_BUFFER, payload)
        self._filling = True

    def _stop_filling(self, timeout: float | None) -> None:
        self._filling = False
        for i in self._active:
            self._pool.send(i, Command.STOP_FILLING)
        for i in self._active:
            self._pool.recv(i, Reply.ACK, timeout if timeout is not None else self.worker_timeout)

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """The workers stop writing (each after the batch in progress) for the block."""
        if not self._filling or self._closed:
            yield
            return
        self._stop_filling(None)
        try:
            yield
        finally:
            if not self._closed:
                self._send_fill()

    def async_shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop the workers filling the buffer (within ``timeout`` s), then shut down if
        ``close_env``."""
        try:
            if self._filling and not self._closed:
                self._stop_filling(timeout)
        finally:
            if close_env:
                self.shutdown(timeout)
