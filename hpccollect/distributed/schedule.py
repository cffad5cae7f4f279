"""When rank 0 sends a collector rank weights without being asked (``max_weight_update_interval``,
TorchRL's ``update_interval``), how many weight versions each rank has had, and which version each
frame was collected with (``track_policy_version``): ``DistributedDataCollector``'s weight
schedule, mixed in ahead of the multi-process collector whose requests it wraps."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from hpccollect.errors import WorkerError

__all__ = ["POLICY_VERSION_KEY", "WeightSchedule"]

#: the per-frame entry ``track_policy_version=True`` adds
POLICY_VERSION_KEY = "policy_version"


class WeightSchedule:
    """The weight-schedule methods of ``DistributedDataCollector``; what they use of the
    collector is declared."""

    max_weight_update_interval: int
    track_policy_version: bool
    policy_versions: list[int]
    _since_update: list[int]
    _no_weights_here: bool
    _pool: Any

    update_policy_weights_: Callable[..., None]
    _lose: Callable[[WorkerError], None]

    def _collect_from(self, index: int) -> None:
        interval = self.max_weight_update_interval
        if self._no_weights_here:
            interval = -1  # the ranks built their policy: no weights here to push
        try:
            if interval > 0 and self._since_update[index] >= interval:
                self.update_policy_weights_(worker_ids=[index])
            super()._collect_from(index)
        except WorkerError as err:
            self._lose(err)
            return
        self._since_update[index] += 1

    def _batches_per_command(self, index: int) -> int:
        batches = super()._batches_per_command(index)
        interval = self.max_weight_update_interval
        if interval > 0 and not self._no_weights_here:
            batches = min(batches, interval)
        return batches

    def _delivered(self, worker_ids: Sequence[int]) -> None:
        for i in worker_ids:
            self.policy_versions[i] += 1
            self._since_update[i] = 0

    def _stamp_rows(self, batch: TensorDictBase, workers: list[int]) -> TensorDictBase:
        """``batch`` with the per-frame policy version (of each worker in ``workers``: one per
        leading row, or a single one) when ``track_policy_version``."""
        if self.track_policy_version:
            # each rank says which weights it collected with: an update that reached it while
            # its batch was requested but not yet begun counts for that batch
            versions = [self._pool.channels[i].batch_version for i in workers]
            v = torch.tensor(versions, dtype=torch.int64)
            if batch.ndim == 0:  # one rank's report
                v = v[0]
            v = v.reshape(v.shape + (1,) * (batch.ndim - v.ndim)).expand(batch.shape)
            batch.set(POLICY_VERSION_KEY, v.clone())
        return batch
