"""How collector ranks are started: one plug-in per launcher, registered by name and imported
on first use (``launcher="mp"`` never loads mpi4py or submitit)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpccollect._lazy import check_target, lazy_exports, load_target, with_entry_points
from hpccollect.errors import ArgumentTypeError, ArgumentValueError

if TYPE_CHECKING:
    from hpccollect.launchers.base import Launcher, LaunchRequest
    from hpccollect.launchers.mp import MPLauncher
    from hpccollect.launchers.mpi import MPILauncher
    from hpccollect.transport.base import PeerLife

__all__ = [
    "LAUNCHERS",
    "LaunchRequest",
    "Launcher",
    "MPILauncher",
    "MPLauncher",
    "PeerLife",
    "get_launcher",
    "job_launchers",
    "launcher_names",
    "register_launcher",
]


@dataclass(frozen=True)
class _Entry:
    target: str  # "module:Class", imported on first use
    requires: str | None  # a package the launcher imports; checked first, for a clear error
    ranks_exist: bool  # whether the job's ranks exist before the collector (mpiexec, srun)


_LAUNCHERS: dict[str, _Entry] = {}


def register_launcher(
    name: str, target: str, *, requires: str | None = None, ranks_exist: bool = False
) -> None:
    """Offer ``DistributedDataCollector(launcher=name)``.

    Args:
        name: the launcher's name.
        target: ``"module:Class"`` of a ``Launcher`` subclass, imported on first use and built
            with ``Class.from_request(LaunchRequest)``.
        requires: a package the launcher needs, checked first for an error naming it.
        ranks_exist: every rank runs the job's own command (mpiexec/srun), which makes it a
            ``--launcher`` of ``python -m hpccollect collect`` too.
    """
    _LAUNCHERS[name] = _Entry(check_target(target), requires, ranks_exist)


def _launchers() -> dict[str, _Entry]:
    """The registered launchers, with installed packages' ``hpccollect.launchers`` entry points
    (as ``requires=None``, ``ranks_exist=False``)."""
    return with_entry_points("launcher", _LAUNCHERS, lambda target: _Entry(target, None, False))


def launcher_names() -> tuple[str, ...]:
    """Every registered launcher."""
    return tuple(_launchers())


def job_launchers() -> tuple[str, ...]:
    """The launchers whose ranks all run the job's own command (those ``collect`` runs under)."""
    return tuple(name for name, entry in _launchers().items() if entry.ranks_exist)


def get_launcher(
    launcher: Any,
    starts_processes: bool = False,
    slurm_kwargs: dict | None = None,
    *,
    master_addr: str | None = None,
    interface: str | None = None,
) -> Launcher:
    """The launcher ``launcher`` names (or ``launcher`` itself when it is a ``Launcher``).

    Args:
        launcher: a registered name (``register_launcher``) or a ``Launcher``.
        starts_processes: the ranks' collectors start processes (see ``LaunchRequest``).
        slurm_kwargs: the submitit launchers' executor parameters.
        master_addr: where rank 0 listens, for launchers that take it.
        interface: the network interface rank 0 listens on, likewise.

    Returns:
        The launcher, built by its class's ``from_request``.
    """
    from hpccollect.launchers.base import Launcher, LaunchRequest

    if isinstance(launcher, Launcher):
        return launcher
    if not isinstance(launcher, str):
        raise ArgumentTypeError(
            f"launcher must be a name {list(_launchers())} or an hpccollect.launchers.Launcher, "
            f"got {type(launcher).__name__}."
        )
    entry = _launchers().get(launcher)
    if entry is None:
        raise ArgumentValueError(f"launcher must be one of {list(_LAUNCHERS)}, got {launcher!r}.")
    if entry.requires is not None and importlib.util.find_spec(entry.requires) is None:
        raise ArgumentValueError(
            f"launcher={launcher!r} needs the {entry.requires} package: pip install "
            f"{entry.requires}, or pass launcher='mp' to run the collector ranks as local "
            "processes."
        )
    return load_target(entry.target).from_request(
        LaunchRequest(launcher, starts_processes, slurm_kwargs, master_addr, interface)
    )


register_launcher("mp", "hpccollect.launchers.mp:MPLauncher")
register_launcher("mpi", "hpccollect.launchers.mpi:MPILauncher", ranks_exist=True)
register_launcher("submitit", "hpccollect.launchers.submitit:SubmititLauncher", requires="submitit")
register_launcher(  # inside a main of submitit_delayed_launcher: its pre-launched ranks
    "submitit_delayed", "hpccollect.launchers.prelaunched:PrelaunchedLauncher", requires="submitit"
)

#: the launchers hpccollect brings (``launcher_names()`` also lists those registered later)
LAUNCHERS = tuple(_LAUNCHERS)


# the classes load on first use: naming the launchers loads none of them, nor mpi4py
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Launcher": "hpccollect.launchers.base:Launcher",
        "LaunchRequest": "hpccollect.launchers.base:LaunchRequest",
        "MPLauncher": "hpccollect.launchers.mp:MPLauncher",
        "MPILauncher": "hpccollect.launchers.mpi:MPILauncher",
        "PeerLife": "hpccollect.transport.base:PeerLife",
    },
)
