"""A gatherer's own collector in a gathered MPI job (``MPILauncher(gather=...)``): a sync
``DistributedDataCollector`` over its group's ranks, whose rounds travel to rank 0 as one batch.
What rank 0 sends it, and how rank 0 lays out what the gatherers send, is ``gathered.py``'s.
"""

from __future__ import annotations

from typing import Any

from hpccollect.distributed.collector import DistributedDataCollector

__all__ = ["GroupGatherer"]


class GroupGatherer(DistributedDataCollector):
    """A gatherer rank's collector: ``DistributedDataCollector(sync=True)`` over the ranks of
    its group (its launcher: the group's communicator, split by ``MPILauncher(gather=...)``),
    each of whose rounds, stacked ``[ranks, T]``, it sends rank 0 as one batch. Weights, seeds,
    resets and state from rank 0 reach its ranks through it. Rank 0 builds it on each gatherer
    (``Gathered.spec``); a script never does.

    Args:
        create_env_fn: one env constructor per rank of the group.
        policy: the policy, as rank 0 sent it.
        frames_per_batch: the group's frames per round.
        traj_id_offset: the first trajectory id of the group's share (from rank 0).
        traj_id_stride: the step between the group's trajectory ids (from rank 0).
        **kwargs: ``DistributedDataCollector``'s keywords, as rank 0 passes them on.
    """

    def __init__(
        self,
        create_env_fn: list,
        policy: Any = None,
        *,
        frames_per_batch: int,
        traj_id_offset: int = 0,
        traj_id_stride: int = 1,
        **kwargs: Any,
    ) -> None:
        from hpccollect.launchers.mpi import MPILauncher
        from hpccollect.launchers.mpi_gather import gatherer_group

        self._traj_ids = {"traj_id_offset": traj_id_offset, "traj_id_stride": traj_id_stride}
        super().__init__(
            create_env_fn,
            policy,
            frames_per_batch=frames_per_batch,
            sync=True,
            launcher=MPILauncher(comm=gatherer_group()),
            **kwargs,
        )

    def _base_kwargs(self) -> dict[str, Any]:
        return self._traj_ids
