"""Policy weights from rank 0 to collector ranks: one flat buffer, laid out once, filled from the
trainer's policy, sent with one broadcast to every rank (or point to point to some)."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from hpccollect._compat import foreach_copy_
from hpccollect.collectors.weights import RemoteWeightsUpdaterBase
from hpccollect.collectors.workers.pool import WorkerPool
from hpccollect.errors import ArgumentValueError, WorkerError
from hpccollect.policy import copy_weights_
from hpccollect.protocol import Reply
from hpccollect.transport.base import wait_request
from hpccollect.transport.batches import FlatLayout

__all__ = ["DistributedWeightUpdater", "RPCWeightUpdater", "RankWeightsSender"]


class RankWeightsSender(RemoteWeightsUpdaterBase):
    """Default remote updater of ``DistributedDataCollector``.

    The trainer policy's parameters are moved into the flat buffer (``_alias``), so sending its
    own weights copies nothing; a TensorDict ``source`` (``DistributedWeightUpdater``'s
    ``policy_weights``) is copied into it at each update.

    Every rank still collecting gets one broadcast (not acknowledged); some ranks, or all once one
    is lost, get point-to-point sends (acknowledgements taken as they come). Calls
    ``delivered(ids)`` and returns once sent: a rank loads every update it was sent, in order,
    before its next batch (broadcasts that arrive while one is queued fold into it), and one that
    fails to load raises at the next wait on it.
    """

    def __init__(
        self,
        pool: WorkerPool,
        source: nn.Module | TensorDictBase | None,
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
            weights = self._get_server_weights()
            self.layout = FlatLayout.of(weights.data, "policy weight")
            self.flat, self.views = self.layout.allocate(device)
            self.dst = self.layout.leaves(self.views)
            if isinstance(source, nn.Module):
                _alias(self.layout.leaves(weights), self.dst)

    def _get_server_weights(self) -> TensorDictBase | None:
        if self.source is None or isinstance(self.source, TensorDictBase):
            return self.source
        return TensorDict.from_module(self.source)

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
        channels = self.pool.channels
        ids = sorted(set(worker_ids) & set(self.active()))  # a lost rank was already reported
        for i in ids:
            theirs = channels[i].peer_weights_nbytes
            if theirs != self.flat.numel():
                raise ArgumentValueError(
                    f"the policy on {channels[i].describe()} has {theirs} bytes of "
                    f"parameters, this one {self.flat.numel()}: give every rank the same policy "
                    "architecture as the trainer's."
                )
        self._fill(server_weights)
        if ids == list(range(len(self.pool))):  # the broadcast group holds every rank
            self._broadcast(ids)
        else:  # some ranks, or once one is lost: point to point
            works = []
            for i in ids:
                try:
                    works.append(channels[i].post_weights(self.flat))
                except ConnectionError as err:
                    raise self.pool.death_error(i) from err
                self.pool.defer(i, Reply.ACK)
            for i, work in zip(ids, works, strict=True):
                try:
                    channels[i].wait_sent(work)
                except ConnectionError as err:
                    raise self.pool.death_error(i) from err
        self.delivered(ids)

    def _broadcast(self, ids: list[int]) -> None:
        """Broadcast the flat buffer, announced on each rank's link (its reading thread joins it
        at once, into a buffer of its own), waited for within ``timeout``; a failure names the
        rank that went silent or ended, its likely cause."""
        channels = self.pool.channels
        for i in ids:
            try:
                channels[i].announce_broadcast(self.flat.numel())
            except ConnectionError as err:
                raise self.pool.death_error(i) from err
        try:
            work = self.groups.broadcast.broadcast(self.flat, 0)
            # a stopped rank holds the broadcast: asking between tests whether one went silent
            # names it within its liveness_timeout, not after worker_timeout
            silent = partial(self.pool._check_silence, ids)  # raises the rank's WorkerError
            wait_request(work.is_completed, self.timeout, "the weight broadcast", silent)
            work.wait(datetime.timedelta(seconds=self.timeout))  # what went wrong, if anything did
        except WorkerError:
            raise
        except Exception as err:
            for i in ids:
                if channels[i].silence() is not None:
                    raise self.pool.death_error(i) from err
            for i in ids:
                if channels[i].life.death(wait=1.0) is not None:
                    raise self.pool.death_error(i) from err
            raise WorkerError(
                f"the weight broadcast to the collector ranks failed ({err}).",
                worker=ids[0],
                host=channels[ids[0]].host,
                rank=channels[ids[0]].rank,
            ) from err

    def _fill(self, weights: TensorDictBase) -> None:
        """Copy ``weights`` into the flat buffer: one fused copy when laid out as the trainer's
        policy, else the key-matching copy (which names what does not match)."""
        try:
            leaves = self.layout.leaves(weights)
        except KeyError:
            leaves = None
        if leaves is not None and all(
            s is not None and s.shape == d.shape and s.dtype == d.dtype
            for s, d in zip(leaves, self.dst, strict=True)
        ):
            if any(s.data_ptr() != d.data_ptr() for s, d in zip(leaves, self.dst, strict=True)):
                foreach_copy_(self.dst, leaves)
        else:
            copy_weights_(self.views, weights)


class DistributedWeightUpdater(RemoteWeightsUpdaterBase):
    """TorchRL's remote updater of ``DistributedDataCollector``, with TorchRL's constructor.

    Pass it as ``weight_updater=`` to send a TensorDict of weights that is not the trainer
    policy's own; it hands them to the ``RankWeightsSender`` it builds when it registers.

    Args:
        store: TorchRL's ``TCPStore`` announcing updates; kept, unneeded (each rank's link does).
        policy_weights: the weights ``update_policy_weights_()`` sends when given none.
        num_workers: the collector's number of ranks (None: any), checked at registration.
        sync: whether the collector is sync; kept as given.
    """

    def __init__(
        self,
        store: Any = None,
        policy_weights: TensorDictBase | None = None,
        num_workers: int | None = None,
        sync: bool | None = None,
    ) -> None:
        if policy_weights is not None and not isinstance(policy_weights, TensorDictBase):
            raise ArgumentValueError(
                "DistributedWeightUpdater: policy_weights must be a TensorDict of weights "
                f"(TensorDict.from_module(policy)), got {type(policy_weights).__name__}."
            )
        self.store, self.policy_weights = store, policy_weights
        self.num_workers, self.sync = num_workers, sync
        self._sender: RankWeightsSender | None = None

    def register_collector(self, collector: Any) -> None:
        sender = getattr(collector, "_weights_sender", None)
        if not callable(sender) or not hasattr(collector, "_groups"):
            raise ArgumentValueError(
                f"DistributedWeightUpdater sends weights to collector ranks; "
                f"{type(collector).__name__} has none: pass it to a DistributedDataCollector."
            )
        if self.num_workers is not None and self.num_workers != collector.num_workers:
            raise ArgumentValueError(
                f"DistributedWeightUpdater: num_workers={self.num_workers}, but the collector "
                f"has {collector.num_workers} ranks; give it the collector's, or None."
            )
        super().register_collector(collector)
        self._sender = sender(self.policy_weights)

    def _bound(self) -> RankWeightsSender:
        if self._sender is None:
            raise ArgumentValueError(
                "DistributedWeightUpdater is not registered with a collector yet: pass it to "
                "DistributedDataCollector(weight_updater=...)."
            )
        return self._sender

    def _get_server_weights(self) -> TensorDictBase | None:
        return self.policy_weights

    def _maybe_map_weights(self, server_weights: TensorDictBase) -> TensorDictBase:
        return server_weights

    def all_worker_ids(self) -> Sequence[int]:
        return self._bound().all_worker_ids()

    def _sync_weights_with_worker(self, worker_id: int, server_weights: TensorDictBase) -> None:
        self._bound()._sync_weights_with_workers([worker_id], server_weights)

    def _sync_weights_with_workers(
        self, worker_ids: Sequence[int], server_weights: TensorDictBase
    ) -> None:
        self._bound()._sync_weights_with_workers(worker_ids, server_weights)


class RPCWeightUpdater(DistributedWeightUpdater):
    """TorchRL's remote updater of ``RPCCollector``: ``DistributedWeightUpdater``'s, with
    TorchRL's constructor.

    Args:
        collector_infos: TorchRL's RPC worker infos; kept as given (ranks are reached by link).
        collector_class: the ranks' collector class; kept as given.
        collector_rrefs: TorchRL's remote references to the ranks' collectors; kept as given.
        policy_weights: the weights ``update_policy_weights_()`` sends when given none.
        num_workers: the collector's number of ranks (None: any), checked at registration.
    """

    def __init__(
        self,
        collector_infos: Any = None,
        collector_class: Any = None,
        collector_rrefs: Any = None,
        policy_weights: TensorDictBase | None = None,
        num_workers: int | None = None,
    ) -> None:
        super().__init__(None, policy_weights, num_workers)
        self.collector_infos, self.collector_class = collector_infos, collector_class
        self.collector_rrefs = collector_rrefs


def _alias(params: Sequence[torch.Tensor], views: Sequence[torch.Tensor]) -> None:
    """Move the trainer policy's parameters into the flat buffer (same ``Parameter`` objects, so
    optimizers keep working); one on another device, or moved or replaced later, is copied."""
    with torch.no_grad():
        for param, view in zip(params, views, strict=True):
            if param.device == view.device and param.shape == view.shape:
                view.copy_(param)
                param.data = view
