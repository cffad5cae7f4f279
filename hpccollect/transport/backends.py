"""The transport backends, registered by name: what each needs, whether this process has it,
and how it opens a process group (``base.ProcessGroup``). ``RankGroups`` and the collector look
a backend up here and never branch on its name; a new transport is one module with a
``Backend``, registered by ``register_backend("mine", "my_module:BACKEND")`` or an
``hpccollect.transports`` entry point. torch is imported only when a backend is asked whether
this process has it, or opens a group: ``python -m hpccollect --help`` loads none of it.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import ipaddress
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hpccollect._lazy import add_object, loaded_objects
from hpccollect.errors import ArgumentValueError

__all__ = [
    "Backend",
    "available_backends",
    "backend_named",
    "backend_names",
    "check_backend",
    "rank_device",
    "register_backend",
]

#: how long a rank may stay idle in one receive: the pool's deadlines bound waits, and a process
#: group's timeout would close the connection for good, so it must never fire first
IDLE = datetime.timedelta(days=30)


@dataclass(frozen=True)
class Backend:
    """One transport, as ``register_backend`` takes it.

    Attributes:
        name: what ``DistributedDataCollector(backend=...)`` calls it.
        available: whether this process can use it (its library is there).
        open_group: ``open_group(store, rank, world_size, name)`` joins a group of
            ``world_size`` processes (every rank calls it; it returns when all have); one that
            needs no store also gets ``comm=``, where the ranks meet in another communicator
            than ``MPI.COMM_WORLD``.
        missing: how to get it where ``available()`` is False.
        unsupported: why hpccollect cannot use it even where it is available (None: it can).
        needs_store: whether its groups meet through rank 0's TCP store (False: the
            launcher's own world, an MPI job's).
        device: where the tensors it moves live (``"cuda"`` for nccl).
        one_group: whether its point-to-point transfers and broadcasts share one group
            (``open_group`` called once, ``name`` ``"messages"``): gloo's never wait on each
            other (one group: one thread, one set of connections); NCCL orders both on one
            stream, where a broadcast behind a receive whose sender first joins it never ends.
    """

    name: str
    available: Callable[[], bool]
    open_group: Callable[[Any, int, int, str], Any]
    missing: str
    unsupported: str | None = None
    needs_store: bool = True
    device: str = "cpu"
    one_group: bool = False


_BACKENDS: dict[str, Backend | str] = {}  # a Backend, or "module:attr" naming one


def register_backend(name: str | Backend, target: str | None = None) -> None:
    """Offer a transport as ``DistributedDataCollector(backend=name)``.

    Args:
        name: its name; or a ``Backend``, registered under its own name.
        target: ``"module:attr"`` naming the ``Backend``, imported on first use.
    """
    add_object(_BACKENDS, name, target, Backend, "register_backend")


def _backends() -> dict[str, Backend]:
    """Every registered backend (installed packages' ``hpccollect.transports`` too), loaded."""
    return loaded_objects("transport", _BACKENDS, Backend)


def backend_named(name: str) -> Backend:
    """The registered backend ``name``; an error naming those there are."""
    backends = _backends()
    if name not in backends:
        raise ArgumentValueError(f"backend must be one of {list(backends)}, got {name!r}.")
    return backends[name]


def backend_names() -> tuple[str, ...]:
    """Every backend hpccollect can use where it is available (the one list of them)."""
    return tuple(name for name, b in _backends().items() if b.unsupported is None)


def available_backends() -> list[str]:
    """The backends this process can use."""
    return [name for name, b in _backends().items() if b.available() and b.unsupported is None]


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
        import torch.distributed as dist

        check = getattr(dist, f"is_{name}_available", None)
        return dist.is_available() and check is not None and bool(check())

    return has


_LAZY = "TORCH_GLOO_LAZY_INIT"  # torch's switch: connect a pair of ranks at its first message
#: the tag of the pairs' first exchange (``_connect_pairs_in_use``); the rank channels use 0, 1
HELLO = 3
_IFNAME = "GLOO_SOCKET_IFNAME"  # torch's switch: the interface gloo listens on


def _gloo(store: Any, rank: int, world_size: int, name: str) -> Any:
    """A gloo group whose ranks connect only when they first exchange a message: a collector
    rank holds a connection to rank 0 and to its few neighbours in the broadcast's tree, not to
    each of the job's ranks (64 x 64 at 64 ranks). ``TORCH_GLOO_LAZY_INIT=0`` keeps torch's full
    mesh. Gloo listens on the interface that reaches rank 0's store (``_gloo_interface``). Both
    switches are set while the group is made, where the environment does not set them."""
    import torch.distributed as dist

    settings = {_LAZY: "1"}
    interface = _gloo_interface(store)
    if interface is not None:
        settings[_IFNAME] = interface
    with _environment(settings):
        group = dist.ProcessGroupGloo(store, rank, world_size, IDLE)
    _connect_pairs_in_use(group, rank, world_size, store.timeout)
    return group


@contextlib.contextmanager
def _environment(settings: dict[str, str]) -> Iterator[None]:
    """Within the block, each of ``settings`` that the environment lacks is set."""
    added = [key for key in settings if key not in os.environ]
    os.environ.update({key: settings[key] for key in added})
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def _connect_pairs_in_use(
    group: Any, rank: int, world_size: int, timeout: datetime.timedelta
) -> None:
    """Connect, before the group is used, the pairs the job's traffic uses (rank 0 with each
    rank, and the broadcast's tree): the rank links count on a connection there from the start
    (a send to a rank that posted no receive goes out; a rank whose connection closes is seen
    at once)."""
    import torch

    token = torch.zeros(1, dtype=torch.uint8)
    if rank == 0:
        works = [group.send([token], peer, HELLO) for peer in range(1, world_size)]
    else:
        works = [group.recv([token], 0, HELLO)]
    works.append(group.broadcast([token]))
    for work in works:
        work.wait(timeout)


def _gloo_interface(store: Any) -> str | None:
    """The interface that reaches rank 0's store (loopback on one node), so gloo never binds an
    address its peers cannot reach (torch's default resolves the host name, maybe to loopback).
    None: torch's default (no store address, or no interface of this host has the address)."""
    host = getattr(getattr(store, "underlying_store", store), "host", "")
    if not host:
        return None
    from hpccollect.transport.addresses import address_towards, interface_with

    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).is_loopback:
            return interface_with(host)
    return interface_with(address_towards(host))


