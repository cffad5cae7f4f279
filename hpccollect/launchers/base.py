"""What a launcher is: it starts collector ranks 1..N somewhere and hands back what it knows of
their processes. The collector never knows how ranks were started."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the ranks' entry points import launchers: no import back at run time
    from hpccollect.distributed.rank import RankArgs

__all__ = ["Launcher", "RankProcess"]


class RankProcess(abc.ABC):
    """What a launcher can do with one rank's process (rank 0's side)."""

    host: str = ""
    pid: int | None = None
    #: an object ``multiprocessing.connection.wait`` sees become ready when the process ends,
    #: or None when the launcher has none (the rank's connection closing tells instead)
    sentinel: Any = None
    #: where to look for the rank besides its host and pid (a scheduler's job and log), or ""
    where: str = ""

    @abc.abstractmethod
    def death(self, wait: float = 0.0) -> str | None:
        """None while it runs; otherwise how it ended."""

    @abc.abstractmethod
    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for it to end; whether it has."""

    @abc.abstractmethod
    def kill(self) -> None:
        """End it now (bounded)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what watching it holds; idempotent."""


class Launcher(abc.ABC):
    """Starts the collector ranks of a ``DistributedDataCollector``."""

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

    def enter(self, start_timeout: float) -> None:
        """Called first on every process that constructs the collector. A launcher whose ranks
        run the caller's own script (mpiexec) serves a collector rank here and ends the
        process instead of returning; on rank 0, and for other launchers, it returns."""
        return None

    @abc.abstractmethod
    def address(self) -> str:
        """The address rank 0 listens on for its ranks."""

    @abc.abstractmethod
    def start(self, ranks: Sequence[RankArgs]) -> list[RankProcess | None]:
        """Start one process per entry, each running ``serve_rank(args)``; what is known of
        each (None where nothing is). On failure nothing started is left running."""
