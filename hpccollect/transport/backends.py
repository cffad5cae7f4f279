"""The transport backends, registered by name: what each needs, whether this process has it, and
how it opens a process group. ``RankGroups`` and the collector look a backend up here and never
branch on its name; a new transport is one module that calls ``register_backend``.

A process group here is the part of torch's ``ProcessGroup`` API the rank channels and the
weight sender use (``ProcessGroup`` in ``transport/base.py``).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from hpccollect.errors import ArgumentValueError

__all__ = [
    "Backend",
    "available_backends",
    "backend_named",
    "backend_names",
    "check_backend",
    "register_backend",
]

#: how long a rank may stay idle in one receive (the pool's own deadlines are what bound waits;
#: a process group timeout would close the connection for good, so it must never fire first)
IDLE = datetime.timedelta(days=30)


@dataclass(frozen=True)
class Backend:
    """One transport: ``open_group(store, rank, world_size, name)`` joins a group of
    ``world_size`` processes (every rank calls it; it returns when all have)."""

    name: str
    available: Callable[[], bool]
    open_group: Callable[[Any, int, int, str], Any]
    #: how to get it where ``available()`` is False
    missing: str
    #: why hpccollect cannot use it even where it is available (None: it can)
    unsupported: str | None = None
    #: whether its groups meet through rank 0's TCP store (False: the launcher's own world)
    needs_store: bool = True


_BACKENDS: dict[str, Backend] = {}


def register_backend(backend: Backend) -> None:
    """Offer ``backend`` under its name (``DistributedDataCollector(backend=...)``)."""
    _BACKENDS[backend.name] = backend


def backend_named(name: str) -> Backend:
    """The registered backend ``name``; an error naming those there are."""
    if name not in _BACKENDS:
        raise ArgumentValueError(f"backend must be one of {list(_BACKENDS)}, got {name!r}.")
    return _BACKENDS[name]


def backend_names() -> tuple[str, ...]:
    """Every backend hpccollect can use where it is available (the one list of them)."""
    return tuple(name for name, b in _BACKENDS.items() if b.unsupported is None)


def available_backends() -> list[str]:
    """The backends this process can use."""
    return [name for name, b in _BACKENDS.items() if b.available() and b.unsupported is None]


def check_backend(name: Any) -> str:
    """``name`` if this process can use that backend; otherwise an error saying what it has."""
    backend = backend_named(name)
    if not backend.available():
        raise ArgumentValueError(
            f"backend={name!r} is not in this torch build (this process has "
            f"{available_backends() or 'none'}); {backend.missing}, or use backend='gloo', which "
            "moves CPU tensors between any hosts."
        )
    if backend.unsupported is not None:
        raise ArgumentValueError(backend.unsupported)
    return name


def _torch_has(name: str) -> Callable[[], bool]:
    def has() -> bool:
        check = getattr(dist, f"is_{name}_available", None)
        return dist.is_available() and check is not None and bool(check())

    return has


def _gloo(store: Any, rank: int, world_size: int, name: str) -> Any:
    options = dist.ProcessGroupGloo._Options()
    options._timeout = IDLE
    options._devices = [_gloo_device(store)]
    return dist.ProcessGroupGloo(store, rank, world_size, options)


def _gloo_device(store: Any) -> Any:
    """Gloo's listening device: on the interface that reaches rank 0's store (loopback on one
    node: nothing listens on other interfaces), so gloo never binds an address its peers cannot
    reach (torch's default resolves the host name, which may give loopback);
    ``GLOO_SOCKET_IFNAME`` chooses instead."""
    host = getattr(getattr(store, "underlying_store", store), "host", "")
    if os.environ.get("GLOO_SOCKET_IFNAME") or not host:
        return dist.ProcessGroupGloo.create_default_device()
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).is_loopback:
            return dist.ProcessGroupGloo.create_device(hostname=host)
    from hpccollect.transport.rendezvous import address_towards

    return dist.ProcessGroupGloo.create_device(hostname=address_towards(host))


def _ucc(store: Any, rank: int, world_size: int, name: str) -> Any:
    return dist.ProcessGroupUCC(store, rank, world_size, IDLE)


def _nccl(store: Any, rank: int, world_size: int, name: str) -> Any:
    return dist.ProcessGroupNCCL(store, rank, world_size)


def _mpi_available() -> bool:
    """torch's own MPI backend, or mpi4py's transport standing in for it."""
    return _torch_has("mpi")() or importlib.util.find_spec("mpi4py") is not None


def _mpi(store: Any, rank: int, world_size: int, name: str) -> Any:
    if dist.is_mpi_available():
        return dist.ProcessGroupMPI.create(list(range(world_size)))
    from hpccollect.transport.mpi4py_group import MPIGroup, mpi4py_comm

    comm = mpi4py_comm()
    if comm.Get_size() != world_size or comm.Get_rank() != rank:
        raise ArgumentValueError(
            f"backend='mpi' needs rank {rank} of a {world_size}-process MPI job, but this "
            f"process is rank {comm.Get_rank()} of {comm.Get_size()}: start every rank with "
            f"mpiexec -n {world_size} and pass launcher='mpi'."
        )
    return MPIGroup(comm, f"hpccollect-{name}")


register_backend(
    Backend("gloo", _torch_has("gloo"), _gloo, "use a torch build with distributed support")
)
register_backend(
    Backend(
        "nccl",
        _torch_has("nccl"),
        _nccl,
        "install a CUDA build of torch on a machine with NVIDIA GPUs",
        unsupported=(
            "backend='nccl' is not supported by hpccollect's transport yet (its control "
            "messages need receives larger than the send, which NCCL does not allow); use "
            "backend='gloo': batches travel as CPU tensors, and each rank's policy and env may "
            "still run on its GPU (policy_device, env_device)."
        ),
    )
)
register_backend(Backend("ucc", _torch_has("ucc"), _ucc, "build torch with UCC (USE_C10D_UCC=1)"))
register_backend(
    Backend(
        "mpi",
        _mpi_available,
        _mpi,
        "pip install 'hpccollect[mpi]' (mpi4py and the mpich package), or build torch from "
        "source against your MPI",
        needs_store=False,
    )
)
