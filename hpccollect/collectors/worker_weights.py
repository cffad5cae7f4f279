"""Policy weights for local worker processes: one shared-memory buffer per worker."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from hpccollect.collectors.pool import WorkerPool
from hpccollect.collectors.weights import RemoteWeightsUpdaterBase
from hpccollect.errors import ArgumentValueError
from hpccollect.policy import copy_weights_
from hpccollect.protocol import Command

__all__ = ["SharedWeightsSender", "per_worker_weights", "worker_indices"]


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
