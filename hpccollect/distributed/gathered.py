"""Rank 0's side of gathering among an MPI job's ranks (the split is ``launchers/mpi_gather.py``'s,
a gatherer's collector ``collector.py``'s ``GroupGatherer``): ``Gathered`` says what each gatherer
is sent, ``GatheredRows`` lays out what rank 0 yields and stores as without gathering
(``[collecting ranks, T]``, rows in rank order, a row an ``extend``)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from hpccollect.collectors.workers.worker import WorkerSpec
from hpccollect.errors import ArgumentValueError

__all__ = ["Gathered", "GatheredRows"]

#: rank 0's arguments a gatherer's collector takes as they are, for its group's ranks
_FOR_THE_GROUP = (
    "device",
    "env_device",
    "policy_device",
    "max_frames_per_traj",
    "reset_at_each_iter",
    "exploration_type",
    "exploration_mode",
    "collector_class",
    "num_workers_per_collector",
    "backend",
    "worker_timeout",
    "start_timeout",
    "liveness_timeout",
    "weight_sync_schemes",
    "weight_recv_schemes",
)

_KEPT_ON_RANKS = (
    "the ranks' sinks keep their batches, and rank 0 would take reports only: gathering saves "
    "nothing there"
)
#: what a gathered job cannot do, and why
_REFUSED = {
    "rank_sink": _KEPT_ON_RANKS,
    "rank_reports": _KEPT_ON_RANKS,
    "track_policy_version": "a gatherer's ranks count the weights they got from it, not rank "
    "0's updates",
    "trajs_per_batch": "whole trajectories are cut on the ranks that collect them",
}

#: a gatherer's share of rank 0's ``worker_timeout``: a rank that never delivers is named, not
#: the gatherer waiting for it
_SOONER = 0.9


class Gathered:
    """Rank 0's view of a gathered job: each gatherer's collecting ranks, and what it is sent.

    Args:
        groups: the world ranks each gatherer collects from, in group order.
        arguments: rank 0's ``DistributedDataCollector`` arguments.

    Raises:
        ArgumentValueError: an argument that gathering cannot honour (named, with why)."""

    def __init__(self, groups: Sequence[Sequence[int]], arguments: dict[str, Any]) -> None:
        for name, why in _REFUSED.items():
            if arguments[name] not in (None, False):
                raise ArgumentValueError(
                    f"{name} cannot be used with gathering (MPILauncher(gather=...)): {why}. "
                    f"Leave gather=None, or drop {name}."
                )
        if arguments["on_worker_failure"] == "continue":
            raise ArgumentValueError(
                "on_worker_failure='continue' cannot be used with gathering (MPILauncher("
                "gather=...)): a gatherer's round has a row for each of its ranks, so it cannot "
                "go on without one. Leave gather=None, or on_worker_failure='raise'."
            )
        for name in ("frames_per_batch", "policy_factory"):
            if isinstance(arguments[name], (list, tuple)):
                raise ArgumentValueError(
                    f"{name} is a list, one per rank; with gathering (MPILauncher(gather=...)) "
                    "give one value for every rank."
                )
        self.groups = [list(group) for group in groups]
        self.sizes = [len(group) for group in groups]
        self.ranks = sum(self.sizes)
        rows = [rank for group in self.groups for rank in group]  # a round's, as it comes
        #: each collecting rank's place in rank order (where its env and kwargs are listed)
        self._place = {rank: i for i, rank in enumerate(sorted(rows))}
        rows = [self._place[rank] for rank in rows]
        #: puts a round's rows (gatherer after gatherer) in rank order; None where they are
        #: already (ranks placed in blocks, mpiexec's default)
        self.order = None if rows == sorted(rows) else torch.tensor(rows).argsort()
        self._arguments = {name: arguments[name] for name in _FOR_THE_GROUP}
        self._arguments["worker_timeout"] = _SOONER * float(arguments["worker_timeout"])
        self._init_random_frames = int(arguments["init_random_frames"])
        self._envs: list[list] = []
        self._kwargs: list[list[dict]] = []

    def split(
        self, fns: list, collector_kwargs: list[dict], frames_per_batch: int, sync: bool
    ) -> tuple:
        """Rank 0's per-gatherer arguments from its per-rank ones.

        Args:
            fns: one env constructor per collecting rank, in rank order.
            collector_kwargs: one dict per collecting rank, in rank order.
            frames_per_batch: the frames of each batch rank 0 yields.
            sync: rank 0 yields a round of every rank (``frames_per_batch`` split among all
                collecting ranks), else each group's round as it comes (split among its ranks).

        Returns:
            Per gatherer, its first rank's env constructor (for the checks; ``spec`` sends the
            group's) and an empty ``collector_kwargs`` (it passes its ranks' own); then rank
            0's ``frames_per_batch``: with ``sync``, each gatherer's frames per round.
        """
        for group in self.groups:
            self._envs.append([fns[self._place[rank]] for rank in group])
            self._kwargs.append([collector_kwargs[self._place[rank]] for rank in group])
        firsts, kwargs = [envs[0] for envs in self._envs], [{} for _ in self.sizes]
        if not sync:
            return firsts, kwargs, frames_per_batch
        per_rank = -(-int(frames_per_batch) // self.ranks)
        if per_rank * self.ranks != frames_per_batch:
            warnings.warn(
                f"frames_per_batch ({frames_per_batch}) is not divisible by the {self.ranks} "
                f"collecting ranks; each collects {per_rank} frames per batch.",
                stacklevel=3,
            )
        return firsts, kwargs, [size * per_rank for size in self.sizes]

    def spec(
        self, index: int, policy: Any, kwargs: dict, threads: int, gatherer: type
    ) -> WorkerSpec:
        """What gatherer ``index`` builds: a ``gatherer`` (``GroupGatherer``) over its group,
        with its share of each round (``kwargs``: what rank 0 would send a rank)."""
        # for each of the group's ranks, the random frames it would take without gathering
        irf = self._init_random_frames
        share = -(-irf // self.ranks) * self.sizes[index] if irf > 0 else irf
        own = {
            "frames_per_batch": kwargs["frames_per_batch"],
            "traj_id_offset": kwargs.get("traj_id_offset", 0),
            "traj_id_stride": kwargs.get("traj_id_stride", 1),
            "init_random_frames": share,
            "policy_factory": kwargs.get("policy_factory"),
            "collector_kwargs": self._kwargs[index],
        }
        return WorkerSpec(self._envs[index], policy, {**self._arguments, **own}, threads, gatherer)

    def in_rank_order(self, batch: TensorDictBase) -> TensorDictBase:
        """A sync round (its gatherers' rows one after the other) with its rows in rank order."""
        return batch if self.order is None else batch[self.order]


class GatheredRows:
    """``DistributedDataCollector`` in a gathered job: the gatherers are its workers."""

    _gathered: Gathered | None = None
    _collector_kwargs: list[dict]
    _sync_layout: str | int
    sync: bool

    def _gather_from(self, groups: list[list[int]], fns: list, arguments: dict) -> list:
        """Make the gatherers (``groups``: each one's ranks) the workers; one env each returned."""
        self._gathered = Gathered(groups, arguments)
        fns, self._collector_kwargs, arguments["frames_per_batch"] = self._gathered.split(
            fns, self._collector_kwargs, arguments["frames_per_batch"], self.sync
        )
        self._sync_layout = 0  # each gatherer's round is [its ranks, T]: concatenated
        return fns

    def _buffer_parts(self, batch: TensorDictBase) -> tuple[TensorDictBase, ...]:
        if self._gathered is not None:
            return batch.unbind(0)  # a row per collecting rank, as without gathering
        return super()._buffer_parts(batch)  # type: ignore[misc]

    def _time_named_split(self) -> bool:
        if self._gathered is not None:
            return self.sync  # rows of [collecting ranks, T], as stacked without gathering
        return super()._time_named_split()  # type: ignore[misc]

    def _stamp_rows(self, batch: TensorDictBase, workers: list[int]) -> TensorDictBase:
        batch = super()._stamp_rows(batch, workers)  # type: ignore[misc]
        if self._gathered is not None and self.sync:
            batch = self._gathered.in_rank_order(batch)
        return batch
