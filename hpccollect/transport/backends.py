"""The transport backends, registered by name: what each needs, whether this process has it, and
how it opens a process group. ``RankGroups`` and the collector look a backend up here and never
branch on its name; a new transport is one module with a ``Backend``, registered by name:
``register_backend("mine", "my_module:BACKEND")`` (or an ``hpccollect.transports`` entry point).

A process group here is the part of torch's ``ProcessGroup`` API the rank channels and the
weight sender use (``ProcessGroup`` in ``transport/base.py``). torch is imported when a backend
is first asked whether this process has it, or opens a group: naming the backends (``python -m
hpccollect --help``) loads none of it.
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

#: how long a rank may stay idle in one receive (the pool's own deadlines are what bound waits;
#: a process group timeout would close the connection for good, so it must never fire first)
IDLE = datetime.timedelta(days=30)


@dataclass(frozen=True)
class Backend:
    """One transport, as ``register_backend`` takes it.

    Attributes:
        name: what ``DistributedDataCollector(backend=...)`` calls it.
        available: whether this process can use it (its library is there).
        open_group: ``open_group(store, rank, world_size, name)`` joins a group of
            ``world_size`` processes (every rank calls it; it returns when all have). One
            that needs no store is also given ``comm=``, the MPI communicator the ranks meet
            in, where the launcher uses another than ``MPI.COMM_WORLD`` (a gathered job).
        missing: how to get it where ``available()`` is False.
        unsupported: why hpccollect cannot use it even where it is available (None: it can).
        needs_store: whether its groups meet through rank 0's TCP store (False: the
            launcher's own world, an MPI job's).
        device: where the tensors it moves live (``"cuda"`` for nccl: batches and weights
            then never pass through the host).
        one_group: whether its point-to-point transfers and its broadcasts share one group
            (``open_group`` is then called once, ``name`` ``"messages"``). Gloo's can: they
            never wait on each other, and one group holds one network thread and one set of
            connections. NCCL's cannot: it orders both on one stream, where a broadcast queued
            behind a receive whose sender first joins that broadcast never ends.
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


#: torch's switch (read when gloo's device is made) that connects a pair of ranks at its first
#: message instead of every rank to every other one as the group is made
_LAZY = "TORCH_GLOO_LAZY_INIT"
#: the tag of the pairs' first exchange (``_connect_pairs_in_use``): the rank channels' own
#: transfers use 0 and 1
HELLO = 3
#: torch's switch that names the network interface gloo listens on
_IFNAME = "GLOO_SOCKET_IFNAME"


def _gloo(store: Any, rank: int, world_size: int, name: str) -> Any:
    """A gloo group whose ranks connect only when they first exchange a message: a collector
    rank then holds a connection to rank 0 and to its few neighbours in the broadcast's tree,
    not one to each of the job's ranks (64 x 64 at 64 ranks), and the group is made without
    waiting for all of those. ``TORCH_GLOO_LAZY_INIT=0`` in the environment keeps torch's full
    mesh. Gloo listens on the interface that reaches rank 0's store (``_gloo_interface``).
    Both are torch's environment switches, read as the group is made: set for that moment,
    where the caller's environment does not set them itself."""
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
    """Connect, before the group is used, every pair of ranks the job's traffic will use: rank
    0 with each rank, and the broadcast's tree. The rank links count on a connection that is
    there from the start (a send to a rank that posted no receive goes out; a rank whose
    connection closes is seen at once), as torch's full mesh gave them; pairs that never talk
    stay unconnected."""
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
    """The interface gloo should listen on: the one that reaches rank 0's store (loopback on
    one node: nothing listens on other interfaces), so gloo never binds an address its peers
    cannot reach (torch's default resolves the host name, which may give loopback). None:
    torch's default (no store address, or none of this host's interfaces has the address)."""
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
    """The device rank ``rank`` moves tensors on: ``"cuda"`` becomes one GPU of its node's
    own, ``cuda:(rank % GPUs)`` (NCCL refuses two ranks on one GPU), made the current one."""
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
    """``comm``: the communicator the ranks meet in (None: ``MPI.COMM_WORLD``); one other than
    the world always goes over mpi4py (torch's MPI group spans world ranks)."""
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
