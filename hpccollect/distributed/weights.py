"""Policy weights from rank 0 to collector ranks: one flat buffer, laid out once, filled from the
trainer's policy and sent with one broadcast to every rank (or point to point to some)."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from hpccollect.collectors.pool import WorkerPool
from hpccollect.collectors.weights import RemoteWeightsUpdaterBase
from hpccollect.errors import ArgumentValueError, WorkerError
from hpccollect.policy import copy_weights_
from hpccollect.protocol import Reply
from hpccollect.transport.batches import FlatLayout

__all__ = ["RankWeightsSender"]


class RankWeightsSender(RemoteWeightsUpdaterBase):
    """Default remote updater of ``DistributedDataCollector``.

    The trainer policy's parameters are moved into the flat buffer (see ``_alias``), so
    sending its own weights copies nothing.

    Sending to every rank still collecting is one broadcast (each rank's receiving thread joins
    it at once, into a buffer of its own); to some ranks, or once a rank is lost,
    point-to-point sends. Returns when the weights are sent, without waiting for the ranks to
    load them: a rank loads every update it was sent before it starts the next batch (messages
    arrive in order), and an update that lands in its buffer while it still loads an earlier
    one is itself loaded next, before any batch (broadcasts that arrive while one is queued are
    folded into it: it loads the newest). Point-to-point acknowledgements are taken as they
    come, broadcast ones are not sent; a rank that fails to load raises at the next wait on it.
    ``delivered(ids)`` is called on return.
    """

    def __init__(
        self,
        pool: WorkerPool,
        source: nn.Module | None,
        groups: Any,
        device: Any,
        timeout: float,
        active: Callable[[], list[int]],
        delivered: Callable[[Sequence[int]], None],
    ) -> None:
        self.pool, self.source, self.groups, self.timeout = pool, source, groups, timeout
        self.active, self.delivered = active, delivered
        self.flat = self.views = None
        if source is not None:
            self.layout = FlatLayout.of(TensorDict.from_module(source).data, "policy weight")
            self.flat, self.views = self.layout.allocate(device)
            self.dst = self.layout.leaves(self.views)
            _alias(self.layout.leaves(TensorDict.from_module(source)), self.dst)

    def _get_server_weights(self) -> TensorDictBase | None:
        return None if self.source is None else TensorDict.from_module(self.source)

    def _maybe_map_weights(self, server_weights: TensorDictBase) -> TensorDictBase:
        return server_weights

    def all_worker_ids(self) -> Sequence[int]:
        return self.active()

    def _sync_weights_with_worker(self, worker_id: int, server_weights: TensorDictBase) -> None:
        self._sync_weights_with_workers([worker_id], server_weights)

    def _sync_weights_with_workers(
        self, worker_ids: Sequence[int], server_weights: TensorDictBase
    ) -> None:
        if self.flat is None:
            raise ArgumentValueError(
                "the collector ranks' policy has no parameters to update: pass a policy with "
                "parameters (an nn.Module), or do not call update_policy_weights_."
            )
        live = self.active()
        ids = sorted(set(worker_ids) & set(live))  # a lost rank was already reported
        for i in ids:
            theirs = self.pool.channels[i].peer_weights_nbytes
            if theirs != self.flat.numel():
                raise ArgumentValueError(
                    f"the policy on {self.pool.channels[i].describe()} has {theirs} bytes of "
                    f"parameters, this one {self.flat.numel()}: give every rank the same policy "
                    "architecture as the trainer's."
                )
        self._fill(server_weights)
        # the broadcast group holds every rank: once one is lost, point to point only
        broadcast = ids == list(range(len(self.pool)))
        works = []
        for i in [] if broadcast else ids:
            try:
                works.append(self.pool.channels[i].post_weights(self.flat))
            except ConnectionError as err:
                raise self.pool.death_error(i) from err
            self.pool.defer(i, Reply.ACK)
        if broadcast:
            try:
                self.groups.broadcast.broadcast(self.flat, 0).wait(
                    datetime.timedelta(seconds=self.timeout)
                )
            except Exception as err:
                for i in ids:  # a rank that ended is the likely cause: name it
                    if self.pool.channels[i].life.death(wait=1.0) is not None:
                        raise self.pool.death_error(i) from err
                raise WorkerError(
                    f"the weight broadcast to the collector ranks failed ({err}).",
                    worker=ids[0],
                    host=self.pool.channels[ids[0]].host,
                    rank=self.pool.channels[ids[0]].rank,
                ) from err
            for i in ids:
                self.pool.channels[i].broadcast_sent()
        for i, work in zip([] if broadcast else ids, works, strict=True):
            try:
                self.pool.channels[i].wait_sent(work)
            except ConnectionError as err:
                raise self.pool.death_error(i) from err
        self.delivered(ids)

    def _fill(self, weights: TensorDictBase) -> None:
        """Copy ``weights`` into the flat buffer: one fused copy when they are laid out as the
        trainer's policy (the usual case), the general key-matching copy otherwise."""
        try:
            leaves = self.layout.leaves(weights)
        except KeyError:
            leaves = None
        if leaves is not None and all(
            s.shape == d.shape and s.dtype == d.dtype for s, d in zip(leaves, self.dst, strict=True)
        ):
            if any(s.data_ptr() != d.data_ptr() for s, d in zip(leaves, self.dst, strict=True)):
                torch._foreach_copy_(self.dst, leaves)
        else:
            copy_weights_(self.views, weights)


def _alias(params: Sequence[torch.Tensor], views: Sequence[torch.Tensor]) -> None:
    """Let the trainer policy's parameters live in the flat buffer (same ``Parameter`` objects,
    so optimizers keep working): an update then sends them as they are, with no copy. A
    parameter on another device, or moved or replaced later, is copied at each update instead."""
    with torch.no_grad():
        for param, view in zip(params, views, strict=True):
            if param.device == view.device and param.shape == view.shape:
                view.copy_(param)
                param.data = view
