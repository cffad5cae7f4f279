"""``RankWeights``: how policy weights cross a rank link (``RankChannel``'s weights half).

Rank 0 sends weights to one rank point to point (``post_weights``), or to every rank in one
broadcast. A collector rank whose policy has weights runs a thread that waits in that broadcast
at all times, so the weights flow the moment rank 0 sends them; it queues one
``UPDATE_WEIGHTS`` for the collector's loop, which loads the newest weights when it takes it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from hpccollect.protocol import Command
from hpccollect.transport.batches import FlatLayout
from hpccollect.transport.wire import WEIGHTS

__all__ = ["BROADCAST_UPDATE", "RankWeights"]

#: the message a collector rank's broadcast thread queues (its acknowledgement is not sent)
BROADCAST_UPDATE = (Command.UPDATE_WEIGHTS, None)


class RankWeights:
    """The weight methods of ``RankChannel``; what they use of the channel is declared."""

    peer: int
    device: torch.device
    groups: Any
    broadcasts: int
    _weights: torch.Tensor | None
    _weights_arrived: threading.Condition
    _broadcast_queued: bool
    _broadcasts_in: int
    _broadcaster: threading.Thread | None

    _group: Callable[[], Any]
    _hand_over: Callable[..., None]
    _send_blob: Callable[[Any, int, bytes], None]
    _post: Callable[[torch.Tensor, int], Any]
    _await_rest: Callable[..., None]

    def post_weights(self, flat: torch.Tensor) -> Any:
        """Send ``UPDATE_WEIGHTS`` with the weights following point to point (the returned
        work to wait for)."""
        self._send_blob(Command.UPDATE_WEIGHTS, 0, b"")
        return self._post(flat, WEIGHTS)

    def broadcast_sent(self) -> None:
        """Note that a weight broadcast was sent to the peer's broadcast thread: every later
        message carries the count, and the peer hands it over only after that update."""
        self.broadcasts += 1

    def _receive_weights(self) -> None:
        if self._weights is None:
            raise RuntimeError("weights arrived for a policy without parameters")
        self._await_rest(self._weights, WEIGHTS)

    def _broadcast_loop(self) -> None:
        """A collector rank's thread that waits in the weight broadcast at all times, so the
        weights flow the moment rank 0 sends them, then hands ``UPDATE_WEIGHTS`` over."""
        while True:
            try:
                self.groups.broadcast.broadcast(self._weights, 0).wait()
            except Exception:  # the groups were closed: the job is over
                return
            with self._weights_arrived:
                # one queued update loads the newest weights: never queue a second
                if not self._broadcast_queued:
                    self._broadcast_queued = True
                    self._hand_over(BROADCAST_UPDATE)
                self._broadcasts_in += 1
                self._weights_arrived.notify_all()

    def weights_buffer(self, policy: Any) -> TensorDictBase | None:
        """The buffer ``UPDATE_WEIGHTS`` loads on a collector rank: views into one flat buffer
        that the weights arrive in (laid out as ``DistributedDataCollector`` lays out its own)."""
        if not isinstance(policy, nn.Module):
            return None
        weights = TensorDict.from_module(policy).data
        if weights.is_empty():
            return None
        layout = FlatLayout.of(weights, "policy weight")
        self._weights, views = layout.allocate(self.device)
        self._weights_thread_starts()
        self._broadcaster = threading.Thread(
            target=self._broadcast_loop, name=f"hpccollect-rank{self.peer}-weights", daemon=True
        )
        self._broadcaster.start()
        return views

    def _weights_thread_starts(self) -> None:
        """Called as the broadcast thread starts (a subclass paces it, or gives it a bell)."""

    def _waiting(self) -> contextlib.AbstractContextManager:
        """The context of this end waiting for the peer rather than working (a subclass paces
        its broadcast thread by it)."""
        return contextlib.nullcontext()
