"""What a launcher is: it starts collector ranks 1..N somewhere and hands back a ``PeerLife``
for each; the collector never knows how ranks were started."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

from hpccollect.launchers.rank import RankArgs
from hpccollect.transport.base import PeerLife

__all__ = ["LaunchRequest", "Launcher"]


@dataclass(frozen=True)
class LaunchRequest:
    """What ``DistributedDataCollector(launcher=name, ...)`` asks of the launcher it names.

    Attributes:
        name: the launcher's registered name.
        starts_processes: whether the ranks' collectors start processes of their own (the
            built-in launchers' ranks always can).
        slurm_kwargs: the submitit launchers' executor parameters.
        master_addr: where rank 0 listens (``--master-addr``); None: the launcher's choice.
        interface: the network interface rank 0 listens on (``--interface``), likewise.
    """

    name: str
    starts_processes: bool = False
    slurm_kwargs: dict | None = None
    master_addr: str | None = None
    interface: str | None = None


class Launcher(abc.ABC):
    """Starts the collector ranks of a ``DistributedDataCollector`` (see ``register_launcher``).

    A subclass implements ``address`` and ``start``; ``from_request``, ``enter``, ``close`` and
    ``left_running`` when it has more to do. The class attributes describe its ranks.
    """

    #: whether ranks run on this machine (rank 0 then leaves them its CPU threads)
    shares_host: bool = True
    #: the collector ranks when the launcher decides (mpiexec -n N: N - 1); None: the collector
    num_ranks: int | None = None
    #: whether rank 0 and the ranks are one MPI job (what ``backend="mpi"`` needs)
    mpi_world: bool = False
    #: the port rank 0 listens on when ``tcp_port`` is None (0: a free one)
    default_port: int = 0
    #: whether the launcher passes ``slurm_kwargs`` on
    uses_slurm_kwargs: bool = False

    @classmethod
    def from_request(cls, request: LaunchRequest) -> Launcher:
        """The launcher ``DistributedDataCollector(launcher=request.name)`` uses.

        Args:
            request: what the collector asks of it.

        Returns:
            The launcher; by default the class built with no argument.
        """
        return cls()

    def enter(self, start_timeout: float) -> None:
        """Called first on every process that constructs the collector. Where the ranks run the
        caller's own script (mpiexec), a collector rank is served here and its process ends.

        Args:
            start_timeout: seconds the ranks may take to start.
        """
        return None

    @abc.abstractmethod
    def address(self) -> str:
        """Where rank 0 listens for its ranks.

        Returns:
            An address the ranks reach (an IP address or a host name).
        """

    @abc.abstractmethod
    def start(self, ranks: Sequence[RankArgs]) -> list[PeerLife | None]:
        """Start one process per entry, each running ``serve_rank(args)``; on failure nothing
        started is left running.

        Args:
            ranks: each rank's arguments.

        Returns:
            Each rank's ``PeerLife``, or None where nothing is known of its process.
        """

    def close(self) -> None:
        """After the ranks ended: release what ``start`` keeps beside them (by default nothing)."""
        return None

    def left_running(self, ranks: Sequence[int]) -> None:
        """After shutdown: end lost ``ranks`` that their ``PeerLife`` could not (a rank mpiexec
        started); by default nothing more is done (their ``kill`` did it).

        Args:
            ranks: the ranks still running.
        """
        return None
