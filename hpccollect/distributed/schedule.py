"""``DistributedDataCollector``'s weight schedule: weights sent unasked (``update_interval``,
``max_weight_update_interval``), each rank's weight versions and each frame's
(``track_policy_version``); mixed in ahead of the multi-process collector."""

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
    """The weight-schedule methods of ``DistributedDataCollector`` (what they use, declared)."""

    max_weight_update_interval: int
    track_policy_version: bool
    policy_versions: list[int]
    _since_update: list[int]
    _no_weights_here: bool
    _pool: Any

    update_policy_weights_: Callable[..., None]
    _lose: Callable[[WorkerError], None]

    def _collect_from(self, index: int) -> None:
        # where the ranks built their policy there are no weights here to push
        interval = -1 if self._no_weights_here else self.max_weight_update_interval
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
        if self.max_weight_update_interval > 0 and not self._no_weights_here:
            batches = min(batches, self.max_weight_update_interval)
        return batches

    def _delivered(self, worker_ids: Sequence[int]) -> None:
        for i in worker_ids:
            self.policy_versions[i] += 1
            self._since_update[i] = 0

    def _stamp_rows(self, batch: TensorDictBase, workers: list[int]) -> TensorDictBase:
        """``batch`` with each frame's policy version, if tracked (``workers``: one per row)."""
        if self.track_policy_version:
            # each rank says which weights it collected with (an update that reached it between
            # request and start counts for that batch)
            versions = [self._pool.channels[i].batch_version for i in workers]
            v = torch.tensor(versions, dtype=torch.int64)
            if batch.ndim == 0:  # one rank's report
                v = v[0]
            v = v.reshape(v.shape + (1,) * (batch.ndim - v.ndim)).expand(batch.shape)
            batch.set(POLICY_VERSION_KEY, v.clone())
        return batch
