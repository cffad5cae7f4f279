"""Weight updaters: how trained policy weights reach the policy a collector runs.

``LocalWeightsUpdaterBase`` is the download side (fetch weights from a server, or take the ones
given, and load them into the local policy); ``RemoteWeightsUpdaterBase`` the upload side (push
weights to workers). ``update_policy_weights_`` runs the local updater first, then the remote one.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from hpccollect.errors import ArgumentValueError
from hpccollect.policy import load_weights_, to_weights

__all__ = [
    "LocalWeightsUpdaterBase",
    "PolicyWeightsCopier",
    "RemoteWeightsUpdaterBase",
    "WeightUpdaterBase",
]


class WeightUpdaterBase(abc.ABC):  # noqa: B024 - the abstract hooks are in the subclasses
    """Common base: knows its collector, can be initialised with ``collector.init_updater()``."""

    _collector: Any = None

    def register_collector(self, collector: Any) -> None:
        """Called by the collector that owns this updater."""
        self._collector = collector

    @property
    def collector(self) -> Any:
        return self._collector

    def init(self, *args: Any, **kwargs: Any) -> None:  # noqa: B027 - optional hook
        """Optional set-up with user arguments (``collector.init_updater(*args, **kwargs)``)."""

    def __call__(
        self, policy_or_weights: Any = None, *, worker_ids: Any = None, **kwargs: Any
    ) -> None:
        """Move weights: TorchRL's flow over its hooks (``push_weights``); the local and
        remote bases below have their own."""
        self.push_weights(policy_or_weights, worker_ids)

    def push_weights(self, weights: Any = None, worker_ids: Any = None) -> None:
        """The given weights (or ``_get_server_weights()``), mapped by ``_maybe_map_weights``,
        to each of ``worker_ids`` (default ``all_worker_ids()``) by ``_sync_weights_with_worker``:
        the hooks a TorchRL ``WeightUpdaterBase`` subclass implements."""
        if weights is None:
            weights = self._get_server_weights()
        weights = self._maybe_map_weights(weights)
        if worker_ids is None:
            ids = list(self.all_worker_ids() or [])
        elif isinstance(worker_ids, Sequence) and not isinstance(worker_ids, str):
            ids = list(worker_ids)
        else:
            ids = [worker_ids]
        for worker_id in ids:
            self._sync_weights_with_worker(worker_id=worker_id, server_weights=weights)

    def _get_server_weights(self) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__}: implement _get_server_weights() (where the trained weights "
            "are) or __call__, or pass the weights to update_policy_weights_."
        )

    def _maybe_map_weights(self, server_weights: Any) -> Any:
        return server_weights

    def all_worker_ids(self) -> Sequence[Any]:
        return []

    def _sync_weights_with_worker(self, *, worker_id: Any, server_weights: Any) -> None:
        raise NotImplementedError(
            f"{type(self).__name__}: implement _sync_weights_with_worker(worker_id=..., "
            "server_weights=...) (how weights reach one worker), or __call__."
        )


class LocalWeightsUpdaterBase(WeightUpdaterBase):
    """Download side: server (or given) weights -> mapped -> loaded into the local policy."""

    @abc.abstractmethod
    def _get_server_weights(self) -> TensorDictBase | None:
        """The latest weights from wherever they are kept; None if there is nothing to fetch."""

    @abc.abstractmethod
    def _get_local_weights(self) -> TensorDictBase | None:
        """The weights of the policy the collector runs."""

    @abc.abstractmethod
    def _maybe_map_weights(self, server_weights: TensorDictBase) -> TensorDictBase:
        """Turn server weights into the local layout (devices, names)."""

    @abc.abstractmethod
    def _update_local_weights(
        self, local_weights: TensorDictBase | None, mapped_weights: TensorDictBase
    ) -> None:
        """Load ``mapped_weights`` into the local policy."""

    def __call__(
        self, policy_or_weights: Any = None, *, worker_ids: Any = None, **kwargs: Any
    ) -> None:
        server = (
            self._get_server_weights()
            if policy_or_weights is None
            else to_weights(policy_or_weights)
        )
        if server is None:
            return
        with torch.no_grad():
            self._update_local_weights(self._get_local_weights(), self._maybe_map_weights(server))


class RemoteWeightsUpdaterBase(WeightUpdaterBase):
    """Upload side: the server's weights -> mapped -> sent to each named worker."""

    @abc.abstractmethod
    def _sync_weights_with_worker(self, worker_id: Any, server_weights: TensorDictBase) -> None:
        """Deliver ``server_weights`` to one worker."""

    @abc.abstractmethod
    def _get_server_weights(self) -> TensorDictBase | None:
        """The weights to send when none are given; None when there is nothing to send."""

    @abc.abstractmethod
    def _maybe_map_weights(self, server_weights: TensorDictBase) -> TensorDictBase:
        """Turn server weights into what workers expect."""

    @abc.abstractmethod
    def all_worker_ids(self) -> Sequence[Any]:
        """Every worker id, used when ``worker_ids`` is None."""

    def __call__(
        self, policy_or_weights: Any = None, *, worker_ids: Any = None, **kwargs: Any
    ) -> None:
        weights = (
            self._get_server_weights()
            if policy_or_weights is None
            else to_weights(policy_or_weights)
        )
        if weights is None:
            return  # nothing to send (a policy without parameters)
        mapped = self._maybe_map_weights(weights)
        if worker_ids is None:
            ids: Sequence[Any] = list(self.all_worker_ids())
        elif isinstance(worker_ids, (list, tuple)):
            ids = list(worker_ids)
        else:
            ids = [worker_ids]
        with torch.no_grad():
            self._sync_weights_with_workers(ids, mapped)

    def _sync_weights_with_workers(
        self, worker_ids: Sequence[Any], server_weights: TensorDictBase
    ) -> None:
        """Deliver ``server_weights`` to every worker of ``worker_ids`` (one after another unless
        a transport can reach them at once)."""
        for worker_id in worker_ids:
            self._sync_weights_with_worker(worker_id, server_weights)


class PolicyWeightsCopier(LocalWeightsUpdaterBase):
    """Default local updater of ``SyncDataCollector``.

    With no weights given it copies the user's policy into the collector's copy (made only when
    ``policy_device`` differs from where the policy lives); given weights, it loads them.
    """

    def __init__(self, target: nn.Module | None, source: nn.Module | None = None) -> None:
        self.target = target
        self.source = source

    def _get_server_weights(self) -> TensorDictBase | None:
        if self.source is None or self.source is self.target:
            return None  # the collector runs the user's own module: nothing to copy
        return TensorDict.from_module(self.source)

    def _get_local_weights(self) -> TensorDictBase | None:
        return None if self.target is None else TensorDict.from_module(self.target)

    def _maybe_map_weights(self, server_weights: TensorDictBase) -> TensorDictBase:
        return server_weights

    def _update_local_weights(
        self, local_weights: TensorDictBase | None, mapped_weights: TensorDictBase
    ) -> None:
        if self.target is None or local_weights is None or local_weights.is_empty():
            raise ArgumentValueError(
                "update_policy_weights_ was given weights, but the collector's policy has no "
                "parameters (a random policy or a plain function)."
            )
        load_weights_(self.target, mapped_weights)