def _ucc(store: Any, rank: int, world_size: int, name: str) -> Any:
    import torch.distributed as dist

    return dist.ProcessGroupUCC(store, rank, world_size, IDLE)


def _nccl(store: Any, rank: int, world_size: int, name: str) -> Any:
    """An NCCL group on this process's GPU (``rank_device``: one GPU per rank)."""
    import torch.distributed as dist

    return dist.ProcessGroupNCCL(store, rank, world_size)


def rank_device(device: str, rank: int) -> str:
    """The device rank ``rank`` moves tensors on: ``"cuda"`` becomes ``cuda:(rank % GPUs)``
    (NCCL refuses two ranks on one GPU), made the current one."""
    if device != "cuda":
        return device
    import torch

    chosen = f"cuda:{rank % max(1, torch.cuda.device_count())}"
    torch.cuda.set_device(chosen)
    return chosen


def _mpi_available() -> bool:
    """torch's own MPI backend, or mpi4py's transport standing in for it."""
    return _torch_has("mpi")() or importlib.util.find_spec("mpi4py") is not None


def _mpi(store: Any, rank: int, world_size: int, name: str, comm: Any = None) -> Any:
    """``comm``: the communicator the ranks meet in (None: ``MPI.COMM_WORLD``); another one
    always goes over mpi4py (torch's MPI group spans world ranks)."""
    import torch.distributed as dist

    if comm is None and dist.is_mpi_available():
        return dist.ProcessGroupMPI.create(list(range(world_size)))
    from hpccollect.transport.mpi4py_group import MPIGroup, mpi4py_comm

    comm = mpi4py_comm() if comm is None else comm
    if comm.Get_size() != world_size or comm.Get_rank() != rank:
        raise ArgumentValueError(
            f"backend='mpi' needs rank {rank} of a {world_size}-process MPI job, but this "
            f"process is rank {comm.Get_rank()} of {comm.Get_size()}: start every rank with "
            f"mpiexec -n {world_size} and pass launcher='mpi'."
        )
    return MPIGroup(comm, f"hpccollect-{name}")


register_backend(
    Backend(
        "gloo",
        _torch_has("gloo"),
        _gloo,
        "use a torch build with distributed support",
        one_group=True,
    )
)
register_backend(
    Backend(
        "nccl",
        _torch_has("nccl"),
        _nccl,
        "install a CUDA build of torch on a machine with NVIDIA GPUs",
        device="cuda",
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
