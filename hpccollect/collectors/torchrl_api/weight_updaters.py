"""TorchRL's ready-made weight updaters, under TorchRL's names and constructors.

Each is a ``WeightUpdaterBase`` driven by its hooks (``push_weights``), so it does here what it
does in TorchRL. hpccollect's collectors build their own updaters (``PolicyWeightsCopier``,
``SharedWeightsSender``, ``RankWeightsSender``); these are for code that names TorchRL's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from hpccollect.collectors.weights import WeightUpdaterBase
from hpccollect.errors import ArgumentTypeError, ArgumentValueError, PolicyError
from hpccollect.policy import copy_weights_

__all__ = ["MultiProcessedWeightUpdater", "RemoteModuleWeightUpdater", "VanillaWeightUpdater"]


class VanillaWeightUpdater(WeightUpdaterBase):
    """Loads weights, in place, into one TensorDict of policy weights.

    TorchRL's default updater of a single-process collector. With no weights given, the ones
    ``weight_getter()`` returns are loaded; with neither, nothing happens.

    Args:
        weight_getter: returns the weights to load when ``update_policy_weights_()`` is given
            none; None if weights are always given.
        policy_weights: the weights written in place, usually ``TensorDict.from_module(policy)``
            (``from_policy`` builds that).

    Example:
        >>> policy = torch.nn.Linear(4, 2)
        >>> updater = VanillaWeightUpdater.from_policy(policy)
        >>> updater.push_weights(torch.nn.Linear(4, 2).state_dict())
    """

    def __init__(
        self,
        *,
        weight_getter: Callable[[], Any] | None = None,
        policy_weights: TensorDictBase,
    ) -> None:
        if not isinstance(policy_weights, TensorDictBase):
            raise ArgumentTypeError(
                "VanillaWeightUpdater: policy_weights must be a TensorDict of the policy's "
                f"weights (TensorDict.from_module(policy)), got {type(policy_weights).__name__}."
            )
        self.weight_getter = weight_getter
        self.policy_weights = policy_weights

    @classmethod
    def from_policy(cls, policy: Any) -> VanillaWeightUpdater:
        """An updater that writes ``policy``'s own parameters and buffers.

        Args:
            policy: an ``nn.Module`` with parameters.

        Returns:
            The updater.

        Raises:
            ArgumentValueError: the policy has no parameters to write.
        """
        weights = TensorDict.from_module(policy) if isinstance(policy, nn.Module) else None
        if weights is None or weights.is_empty():
            raise ArgumentValueError(
                "VanillaWeightUpdater: the collector's policy has no parameters to update (a "
                "random policy or a plain function); leave weight_updater unset."
            )
        return cls(policy_weights=weights.lock_())

    def _get_server_weights(self) -> Any:
        return None if self.weight_getter is None else self.weight_getter()

    def _get_local_weights(self) -> TensorDictBase:
        return self.policy_weights

    def _sync_weights_with_worker(self, *, worker_id: Any = None, server_weights: Any) -> None:
        if server_weights is not None:
            with torch.no_grad():
                copy_weights_(self.policy_weights, server_weights)


class MultiProcessedWeightUpdater(WeightUpdaterBase):
    """Writes weights into one TensorDict per worker or device, each read by the workers there.

    TorchRL's default updater of a multi-process collector, whose workers read shared-memory
    copies of the weights, one per policy device.

    Args:
        get_server_weights: returns the weights to send when none are given; None if weights
            are always given.
        policy_weights: the weights each worker id reads (a device or a worker index ->
            TensorDict), written in place; ``worker_ids`` name its keys.
    """

    def __init__(
        self,
        *,
        get_server_weights: Callable[[], Any] | None,
        policy_weights: dict[Any, TensorDictBase],
    ) -> None:
        if not isinstance(policy_weights, dict):
            raise ArgumentTypeError(
                "MultiProcessedWeightUpdater: policy_weights must be a dict of worker id (a "
                f"device or an index) -> TensorDict, got {type(policy_weights).__name__}."
            )
        self.weights_getter = get_server_weights
        self._policy_weights = policy_weights

    def all_worker_ids(self) -> list[Any]:
        return list(self._policy_weights)

    def _get_server_weights(self) -> Any:
        weights = None if self.weights_getter is None else self.weights_getter()
        return weights.data if isinstance(weights, TensorDictBase) else weights

    def _sync_weights_with_worker(self, *, worker_id: Any = None, server_weights: Any) -> None:
        if server_weights is None:
            return
        if worker_id not in self._policy_weights:
            known = ", ".join(map(str, self._policy_weights))
            raise ArgumentValueError(
                f"worker_ids: {worker_id!r} has no weights in this updater; use one of {known}."
            )
        with torch.no_grad():
            copy_weights_(self._policy_weights[worker_id].data, server_weights)


class RemoteModuleWeightUpdater(WeightUpdaterBase):
    """For policies the collector cannot reach (built by a ``policy_factory`` elsewhere):
    weights must be given to every update, which checks that they are and moves nothing.

    Raises:
        PolicyError: from ``update_policy_weights_()`` called without weights (a
            ``RuntimeError``, as TorchRL raises).
    """

    def _get_server_weights(self) -> None:
        return None

    def all_worker_ids(self) -> Sequence[Any] | None:
        return None

    def _sync_weights_with_worker(self, *, worker_id: Any = None, server_weights: Any) -> None:
        if server_weights is None:
            raise PolicyError(
                "RemoteModuleWeightUpdater takes weights only as given: call "
                "update_policy_weights_(weights) with the weights to send."
            )
