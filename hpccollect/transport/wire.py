"""The wire format of ``RankChannel`` messages between rank 0 and a collector rank.

Every message is one point-to-point send of ``HEADER`` bytes (kind, payload length, an int
value, the sender's weight-broadcast count, the payload bytes that follow inline) and then the
payload. A batch is the header plus the batch's bytes, sent from a buffer laid out once
(``batches.FlatLayout``) straight into the receiver's buffer, whose views are the
``Layout.batch`` the collector reads: one message per batch, nothing pickled. Other payloads
(seeds, states, errors) are pickled: only a job's own ranks may connect (the store is the
rendezvous). A payload longer than the room the receiver has sends its rest in a second
message.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import torch

from hpccollect.protocol import Command, Reply, message
from hpccollect.transport.batches import FlatLayout

__all__ = [
    "BEATS",
    "CODE",
    "CONTROL",
    "HEARTBEAT",
    "KINDS",
    "MESSAGES",
    "WEIGHTS",
    "WireLayout",
    "decode",
    "encode",
    "first_line",
    "header",
    "put_beat",
    "put_header",
]

KINDS: list[Command | Reply] = [*Command, *Reply]
CODE = {kind: i for i, kind in enumerate(KINDS)}
CONTROL = 4096  # payload bytes a receiver always has room for
HEARTBEAT = len(KINDS)  # the code of a heartbeat: a header alone, no protocol message
# point-to-point tags. Rank 0's heartbeats travel apart: a gloo send completes only into a
# receive the peer has posted, and a beat must never take the one a stopped peer left for the
# next message. A collector rank's answer to one goes with its messages (``rank_liveness.py``),
# into the receive rank 0 always has posted for the next one.
MESSAGES, WEIGHTS, BEATS = 0, 1, 2
HELLO = 3  # rank 0's first message to each rank over gloo (``backends._connect_pairs_in_use``)


@dataclass(frozen=True)
class WireLayout:
    """``LAYOUT`` as it travels: the batch layout instead of the batch."""

    batch: FlatLayout
    host: str
    pid: int
    weights_nbytes: int
    frames: int = 0  # ``Layout.frames``


def put_header(
    buf: torch.Tensor, kind: Command | Reply, length: int, value: int, broadcasts: int, inline: int
) -> None:
    """Write a message's header at the front of wire buffer ``buf``."""
    buf[:40].view(torch.int64).copy_(
        torch.tensor([CODE[kind], length, int(value), broadcasts, inline], dtype=torch.int64)
    )


def put_beat(buf: torch.Tensor) -> None:
    """Write a heartbeat's header at the front of wire buffer ``buf``."""
    buf[:40].view(torch.int64).copy_(torch.tensor([HEARTBEAT, 0, 0, 0, 0], dtype=torch.int64))


def header(buf: torch.Tensor) -> Any:
    """The header of wire buffer ``buf`` as five int64s, read or written in place (on CPU a
    memoryview, whose items are plain ints: a batch's header costs no tensor operation)."""
    head = buf[:40].view(torch.int64)
    return memoryview(head.numpy()) if head.device.type == "cpu" else head


def encode(kind: Command | Reply, payload: Any) -> tuple[int, bytes]:
    """The header's int value and the pickled payload (empty for None, ints and bools)."""
    if payload is None:
        return 0, b""
    if isinstance(payload, int) and kind.payload in (int, bool):
        return int(payload), b""
    return 0, pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)


def decode(kind: Command | Reply, value: int, blob: bytes) -> Any:
    """The payload ``encode`` made, checked against ``kind`` (a ``WireLayout`` as it is)."""
    if kind.payload is bool:
        return bool(value)
    if kind.payload is int:
        return value
    if not blob:
        return None
    payload = pickle.loads(blob)
    return payload if isinstance(payload, WireLayout) else message(kind, payload)[1]


def first_line(err: BaseException) -> str:
    """The first line of an error's text, for a one-line reason."""
    text = str(err).strip().splitlines()
    return text[0][:200] if text else type(err).__name__
