"""How collector ranks are started: one plug-in per launcher, chosen by name."""

from __future__ import annotations

from typing import Any

from hpccollect.errors import ArgumentTypeError, ArgumentValueError
from hpccollect.launchers.base import Launcher, RankProcess
from hpccollect.launchers.mp import MPLauncher

__all__ = ["LAUNCHERS", "Launcher", "MPLauncher", "RankProcess", "get_launcher"]

LAUNCHERS = ("mp", "mpi", "submitit", "submitit_delayed")


def get_launcher(launcher: Any, starts_processes: bool = False) -> Launcher:
    """The launcher ``launcher`` names (or ``launcher`` itself when it is a ``Launcher``);
    ``starts_processes``: the ranks' collectors start processes of their own."""
    if isinstance(launcher, Launcher):
        return launcher
    if not isinstance(launcher, str):
        raise ArgumentTypeError(
            f"launcher must be a name {list(LAUNCHERS)} or an hpccollect.launchers.Launcher, "
            f"got {type(launcher).__name__}."
        )
    if launcher == "mp":
        return MPLauncher(daemon=not starts_processes)
    if launcher == "mpi":
        from hpccollect.launchers.mpi import MPILauncher  # imports mpi4py: only when asked

        return MPILauncher()
    if launcher in ("submitit", "submitit_delayed"):
        raise ArgumentValueError(
            f"launcher={launcher!r} (SLURM jobs through submitit) is not available in this "
            "version of hpccollect; pass launcher='mp' to run the collector ranks as local "
            "processes, or launcher='mpi' under mpiexec/srun."
        )
    raise ArgumentValueError(f"launcher must be one of {list(LAUNCHERS)}, got {launcher!r}.")
