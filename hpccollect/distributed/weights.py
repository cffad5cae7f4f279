"""Policy weights from rank 0 to collector ranks: one flat buffer, laid out once, filled from the
trainer's policy and sent with one broadcast to every rank (or point to point to some)."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
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

    The trainer policy's parameters are moved into the flat buffer (see ``_alias``), so
    sending its own weights copies nothing. ``source`` may also be a TensorDict of weights
    (``DistributedWeightUpdater``'s ``policy_weights``), copied into the buffer at each update.

    Sending to every rank still collecting is one broadcast, announced on each rank's link
    (the rank's reading thread joins it at once, into a buffer of its own); to some ranks, or once a rank is lost,
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
            for i in ids:  # each rank's link announces it: its reading thread joins it
                try:
                    self.pool.channels[i].announce_broadcast(self.flat.numel())
                except ConnectionError as err:
                    raise self.pool.death_error(i) from err
            try:
                self._see_through(self.groups.broadcast.broadcast(self.flat, 0), ids)
            except WorkerError:
                raise
            except Exception as err:
                channels = self.pool.channels
                for i in ids:  # a rank that went silent or ended is the likely cause: name it
                    if channels[i].silence() is not None:
                        raise self.pool.death_error(i) from err
                for i in ids:
                    if channels[i].life.death(wait=1.0) is not None:
                        raise self.pool.death_error(i) from err
                raise WorkerError(
                    f"the weight broadcast to the collector ranks failed ({err}).",
                    worker=ids[0],
                    host=self.pool.channels[ids[0]].host,
                    rank=self.pool.channels[ids[0]].rank,
                ) from err
        for i, work in zip([] if broadcast else ids, works, strict=True):
            try:
                self.pool.channels[i].wait_sent(work)
            except ConnectionError as err:
                raise self.pool.death_error(i) from err
        self.delivered(ids)

    def _see_through(self, work: Any, ids: list[int]) -> None:
        """Wait for the weight broadcast ``work``, bounded by ``timeout``, asking between its
        tests whether a rank went silent: a stopped rank holds a broadcast, and is named within
        its ``liveness_timeout``, not after ``worker_timeout``."""

        def silent() -> None:
            self.pool._check_silence(ids)  # raises the silent rank's WorkerError

        wait_request(work.is_completed, self.timeout, "the weight broadcast", silent)
        work.wait(datetime.timedelta(seconds=self.timeout))  # what went wrong, if anything did

    def _fill(self, weights: TensorDictBase) -> None:
        """Copy ``weights`` into the flat buffer: one fused copy when they are laid out as the
        trainer's policy (the usual case), the general key-matching copy otherwise (which names
        what does not match)."""
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
    """TorchRL's remote updater of ``DistributedDataCollector``, with its constructor: sends
    ``policy_weights`` (or the weights given) to the collector ranks.

    Pass it as ``weight_updater=`` to send a TensorDict of weights that is not the trainer
    policy's own; the collector's transport carries them as it carries its default updater's
    (``RankWeightsSender``), which it builds when this one registers.

    Args:
        store: TorchRL's ``TCPStore``, through which its ranks hear of an update. hpccollect's
            ranks hear of it on their own link, so none is needed; whatever is given is kept.
        policy_weights: the weights sent by ``update_policy_weights_()`` with none given.
        num_workers: the collector's number of ranks; checked when the collector registers
            this updater. None: any.
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
    """TorchRL's remote updater of ``RPCCollector``, with its constructor: sends
    ``policy_weights`` (or the weights given) to the collector ranks, as
    ``DistributedWeightUpdater`` does.

    Args:
        collector_infos: TorchRL's RPC worker infos; kept as given (hpccollect's ranks are
            reached over the collector's own links).
        collector_class: the ranks' collector class; kept as given.
        collector_rrefs: TorchRL's remote references to the ranks' collectors; kept as given.
        policy_weights: the weights sent by ``update_policy_weights_()`` with none given.
        num_workers: the collector's number of ranks; checked when the collector registers
            this updater. None: any.
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
    """Let the trainer policy's parameters live in the flat buffer (same ``Parameter`` objects,
    so optimizers keep working): an update then sends them as they are, with no copy. A
    parameter on another device, or moved or replaced later, is copied at each update instead."""
    with torch.no_grad():
        for param, view in zip(params, views, strict=True):
            if param.device == view.device and param.shape == view.shape:
                view.copy_(param)
                param.data = view
