"""The torch.distributed side of a job: which backends this torch build has, the rendezvous store,
and the two process groups a collector job uses (messages and batches; weight broadcasts).

The groups are private to the collector (not torch's default group), so a trainer that uses
torch.distributed for itself is not disturbed, and several collectors can live one after another
in one process.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import ipaddress
import socket
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from hpccollect.distributed.channels import RankChannel
from hpccollect.distributed.mpi_transport import MPIGroup, mpi4py_comm
from hpccollect.distributed.polled import PolledRankChannel
from hpccollect.distributed.threaded import ThreadedRankChannel
from hpccollect.errors import ArgumentValueError, CollectorTimeoutError

__all__ = ["BACKENDS", "RankGroups", "available_backends", "check_backend", "open_store"]

BACKENDS = ("gloo", "nccl", "ucc", "mpi")

#: how long a rank may stay idle in one receive (the pool's own deadlines are what bound waits;
#: a process group timeout would close the connection for good, so it must never fire first)
IDLE = datetime.timedelta(days=30)


def available_backends() -> list[str]:
    """The torch.distributed backends this torch build has."""
    if not dist.is_available():
        return []
    checks = {
        "gloo": dist.is_gloo_available,
        "nccl": dist.is_nccl_available,
        "ucc": getattr(dist, "is_ucc_available", lambda: False),
        "mpi": dist.is_mpi_available,
    }
    return [name for name in BACKENDS if checks[name]()]


def check_backend(backend: Any) -> str:
    """``backend`` if this torch build has it; otherwise an error saying what it has."""
    if backend not in BACKENDS:
        raise ArgumentValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}.")
    have = available_backends()
    if backend == "mpi" and backend not in have:
        if importlib.util.find_spec("mpi4py") is None:  # mpi4py's transport stands in
            mpi4py_comm()  # raises, saying how to install it
        return backend
    if backend not in have:
        how = {
            "nccl": "install a CUDA build of torch on a machine with NVIDIA GPUs",
            "ucc": "build torch with UCC (USE_C10D_UCC=1)",
            "mpi": "build torch from source against your MPI",
            "gloo": "use a torch build with distributed support",
        }[backend]
        raise ArgumentValueError(
            f"backend={backend!r} is not in this torch build (it has {have or 'none'}); "
            f"{how}, or use backend='gloo', which moves CPU tensors between any hosts."
        )
    if backend == "nccl":
        raise ArgumentValueError(
            "backend='nccl' is not supported by hpccollect's transport yet (its control "
            "messages need receives larger than the send, which NCCL does not allow); use "
            "backend='gloo': batches travel as CPU tensors, and each rank's policy and env may "
            "still run on its GPU (policy_device, env_device)."
        )
    return backend


def open_store(
    host: str, port: int, world_size: int, is_master: bool, timeout: float
) -> dist.TCPStore:
    """The job's rendezvous store; rank 0 hosts it (``port`` 0: a free port, race-free),
    listening on ``host`` only (torch's own store would listen on every interface)."""
    listener = None
    try:
        if is_master:
            listener = socket.create_server((host, port), backlog=4096)
            port = listener.getsockname()[1]
        store = dist.TCPStore(
            host,
            port,
            world_size,
            is_master,
            timeout=datetime.timedelta(seconds=timeout),
            wait_for_workers=False,
            master_listen_fd=None if listener is None else listener.fileno(),
        )
    except (RuntimeError, OSError) as err:
        if listener is not None:
            listener.close()
        if is_master:
            raise ArgumentValueError(
                f"cannot listen on {host}:{port} for the collector ranks ({err}); the port is "
                "taken or the address is not this host's: pass another tcp_port, or leave it "
                "None to take a free one."
            ) from err
        raise CollectorTimeoutError(
            f"rank could not reach rank 0 at {host}:{port} within {timeout:g} s ({err})."
        ) from err
    if listener is not None:
        listener.detach()  # the store owns the socket now
    return store


@dataclass
class RankGroups:
    """This process's place in a collector job: its rank, the store, and the process groups."""

    rank: int
    world_size: int
    backend: str
    store: Any
    messages: Any = None  # point-to-point: commands, replies, batches, weights to some ranks
    broadcast: Any = None  # weights to every rank at once
    _closed: bool = field(default=False, repr=False)

    @classmethod
    def open(cls, backend: str, store: Any, rank: int, world_size: int) -> RankGroups:
        """Join the job's groups (every rank calls this once; it returns when all have)."""
        groups = cls(rank, world_size, backend, store)
        for name in ("messages", "broadcast"):
            prefixed = dist.PrefixStore(f"hpccollect/{name}", store)
            setattr(groups, name, _group(backend, prefixed, rank, world_size, name))
        return groups

    def channel(
        self, peer: int, *, process: Any = None, device: Any = "cpu", send_timeout: float = 600.0
    ) -> RankChannel:
        """This process's end of the link with rank ``peer`` (see ``RankChannel`` for the
        arguments): polled where the messages group can be polled (the mpi4py transport),
        otherwise with a thread that blocks in each receive."""
        kind = (
            PolledRankChannel if getattr(self.messages, "can_poll", False) else ThreadedRankChannel
        )
        return kind(self, peer, process=process, device=device, send_timeout=send_timeout)

    def close(self) -> None:
        """Abort both groups (ends receives still pending on them) and release the store."""
        if self._closed:
            return
        self._closed = True
        for group in (self.messages, self.broadcast):
            if group is not None:
                with contextlib.suppress(Exception):
                    group.abort()
        self.messages = self.broadcast = self.store = None


def _group(backend: str, store: Any, rank: int, world_size: int, name: str) -> Any:
    if backend == "gloo":
        options = dist.ProcessGroupGloo._Options()
        options._timeout = IDLE
        options._devices = [_gloo_device(store)]
        return dist.ProcessGroupGloo(store, rank, world_size, options)
    if backend == "ucc":
        return dist.ProcessGroupUCC(store, rank, world_size, IDLE)
    if dist.is_mpi_available():
        return dist.ProcessGroupMPI.create(list(range(world_size)))
    comm = mpi4py_comm()
    if comm.Get_size() != world_size or comm.Get_rank() != rank:
        raise ArgumentValueError(
            f"backend='mpi' needs rank {rank} of a {world_size}-process MPI job, but this "
            f"process is rank {comm.Get_rank()} of {comm.Get_size()}: start every rank with "
            f"mpiexec -n {world_size} and pass launcher='mpi'."
        )
    return MPIGroup(comm, f"hpccollect-{name}")


def _gloo_device(store: Any) -> Any:
    """Gloo's listening device: loopback when rank 0 is reached on loopback (one node: nothing
    listens on other interfaces), else torch's default (``GLOO_SOCKET_IFNAME`` applies)."""
    host = getattr(getattr(store, "underlying_store", store), "host", "")
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).is_loopback:
            return dist.ProcessGroupGloo.create_device(hostname=host)
    return dist.ProcessGroupGloo.create_default_device()
