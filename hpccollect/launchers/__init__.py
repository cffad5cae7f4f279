"""How collector ranks are started: one plug-in per launcher, chosen by name."""

from __future__ import annotations

from typing import Any

from hpccollect.errors import ArgumentTypeError, ArgumentValueError
from hpccollect.launchers.base import Launcher
from hpccollect.launchers.mp import MPLauncher
from hpccollect.transport.base import PeerLife

__all__ = ["LAUNCHERS", "Launcher", "MPLauncher", "PeerLife", "get_launcher"]

LAUNCHERS = ("mp", "mpi", "submitit", "submitit_delayed")


def get_launcher(
    launcher: Any, starts_processes: bool = False, slurm_kwargs: dict | None = None
) -> Launcher:
    """The launcher ``launcher`` names (or ``launcher`` itself when it is a ``Launcher``);
    ``starts_processes``: the ranks' collectors start processes of their own;
    ``slurm_kwargs``: the submitit launchers' executor parameters."""
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
        try:
            import submitit  # noqa: F401 - only a check that it is there
        except ImportError as err:
            raise ArgumentValueError(
                f"launcher={launcher!r} needs the submitit package: pip install submitit, or "
                "pass launcher='mp' to run the collector ranks as local processes."
            ) from err
        from hpccollect.launchers.submitit import SubmititLauncher

        return SubmititLauncher(slurm_kwargs, delayed=launcher == "submitit_delayed")
    raise ArgumentValueError(f"launcher must be one of {list(LAUNCHERS)}, got {launcher!r}.")
