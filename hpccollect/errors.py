"""Typed errors raised by hpccollect.

Every message states the bad value, what was expected and how to fix it. The classes also derive
from the matching builtin (``TypeError``, ``ValueError``, ``RuntimeError``, ``TimeoutError``) so
code written against TorchRL's exceptions keeps catching them.
"""

from __future__ import annotations

__all__ = [
    "ArgumentTypeError",
    "ArgumentValueError",
    "CollectorTimeoutError",
    "EnvError",
    "HpcCollectError",
    "PolicyError",
    "StorageError",
    "WorkerError",
]


class HpcCollectError(Exception):
    """Base class of every error hpccollect raises on purpose."""


class ArgumentTypeError(HpcCollectError, TypeError):
    """An argument has the wrong type."""


class ArgumentValueError(HpcCollectError, ValueError):
    """An argument has the right type but a value that cannot work."""


class EnvError(HpcCollectError, RuntimeError):
    """An environment raised, or returned something the collector cannot record.

    Attributes:
        env_name: the env id (or class name) that failed.
        step: the collector-wide step index at which it failed, or None during reset/creation.
    """

    def __init__(self, message: str, *, env_name: str = "", step: int | None = None) -> None:
        super().__init__(message)
        self.env_name = env_name
        self.step = step


class PolicyError(HpcCollectError, RuntimeError):
    """The policy raised, or wrote outputs that do not match the environment's action spec."""


class StorageError(HpcCollectError, OSError):
    """Writing a dataset file failed (full disk, file-size limit, I/O error, read-only disk).

    The message is one line naming the file and the cause; rows committed before it are kept.
    """


class CollectorTimeoutError(HpcCollectError, TimeoutError):
    """A blocking wait ran past its timeout."""


class WorkerError(HpcCollectError, RuntimeError):
    """A collector worker process raised, or died.

    Attributes:
        worker: the worker's index.
        host: the host it ran on.
        remote_traceback: the worker's formatted traceback ("" when it died without one).
    """

    def __init__(self, message: str, *, worker: int, host: str, remote_traceback: str = "") -> None:
        head = f"Worker {worker} on {host}: {message}"
        if remote_traceback:
            head += f"\n\n--- traceback in worker {worker} ---\n{remote_traceback.rstrip()}"
        super().__init__(head)
        self.worker = worker
        self.host = host
        self.remote_traceback = remote_traceback
