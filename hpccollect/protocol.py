"""Every message between a collector and its workers (local processes or ranks), declared once.

A message is ``(kind, payload)``: the collector sends a ``Command``, the worker answers with the
``Reply`` that command names (``Command.reply``). Each kind declares its payload's type, checked
by ``message()`` on both sides. Batches never travel as messages: a worker writes them into
buffers agreed once (shared memory for local processes) and replies ``BATCH`` with the number of
frames written.

Commands marked ``local_only`` pass objects that only work inside one machine (a shared-memory
replay buffer); a channel between hosts refuses them (``Channel.local``).
"""

from __future__ import annotations

import builtins
import enum
import socket
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tensordict import TensorDictBase

from hpccollect import errors

__all__ = ["Command", "Layout", "Message", "RemoteError", "Reply", "Seed", "message"]


@dataclass(frozen=True)
class Seed:
    """``SEED``'s payload: the first env's seed, and whether every env gets the same one."""

    seed: int
    static_seed: bool


@dataclass(frozen=True)
class Layout:
    """``LAYOUT``'s payload, sent once when a worker is ready: the TensorDict its batches are
    written into (shared memory for local processes), and where the worker runs.

    ``by_value``: the batches fit no fixed buffers (an env with dynamic or heterogeneous specs,
    or non-tensor entries): ``batch`` is an empty TensorDict of a batch's shape, and each batch
    travels itself, as ``DATA`` just before its ``BATCH``."""

    batch: TensorDictBase
    host: str
    pid: int
    by_value: bool = False
    #: a local worker that built its own policy (``policy_factory``): the shared-memory buffer
    #: ``UPDATE_WEIGHTS`` loads, made from that policy (None: the collector gave one)
    weights: TensorDictBase | None = None
    #: the frames of one of the worker's batches (0: ``batch.numel()``; a worker that sends
    #: reports announces a report's layout as ``batch``)
    frames: int = 0


@dataclass(frozen=True)
class RemoteError:
    """``ERROR``'s payload: an exception raised in a worker, described so the collector can raise
    one of the same type (see ``hpccollect.collectors.workers.pool``) without unpickling foreign classes.

    ``kind`` is the hpccollect error class it is (a name in ``hpccollect.errors.__all__``), if any;
    ``builtin_bases`` the builtin exception classes it derives from, most specific first;
    ``attrs`` its plain attributes (``EnvError.env_name``, ``step``).
    """

    type_name: str
    kind: str | None
    builtin_bases: tuple[str, ...]
    message: str
    traceback: str
    host: str
    attrs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_exception(cls, err: BaseException) -> RemoteError:
        """Describe ``err`` (being handled) in the worker that raised it."""
        mro = type(err).__mro__
        kind = next(
            (
                c.__name__
                for c in mro
                if c.__module__ == errors.__name__
                and c.__name__ in errors.__all__
                and c is not errors.WorkerError
            ),
            None,
        )
        bases = tuple(
            c.__name__ for c in mro if c.__module__ == "builtins" and issubclass(c, Exception)
        )
        attrs = {
            k: v
            for k, v in vars(err).items()
            if isinstance(v, (str, int, float, bool, type(None))) and not k.startswith("_")
        }
        return cls(
            type_name=type(err).__name__,
            kind=kind,
            builtin_bases=bases,
            message=str(err),
            traceback=traceback.format_exc(),
            host=socket.gethostname(),
            attrs=attrs,
        )

    def original_class(self) -> type[BaseException] | None:
        """The class to raise in the collector: the hpccollect error (with its builtin base) or
        the builtin exception the worker raised; None when neither can be rebuilt here."""
        bases = [getattr(builtins, name) for name in self.builtin_bases]
        if self.kind is None:
            return bases[0] if bases else None
        cls = getattr(errors, self.kind)
        missing = [b for b in bases if not issubclass(cls, b)]  # with_builtin's variants
        return errors.with_builtin(cls, missing[0]) if missing else cls


class Reply(enum.Enum):
    """What a worker sends back, and the type of its payload."""

    LAYOUT = ("layout", Layout)  # sent once at start, unasked
    BATCH = ("batch", int)  # frames written into the batch buffers (or reported in them)
    DATA = ("data", TensorDictBase)  # the batch itself, before its BATCH (Layout.by_value)
    SEEDED = ("seeded", int)  # the last env's seed
    STATE = ("state", Mapping)  # the worker collector's state_dict
    VALUE = ("value", object)  # what a CALL returned
    ACK = ("ack", type(None))
    ERROR = ("error", RemoteError)  # the worker failed; it exits after sending this

    def __init__(self, wire: str, payload: type) -> None:
        self.wire, self.payload = wire, payload


class Command(enum.Enum):
    """What the collector asks a worker to do: payload type, expected reply, local-only flag."""

    # write one batch into the buffers; a worker that sends reports: up to this many batches,
    # then their report (``collectors/workers/reports.py``)
    COLLECT = ("collect", int, Reply.BATCH, False)
    UPDATE_WEIGHTS = ("update_weights", type(None), Reply.ACK, False)  # load the weights buffer
    SEED = ("seed", Seed, Reply.SEEDED, False)
    RESET = ("reset", type(None), Reply.ACK, False)  # reset every env before the next batch
    STATE_DICT = ("state_dict", type(None), Reply.STATE, False)
    LOAD_STATE_DICT = ("load_state_dict", Mapping, Reply.ACK, False)
    # extend a shared-memory replay buffer batch after batch until STOP_FILLING, then ACK
    FILL_BUFFER = ("fill_buffer", object, Reply.ACK, True)
    STOP_FILLING = ("stop_filling", type(None), Reply.ACK, True)  # answered by FILL_BUFFER's ACK
    # get, call or set an attribute path of the worker's collector (a cloudpickled remote.Call)
    CALL = ("call", bytes, Reply.VALUE, False)
    SHUTDOWN = ("shutdown", bool, None, False)  # close_env: close, exit; no reply

    def __init__(self, wire: str, payload: type, reply: Reply | None, local_only: bool) -> None:
        self.wire, self.payload, self.reply, self.local_only = wire, payload, reply, local_only


Message = tuple[Command | Reply, Any]


def message(kind: Command | Reply, payload: Any = None) -> Message:
    """The message ``(kind, payload)``, after checking the payload has ``kind``'s declared type."""
    if kind.payload is object:
        return kind, payload
    if not isinstance(payload, kind.payload) or isinstance(payload, bool) is not (
        kind.payload is bool
    ):
        raise errors.ArgumentTypeError(
            f"{type(kind).__name__}.{kind.name} carries a {kind.payload.__name__}, got "
            f"{type(payload).__name__}; this is a bug in hpccollect, please report it."
        )
    return kind, payload
