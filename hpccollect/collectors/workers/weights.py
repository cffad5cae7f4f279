"""Policy weights for local worker processes: one shared-memory buffer per worker."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from hpccollect.collectors.weights import RemoteWeightsUpdaterBase
from hpccollect.collectors.workers.pool import WorkerPool
from hpccollect.collectors.workers.setup import runs_on_cpu, weight_buffers
from hpccollect.errors import ArgumentTypeError, ArgumentValueError
from hpccollect.policy import copy_weights_
from hpccollect.protocol import Command

__all__ = ["SharedWeightsSender", "WorkerWeights", "per_worker_weights", "worker_indices"]


class SharedWeightsSender(RemoteWeightsUpdaterBase):
    """Default remote updater: one shared-memory weights buffer per worker.

    Sending to worker ``i`` writes its buffer, then asks it to load the buffer before its next
    batch and waits for the acknowledgement (so the buffer is never written while read).
    """

    def __init__(self, pool: WorkerPool, buffers: list, source: nn.Module | None, timeout: float):
        self.pool, self.buffers, self.source, self.timeout = pool, buffers, source, timeout

    def _get_server_weights(self) -> TensorDictBase | None:
        return None if self.source is None else TensorDict.from_module(self.source)

    def _maybe_map_weights(self, server_weights: TensorDictBase) -> TensorDictBase:
        return server_weights

    def all_worker_ids(self) -> Sequence[int]:
        return range(len(self.pool))

    def _sync_weights_with_worker(self, worker_id: int, server_weights: TensorDictBase) -> None:
        if self.buffers[worker_id] is None:
            raise ArgumentValueError("the workers' policy has no parameters to update.")
        copy_weights_(self.buffers[worker_id], server_weights)
        self.pool.request(worker_id, Command.UPDATE_WEIGHTS, None, self.timeout)


def per_worker_weights(weights: Any) -> bool:
    """Whether ``weights`` are TorchRL's per-worker form, ``{worker_index: weights}``."""
    return (
        isinstance(weights, dict)
        and bool(weights)
        and all(isinstance(k, int) and not isinstance(k, bool) for k in weights)
    )


def worker_indices(
    worker_ids: Any, policy_devices: Sequence[torch.device | None]
) -> list[int] | None:
    """``update_policy_weights_``'s ``worker_ids`` as worker indices: an index, a device (the
    workers whose policy runs there), or a list of either; None (every worker) stays None."""
    if worker_ids is None:
        return None
    n = len(policy_devices)
    ids = worker_ids if isinstance(worker_ids, (list, tuple)) else [worker_ids]
    out: list[int] = []
    for wid in ids:
        if isinstance(wid, (str, torch.device)):
            device = torch.device(wid)
            out += [i for i, d in enumerate(policy_devices) if _same_device(device, d)]
        elif isinstance(wid, int) and 0 <= wid < n:
            out.append(wid)
        else:
            raise ArgumentValueError(
                f"worker_ids: {wid!r} is not a worker index in [0, {n}) or a device."
            )
    return out


def _same_device(wanted: torch.device, policy_device: torch.device | None) -> bool:
    actual = policy_device or torch.device("cpu")
    return actual.type == wanted.type and (wanted.index is None or actual.index == wanted.index)


class WorkerWeights:
    """Policy weights of ``MultiCollectorBase``'s workers: the buffers they load, the default
    sender, and TorchRL's ``update_policy_weights_`` (per worker, by device, by index); what
    it uses of the collector is declared."""

    num_workers: int
    worker_timeout: float
    policy: Any
    _pool: WorkerPool | None
    _factories: list | None
    _sends_weights: bool
    _env_by_inheritance: bool
    _live_weights: bool
    _weights: list[TensorDictBase | None]
    _policy_devices: list[Any]
    _closed: bool

    def _shares_live_weights(self, module: nn.Module | None) -> bool:
        """Whether the workers run on ``module``'s own weights (see ``weight_buffers``)."""
        return (
            module is not None
            and self._factories is None
            and self._sends_weights
            and self._env_by_inheritance  # local processes
            and runs_on_cpu(module, self._policy_devices)
        )

    def _weight_buffers(self, module: nn.Module | None) -> list[TensorDictBase | None]:
        """One buffer per worker that ``UPDATE_WEIGHTS`` loads (shared memory here)."""
        return weight_buffers(module, self.num_workers, self._live_weights)

    def _weights_for_workers(self) -> TensorDictBase | None:
        """A shared-memory buffer laid out as the workers' policy weights (None without any),
        for the process that sends this collector weights (it runs in a worker itself)."""
        first = next((w for w in self._weights if w is not None), None)
        return None if first is None else first.data.clone().share_memory_()

    def _weights_sender(self, module: nn.Module | None) -> RemoteWeightsUpdaterBase:
        """The default remote weight updater: the policy's weights into each worker's buffer."""
        return SharedWeightsSender(self._pool, self._weights, module, self.worker_timeout)

    def update_policy_weights_(
        self, policy_or_weights: Any = None, *, worker_ids: Any = None, **kwargs: Any
    ) -> None:
        """Send weights to the named workers (all by default) before their next batch.

        ``worker_ids``: an index, a list of indices, or devices (the workers whose policy runs
        on that device). ``{index: weights}`` gives each named worker its own weights (TorchRL's
        per-worker weights). Blocks until every named worker has loaded the weights.

        Raises:
            RuntimeError: the collector was shut down: its workers are gone.
        """
        if self._closed:
            raise RuntimeError(
                f"{type(self).__name__} was shut down: its workers are gone, and no weights can "
                "reach them. Update the weights before shutdown(), or build a new collector."
            )
        if per_worker_weights(policy_or_weights):
            if worker_ids is not None:
                raise ArgumentTypeError(
                    "update_policy_weights_: weights keyed by worker name their workers; leave "
                    "worker_ids out."
                )
            if self._live_weights:
                raise ArgumentValueError(
                    "update_policy_weights_({index: weights}): the workers run on the policy's "
                    "own shared weights, one copy for all of them; give each its own policy "
                    "with policy_factory to send each its own weights."
                )
            for index, weights in policy_or_weights.items():
                self.update_policy_weights_(weights, worker_ids=[index], **kwargs)
            return
        if policy_or_weights is None and self.policy is None and self._factories and not kwargs:
            raise ArgumentValueError(
                "update_policy_weights_() has no weights to send: the workers built their policy "
                "with policy_factory. Pass the weights: update_policy_weights_(module or "
                "TensorDict.from_module(module))."
            )
        super().update_policy_weights_(
            policy_or_weights,
            worker_ids=worker_indices(worker_ids, self._policy_devices),
            **kwargs,
        )
