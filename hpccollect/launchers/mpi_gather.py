"""Gathering in an MPI job (``MPILauncher(gather=...)``): the collector ranks are split into
groups whose first rank (the gatherer) forwards each round to rank 0 as one message.

The split is collective: every rank makes it with the same ``gather``. It gives two
communicators: rank 0 with the gatherers, and each group with its gatherer as rank 0.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hpccollect.errors import ArgumentTypeError, ArgumentValueError

__all__ = ["GatherPlan", "check_gather", "gather_groups", "plan_gathering"]


def check_gather(gather: Any) -> str | int | None:
    """``gather`` checked, as ``MPILauncher`` takes it.

    Args:
        gather: None (no gathering), ``"node"`` or a group size of at least 2.

    Returns:
        ``gather``.

    Raises:
        ArgumentTypeError: neither None, ``"node"`` nor an int.
        ArgumentValueError: a group size under 2."""
    if gather is None or gather == "node":
        return gather
    if isinstance(gather, bool) or not isinstance(gather, int):
        raise ArgumentTypeError(
            f"gather must be None, 'node' or a number of ranks per group, got {gather!r}."
        )
    if gather < 2:
        raise ArgumentValueError(
            f"gather={gather} leaves a gatherer nobody to gather from: pass a group size of at "
            "least 2 (the gatherer and the ranks it collects from), 'node', or None."
        )
    return gather


def gather_groups(gather: str | int, hosts: Sequence[str]) -> list[list[int]]:
    """The job's groups.

    Args:
        gather: ``"node"``: one group per host; ``k``: ranks ``1..k``, ``k+1..2k``, ...
        hosts: each rank's host name, rank 0's (in no group) first.

    Returns:
        Each group's world ranks, its gatherer first.

    Raises:
        ArgumentValueError: a group would hold a gatherer alone."""
    ranks = range(1, len(hosts))
    if gather == "node":
        by_host: dict[str, list[int]] = {}
        for rank in ranks:
            by_host.setdefault(hosts[rank], []).append(rank)
        groups = list(by_host.values())
    else:
        size = int(gather)
        groups = [list(ranks[i : i + size]) for i in range(0, len(ranks), size)]
    for group in groups:
        if len(group) < 2:
            where = f" on {hosts[group[0]]}" if gather == "node" else ""
            raise ArgumentValueError(
                f"gather={gather!r} leaves collector rank {group[0]}{where} alone in its group, "
                "with nobody to gather from (a group is its gatherer and at least one rank): "
                + (
                    "start at least 2 collector ranks on every node, or pass gather=None."
                    if gather == "node"
                    else f"choose a group size that leaves no rank alone for {len(ranks)} "
                    "collector ranks, or pass gather=None."
                )
            )
    return groups


@dataclass(frozen=True)
class GatherPlan:
    """This rank's place in a gathered job.

    Attributes:
        groups: every group's world ranks, its gatherer first.
        upper: rank 0 and the gatherers, in order; None on a rank that only collects.
        lower: this rank's group, its gatherer rank 0 of it; None on rank 0."""

    groups: list[list[int]]
    upper: Any
    lower: Any

    @property
    def gathers(self) -> bool:
        """Whether this rank is a gatherer (in both communicators)."""
        return self.upper is not None and self.lower is not None


def plan_gathering(world: Any, gather: str | int) -> GatherPlan:
    """Split ``world`` for gathering (collective).

    Args:
        world: the job's mpi4py communicator.
        gather: as ``gather_groups`` takes it.

    Returns:
        This rank's ``GatherPlan``.

    Raises:
        ArgumentValueError: too few ranks, or a gatherer alone (on every rank alike)."""
    from mpi4py import MPI

    rank = world.Get_rank()
    hosts = world.allgather(socket.gethostname() if gather == "node" else "")
    if len(hosts) < 3:
        raise ArgumentValueError(
            f"gather={gather!r} needs rank 0 and groups of at least 2 collector ranks; the job "
            f"has {len(hosts)} ranks: start more with mpiexec -n N, or pass gather=None."
        )
    groups = gather_groups(gather, hosts)
    mine = next((i for i, group in enumerate(groups) if rank in group), None)
    leads = rank == 0 or (mine is not None and groups[mine][0] == rank)
    upper = world.Split(0 if leads else MPI.UNDEFINED, rank)
    lower = world.Split(MPI.UNDEFINED if mine is None else mine, rank)
    return GatherPlan(
        groups,
        None if upper == MPI.COMM_NULL else upper,
        None if lower == MPI.COMM_NULL else lower,
    )


_GROUP: list[Any] = []  # a gatherer's own group, made by its launcher's split


def gatherer_group() -> Any:
    """The group this process gathers from (its mpi4py communicator, this process its rank 0);
    ``ArgumentValueError`` on a process that is no gatherer."""
    if not _GROUP:
        raise ArgumentValueError(
            "a gatherer's collector runs only on a gatherer rank of an MPI job whose ranks "
            "were split with MPILauncher(gather=...)."
        )
    return _GROUP[-1]


def keep_gatherer_group(comm: Any) -> None:
    """Note ``comm``, the group this process gathers from, for ``gatherer_group``."""
    _GROUP.append(comm)
