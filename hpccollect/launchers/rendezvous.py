"""Where this process stands in a job: rank, world size, local rank, and where rank 0 listens.

Each field falls back on its own down one list: explicit arguments, torchrun, MPICH/hydra and
Open MPI (``_ENV_SETS``), the mpi4py communicator when passed, an ``srun`` step; with none, rank 0
of 1 (``source="single"``). SLURM counts only inside an ``srun`` step: an ``sbatch`` script is
one process yet sees ``SLURM_PROCID`` and ``SLURM_NTASKS``, while only ``srun`` sets
``SLURM_STEP_NUM_TASKS``, the world size (``SLURM_NTASKS`` may keep the allocation's count).

``master_addr`` is never a wildcard: rank 0 binds it and the others connect to it. It is loopback
when every rank is on this node, else the address of rank 0's host. Before the groups exist,
the ranks share small pickled values over MPI (``share_from_root``, ``send_object``,
``recv_object``), waiting in sleeps: MPICH's blocking calls spin a core the node's ranks need.
"""

from __future__ import annotations

import os
import pickle
import re
import socket
import struct
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from hpccollect.errors import (
    ArgumentTypeError,
    ArgumentValueError,
    CollectorTimeoutError,
    HpcCollectError,
)
from hpccollect.transport.addresses import checked_addr, interface_address, resolve_host
from hpccollect.transport.base import wait_request

__all__ = [
    "Rendezvous",
    "detect",
    "env_port",
    "expand_nodelist",
    "launched_rank",
    "launched_ranks",
    "on_one_node",
    "recv_object",
    "send_object",
    "share_from_root",
]

