"""What a launcher is: it starts collector ranks 1..N somewhere and hands back what it knows of
their processes (a ``PeerLife`` each, the transport's one interface for a peer's life). The
collector never knows how ranks were started."""

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
        starts_processes: whether the ranks' collectors start processes of their own (for a
            launcher whose ranks could not; the built-in launchers' ranks always can).
        slurm_kwargs: the submitit launchers' executor parameters.
        master_addr: where rank 0 listens, for a launcher that lets it be chosen (``python -m
            hpccollect collect --master-addr``); None: the launcher's own choice.
        interface: the network interface rank 0 listens on (``--interface``), likewise.
    """

    name: str
    starts_processes: bool = False
    slurm_kwargs: dict | None = None
    master_addr: str | None = None
    interface: str | None = None


class Launcher(abc.ABC):
    """Starts the collector ranks of a ``DistributedDataCollector``: a plug-in, registered by
    name with ``register_launcher``.

    A subclass implements ``address`` (where rank 0 listens) and ``start`` (one process per
    ``RankArgs``, each running ``hpccollect.launchers.rank.serve_rank(args)``); ``from_request``
    when it takes arguments, ``enter``, ``close`` and ``left_running`` when it has more to do.
    The class attributes below tell the collector what the launcher's ranks are like.
    """

    #: whether ranks run on this machine (rank 0 then leaves them its CPU threads)
    shares_host: bool = True
    #: how many collector ranks the job has when the launcher decides it (mpiexec -n N: N - 1),
    #: None when the collector's ``create_env_fn`` list decides
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
            request: what the collector asks of it (its name, ``slurm_kwargs``, where rank 0
                listens).

        Returns:
            The launcher; by default the class built with no argument.
        """
        return cls()

    def enter(self, start_timeout: float) -> None:
        """Called first on every process that constructs the collector. A launcher whose ranks
        run the caller's own script (mpiexec) serves a collector rank here and ends the process
        instead of returning; on rank 0, and for other launchers, it returns.

        Args:
            start_timeout: seconds the ranks may take to start (the collector's own).
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
        """Start one process per entry, each running ``serve_rank(args)``. On failure nothing
        started is left running.

        Args:
            ranks: each rank's arguments (its rank, rank 0's address and port, its collector).

        Returns:
            What is known of each rank's process: a ``PeerLife`` (its death, join and kill), or
            None where nothing is.
        """

    def close(self) -> None:
        """After the ranks ended (shutdown, or a failed start): release what ``start`` keeps
        beside them; by default there is nothing."""
        return None

    def left_running(self, ranks: Sequence[int]) -> None:
        """After shutdown: ``ranks`` were lost and still run, and their ``PeerLife`` could not
        end them (a rank mpiexec started, stopped or cut off). End them as only the launcher can;
        by default there is nothing more to do (their ``kill`` did it).

        Args:
            ranks: the ranks still running.
        """
        return None