_SHARE_TIMEOUT = 60.0  # seconds the ranks wait for rank 0's address in detect()
_HEAD = 1024  # bytes of share_from_root's first broadcast: small values need no second one
_FIELDS = ("rank", "world_size", "local_rank", "local_size")
_ENV_SETS = (
    ("torchrun", ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")),
    ("mpich", ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")),
    (
        "openmpi",
        tuple(f"OMPI_COMM_WORLD_{n}" for n in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE")),
    ),
)
_SLURM_VARS = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", None)

# one value and where it came from ("PMI_RANK=3"), for the error messages
_Found = tuple[int, str]


@dataclass(frozen=True)
class Rendezvous:
    """This process's place in the job, and where rank 0 listens.

    ``local_size``: None when no launcher tells; ``port``: None when nothing fixes it (rank 0
    picks a free one). ``source``: what gave the rank (``"explicit"``, ``"torchrun"``,
    ``"mpich"``, ``"openmpi"``, ``"mpi4py"``, ``"slurm"`` or ``"single"``).
    """

    rank: int
    world_size: int
    local_rank: int
    local_size: int | None
    master_addr: str
    port: int | None
    source: str

    @property
    def is_master(self) -> bool:
        """Whether this process is rank 0."""
        return self.rank == 0


def detect(
    *,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    master_addr: str | None = None,
    port: int | None = None,
    interface: str | None = None,
    environ: Mapping[str, str] | None = None,
    comm: Any = None,
) -> Rendezvous:
    """This process's ``Rendezvous`` from the arguments, ``environ`` (default ``os.environ``) and
    ``comm`` (then collective); ``ArgumentValueError`` naming a bad value."""
    environ = os.environ if environ is None else environ
    explicit = {"rank": rank, "world_size": world_size, "local_rank": local_rank}
    found, source = _ranks(explicit, environ, comm)
    rank_n, world_n = found["rank"][0], found["world_size"][0]
    local_size = found["local_size"][0] if "local_size" in found else None
    address = _master_addr(master_addr, interface, environ, rank_n, world_n, local_size, comm)
    local_rank_n = found.get("local_rank", (0, ""))[0]  # 0: as if each rank had its own node
    return Rendezvous(
        rank_n, world_n, local_rank_n, local_size, address, _port(port, environ), source
    )


def env_port(environ: Mapping[str, str] | None = None) -> int | None:
    """The port ``MASTER_PORT`` (or ``TCP_PORT``) fixes for rank 0, or None."""
    return _port(None, os.environ if environ is None else environ)


def launched_rank() -> int:
    """This process's rank as the launcher's variables say (0 without a launcher, or where they
    make no sense), so that only rank 0 reports the argument errors every rank finds."""
    try:
        return detect(master_addr="127.0.0.1").rank
    except HpcCollectError:
        return 0


def launched_ranks(environ: Mapping[str, str] | None = None) -> int:
    """How many ranks the launcher started, from its variables; 1 without a launcher."""
    environ = os.environ if environ is None else environ
    names = [names[1] for _, names in _ENV_SETS] + [_SLURM_VARS[1]]
    for name in names:
        if name is not None and name in environ:
            return _env_int(environ, name, minimum=1)[0]
    return 1


def on_one_node() -> bool:
    """Whether the launcher says every rank (two or more) runs on this node; False when unsure."""
    try:
        found = detect(master_addr="127.0.0.1")
    except HpcCollectError:
        return False
    return found.world_size > 1 and found.local_size == found.world_size


def send_object(
    comm: Any, value: Any, dest: int, tag: int, timeout: float, what: str, max_sleep: float
) -> None:
    """Send a small pickled message; wait for it with sleeps (a blocking send may spin)."""
    request = comm.isend(value, dest=dest, tag=tag)
    wait_request(lambda: request.Test(), timeout, what, max_sleep=max_sleep)


def recv_object(
    comm: Any, source: int, tag: int, timeout: float, what: str, max_sleep: float
) -> Any:
    """Receive a small pickled message, probing with sleeps (a blocking receive may spin)."""
    wait_request(lambda: comm.Iprobe(source, tag), timeout, what, max_sleep=max_sleep)
    return comm.recv(source=source, tag=tag)


def share_from_root(comm: Any, value: Any, timeout: float) -> Any:
    """Rank 0's ``value`` on every rank of ``comm`` (collective); ``CollectorTimeoutError`` after
    ``timeout`` s. Tests non-blocking broadcasts between sleeps: MPICH's blocking waits spin a
    whole core, which ranks sharing the node would miss."""
    from mpi4py import MPI

    deadline = time.monotonic() + timeout

    def wait(request: Any) -> None:
        try:
            wait_request(request.Test, max(0.0, deadline - time.monotonic()), "", max_sleep=0.02)
        except CollectorTimeoutError as err:
            raise CollectorTimeoutError(
                f"rank {comm.Get_rank()} of {comm.Get_size()} waited {timeout:g} s for rank 0 "
                "to share its value: every rank must call share_from_root (does rank 0 run?)."
            ) from err

    head = bytearray(_HEAD)
    data = b""
    if comm.Get_rank() == 0:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        first = data[: _HEAD - 8]
        head[:8] = struct.pack("<q", len(data))
        head[8 : 8 + len(first)] = first
    wait(comm.Ibcast([head, MPI.BYTE], root=0))
    size = struct.unpack("<q", head[:8])[0]
    if size <= _HEAD - 8:
        return pickle.loads(head[8 : 8 + size])
    rest = bytearray(data[_HEAD - 8 :]) if comm.Get_rank() == 0 else bytearray(size - _HEAD + 8)
    wait(comm.Ibcast([rest, MPI.BYTE], root=0))
    return pickle.loads(bytes(head[8:]) + bytes(rest))


def _ranks(
    explicit: dict[str, int | None], environ: Mapping[str, str], comm: Any
) -> tuple[dict[str, _Found], str]:
    """Each field from the first set that has it, checked; and the set that gave the rank."""
    found: dict[str, _Found] = {}
    sources: dict[str, str] = {}

    def take(source: str, values: dict[str, _Found]) -> None:
        for field, value in values.items():
            if field not in found:
                found[field], sources[field] = value, source

    take("explicit", _explicit(explicit))
    for source, names in _ENV_SETS:
        take(source, _env_set(environ, names))
    if comm is not None:
        take("mpi4py", _from_comm(comm, need_local="local_size" not in found))
    if "SLURM_STEP_NUM_TASKS" in environ:
        take("slurm", _env_set(environ, _SLURM_VARS))
    if "rank" not in found and "world_size" not in found:
        found = {field: (int(field.endswith("size")), "no launcher") for field in _FIELDS}
        sources["rank"] = "single"
    _check(found)
    return found, sources["rank"]


def _explicit(values: dict[str, int | None]) -> dict[str, _Found]:
    out: dict[str, _Found] = {}
    for field, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ArgumentTypeError(f"{field} must be an int, got {value!r}")
        out[field] = (value, f"{field}={value}")
    return out


def _env_set(environ: Mapping[str, str], names: tuple[str | None, ...]) -> dict[str, _Found]:
    return {
        field: _env_int(environ, name)
        for field, name in zip(_FIELDS, names, strict=True)
        if name is not None and name in environ
    }


def _env_int(environ: Mapping[str, str], name: str, minimum: int | None = 0) -> _Found:
    text = environ[name]
    try:
        value = int(text.strip())
    except ValueError:
        raise ArgumentValueError(
            f"{name}={text!r} is not an integer: the launcher sets it to one; unset it or fix "
            "the job script that set it."
        ) from None
    if minimum is not None and value < minimum:
        raise ArgumentValueError(f"{name}={value} must be at least {minimum}")
    return value, f"{name}={value}"


def _from_comm(comm: Any, need_local: bool) -> dict[str, _Found]:
    out = {
        "rank": (comm.Get_rank(), "comm.Get_rank()"),
        "world_size": (comm.Get_size(), "comm.Get_size()"),
    }
    if need_local:  # a collective call: every rank of a launch sees the same variables
        from mpi4py import MPI

        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            out["local_rank"] = (node.Get_rank(), "the node communicator's rank")
            out["local_size"] = (node.Get_size(), "the node communicator's size")
        finally:
            node.Free()
    return out


def _check(found: dict[str, _Found]) -> None:
    """Rank below world size, local rank below local size, all sizes positive."""
    if "world_size" not in found:
        raise ArgumentValueError(
            f"{found['rank'][1]} is set but no world size is: pass world_size= or set "
            "WORLD_SIZE (or start the job with torchrun, mpiexec or srun)."
        )
    if "rank" not in found:
        raise ArgumentValueError(
            f"{found['world_size'][1]} is set but no rank is: pass rank= or set RANK."
        )
    pairs = (("rank", "world_size"), ("local_rank", "local_size"))
    for size_field in ("world_size", "local_size"):
        if size_field in found and found[size_field][0] < 1:
            raise ArgumentValueError(f"{found[size_field][1]} must be at least 1")
    for index_field, size_field in pairs:
        if index_field not in found:
            continue
        value, label = found[index_field]
        if value < 0:
            raise ArgumentValueError(f"{label} must not be negative")
        if size_field in found and value >= found[size_field][0]:
            raise ArgumentValueError(
                f"{label} is not below {found[size_field][1]}: ranks count from 0 to the "
                "size minus one; check the launcher's variables or the arguments."
            )
    if "local_size" in found and found["local_size"][0] > found["world_size"][0]:
        raise ArgumentValueError(f"{found['local_size'][1]} is more than {found['world_size'][1]}")


def _port(port: int | None, environ: Mapping[str, str]) -> int | None:
    if port is not None:
        if isinstance(port, bool) or not isinstance(port, int):
            raise ArgumentTypeError(f"port must be an int, got {port!r}")
        value, label = port, f"port={port}"
    else:
        name = next((n for n in ("MASTER_PORT", "TCP_PORT") if n in environ), None)
        if name is None:
            return None
        value, label = _env_int(environ, name, minimum=None)
    if not 0 <= value <= 65535:
        raise ArgumentValueError(f"{label} is not a TCP port: use one in 0..65535")
    return value


def _master_addr(
    explicit: str | None,
    interface: str | None,
    environ: Mapping[str, str],
    rank: int,
    world_size: int,
    local_size: int | None,
    comm: Any,
) -> str:
    """Where rank 0 binds and the others connect; see the module docstring."""
    if explicit is not None:
        return checked_addr(explicit, "master_addr")
    if interface is not None:
        return interface_address(interface)
    if "MASTER_ADDR" in environ:
        return checked_addr(environ["MASTER_ADDR"], "MASTER_ADDR")
    if world_size == 1 or local_size == world_size or _slurm_nodes(environ) == 1:
        return "127.0.0.1"
    if comm is not None:
        return _root_address(comm, rank)
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if "SLURM_STEP_NUM_TASKS" in environ and environ.get(name):
            host = next(expand_nodelist(environ[name], name))
            return resolve_host(host, f"the first host of {name}={environ[name]!r}")
    raise ArgumentValueError(
        f"rank {rank} of {world_size}: cannot tell where rank 0 listens (no launcher says that "
        "every rank is on this node): pass master_addr= (--master-addr) or interface= "
        "(--interface), or set MASTER_ADDR."
    )


def _slurm_nodes(environ: Mapping[str, str]) -> int | None:
    if "SLURM_STEP_NUM_TASKS" not in environ:
        return None
    for name in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
        if name in environ:
            return _env_int(environ, name, minimum=1)[0]
    return None


def _root_address(comm: Any, rank: int) -> str:
    """Rank 0's host address, resolved there and shared; an error there is raised everywhere."""
    shared: tuple[str, str] = ("", "")
    if rank == 0:
        host = socket.gethostname()
        try:
            shared = ("ok", resolve_host(host, f"rank 0's host name {host!r}"))
        except ArgumentValueError as err:
            shared = ("error", str(err))
    kind, text = share_from_root(comm, shared, _SHARE_TIMEOUT)
    if kind == "error":
        raise ArgumentValueError(text)
    return text


def expand_nodelist(nodelist: str, name: str = "SLURM_JOB_NODELIST") -> Iterator[str]:
    """The host names of a SLURM host list, in order (``"node[01-02,07],gpu3"``: node01, node02,
    node07, gpu3). ``name``: the variable it came from, for the error."""
    for item in _top_level_split(nodelist, name):
        yield from _expand_item(item, nodelist, name)


def _top_level_split(nodelist: str, name: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ArgumentValueError(f"{name}={nodelist!r}: brackets do not match")
        if char == "," and depth == 0:
            items.append(nodelist[start:i])
            start = i + 1
    items.append(nodelist[start:])
    if depth or not all(item.strip() for item in items):
        raise ArgumentValueError(f"{name}={nodelist!r} is not a SLURM host list")
    return [item.strip() for item in items]


_GROUP = re.compile(r"\[([^\[\]]*)\]")


def _expand_item(item: str, nodelist: str, name: str) -> Iterator[str]:
    """``node[01-02]-ib[1,3]`` gives node01-ib1, node01-ib3, node02-ib1, node02-ib3."""
    match = _GROUP.search(item)
    if match is None:
        if "[" in item or "]" in item:
            raise ArgumentValueError(f"{name}={nodelist!r}: brackets do not match")
        yield item
        return
    head, tail = item[: match.start()], item[match.end() :]
    for part in match.group(1).split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise ArgumentValueError(
                f"{name}={nodelist!r}: {part!r} is not a number or a range like 01-04"
            )
        for number in range(int(lo), int(hi or lo) + 1):
            for rest in _expand_item(tail, nodelist, name):
                yield f"{head}{number:0{len(lo)}d}{rest}"
