"""``backend="mpi"`` through mpi4py, for torch builds without an MPI backend (the PyPI wheels):
``base.ProcessGroup``'s calls over ``Isend``/``Irecv`` of the buffers themselves and ``Ibcast``.

Waits never block inside MPI: MPICH's blocking calls spin a core, which a rank 0 sharing a node
with its ranks would steal from them. An idle wait probes, then sleeps (``base.wait_request``);
it ends early when the group is closed, the peer's control link went silent (``watch``) or the
peer said goodbye: MPI cannot close a connection as a dying gloo peer does, so a closing end
sends every peer a goodbye, and rank 0 learns which ranks did not stop.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hpccollect._exit import end_job_at_exit, unlink_node_segment, when_transports_close
from hpccollect.errors import ArgumentValueError
from hpccollect.transport.base import IDLE_SLEEP, SPIN, wait_request

__all__ = ["MPIGroup", "mpi4py_comm", "quiesce"]

_SPIN_PER_BYTE = 2e-9  # a transfer under way spins for as long as its bytes take, too
_BYE = 32767  # the tag of the goodbye message (below MPI's guaranteed tag upper bound)
_GRACE = 2.0  # seconds a closing end waits for its peers' goodbyes, then for its own to leave
_GROUPS: weakref.WeakSet = weakref.WeakSet()  # this process's open groups


def mpi4py_comm(one_node: bool = False) -> Any:
    """``MPI.COMM_WORLD`` from mpi4py, checked to allow calls from several threads.

    Args:
        one_node: every rank of the job runs on this node: where MPI is not initialised yet,
            each MPI is kept off the network (``_LOOPBACK``).
    """
    if one_node and "mpi4py.MPI" not in sys.modules:
        for name, value in _LOOPBACK.items():
            os.environ.setdefault(name, value)
    try:
        from mpi4py import MPI
    except ImportError as err:
        raise ArgumentValueError(
            "backend='mpi' and launcher='mpi' need mpi4py and an MPI library: "
            "pip install 'hpccollect[mpi]' (mpi4py and the mpich package), or use "
            "launcher='mp' with backend='gloo'."
        ) from err
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise ArgumentValueError(
            "MPI was initialised without MPI_THREAD_MULTIPLE, which hpccollect's MPI transport "
            "needs; do not set mpi4py.rc.threads = False or initialise MPI yourself with a "
            "lower thread level."
        )
    unlink_node_segment()
    return MPI.COMM_WORLD


def quiesce(timeout: float = 2.0) -> None:
    """Close every ``MPIGroup`` of this process and wait (bounded) until no thread is inside
    one, before ``MPI_Finalize``: it can crash the job while another thread calls MPI."""
    groups = list(_GROUPS)
    for group in groups:
        group.abort()
    deadline = time.monotonic() + timeout
    while any(g.calls for g in groups) and time.monotonic() < deadline:
        time.sleep(1e-3)


when_transports_close(quiesce)


#: keeps each MPI off the network where all ranks share one node (each set where unset): UCX
#: (MPICH's) and Intel MPI's libfabric TCP on loopback, Open MPI without TCP (it listens on
#: every address whatever its interface; shared memory carries it all)
_LOOPBACK = {"UCX_NET_DEVICES": "lo", "OMPI_MCA_btl": "^tcp", "FI_TCP_IFACE": "lo"}


class _Work:
    """One operation, waited on like a torch ``Work``. A receive is posted once its message
    arrived (``_arrived``); then the wait tests without sleeping for as long as the bytes take,
    as a large message moves only while both ends are inside MPI."""

    verb = "an operation with"

    def __init__(self, group: MPIGroup, peer: int | None, buffer: Any) -> None:
        self.group, self.peer = group, peer
        self.buffer = buffer  # MPI reads or writes it until the request completes
        self.request: Any = None

    def what(self) -> str:
        return f"{self.verb} rank {self.group.world_ranks[self.peer]}"

    def _arrived(self) -> bool:
        return True

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        with self.group.inside:
            return self._wait(None if timeout is None else timeout.total_seconds())

    def is_completed(self) -> bool:
        """Whether it is done, without blocking (a receive not yet posted is not)."""
        with self.group.inside:
            return self.request is not None and bool(self.request.Test())

    def _wait(self, seconds: float | None) -> bool:
        group = self.group
        try:
            if self.request is None:
                if not self._arrived():
                    wait_request(self._arrived, seconds, self.what, self._stop, group.max_sleep)
                self.request = self._post()
            request = self.request
            if not request.Test():
                spin = SPIN + self.buffer.nbytes * _SPIN_PER_BYTE
                wait_request(request.Test, seconds, self.what, self._stop, group.max_sleep, spin)
        except BaseException:
            if self.request is not None:
                group.cancel(self.request)
            raise
        return True

    def _stop(self) -> str | None:
        return self.group.stopped(self.peer)


class _Send(_Work):
    verb = "a send to"

    def __init__(self, group: MPIGroup, buffer: Any, peer: int, tag: int) -> None:
        super().__init__(group, peer, buffer)
        self.request = group.comm.Isend(buffer, peer, tag)


class _Receive(_Work):
    verb = "a receive from"

    def __init__(self, group: MPIGroup, buffer: Any, peer: int, tag: int) -> None:
        super().__init__(group, peer, buffer)
        self.tag, self.message = tag, None  # posted once probed: ``_arrived``

    def _arrived(self) -> bool:
        if self.message is None:  # a second probe would match the message after this one
            self.message = self.group.comm.Improbe(self.peer, self.tag)
        return self.message is not None

    def _post(self) -> Any:
        return self.message.Irecv(self.buffer)


class _Broadcast(_Work):
    """``Ibcast`` from ``root``, posted at once: a peer joins it once the root announced it."""

    verb = "a broadcast from"

    def __init__(self, group: MPIGroup, buffer: Any, root: int) -> None:
        super().__init__(group, root, buffer)
        self.request = group.comm.Ibcast(buffer, root)

    def _stop(self) -> str | None:
        return self.group.stopped(None if self.group.rank == self.peer else self.peer)


def _world_ranks(comm: Any) -> list[int]:
    """The rank in ``MPI.COMM_WORLD`` of each member of ``comm``."""
    from mpi4py import MPI

    members = list(range(comm.Get_size()))
    return list(comm.Get_group().Translate_ranks(members, MPI.COMM_WORLD.Get_group()))


class MPIGroup:
    """A private duplicate of ``comm`` with the process-group calls the data plane needs.

    Attributes:
        progresses_alone: False: a message moves only while both ends are inside MPI (a receive
            posted and left does not take it), so a transfer is announced first and received
            as it comes (``RankChannel._send_batch``).
    """

    progresses_alone = False

    def __init__(self, comm: Any, name: str, max_sleep: float = IDLE_SLEEP) -> None:
        self.comm = comm.Dup()
        self.comm.Set_name(name)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.max_sleep = max_sleep
        self._closed: str | None = None
        self._gone: dict[int, str] = {}  # peers that said goodbye
        self._watches: dict[int, Callable[[], str | None]] = {}  # see ``watch``
        self._lock = threading.Lock()  # one thread at a time takes a goodbye
        #: one entry per call inside the group, of any thread: a counter without a lock
        #: (``append``/``pop`` are atomic), which ``quiesce`` waits to empty
        self.calls: list[None] = []
        #: ``with group.inside:`` counts this thread as using MPI through the group
        self.inside = _Inside(self.calls)
        self._arrays: dict[int, tuple[torch.Tensor, Any]] = {}  # see ``_buffer``
        #: each member's rank in the MPI job, for messages (a gathered job's group numbers from 0)
        self.world_ranks = _world_ranks(self.comm)
        _GROUPS.add(self)

    def send(self, tensors: Sequence[torch.Tensor], peer: int, tag: int) -> _Work:
        with self.inside:
            self._check_open(peer)
            return _Send(self, self._buffer(tensors), peer, tag)

    def recv(self, tensors: Sequence[torch.Tensor], peer: int, tag: int) -> _Work:
        self._check_open(peer)
        return _Receive(self, self._buffer(tensors), peer, tag)

    def broadcast(self, tensor: torch.Tensor | Sequence[torch.Tensor], root: int) -> _Work:
        with self.inside:
            self._check_open(None)
            return _Broadcast(self, self._buffer(tensor), root)

    def watch(self, peer: int, check: Callable[[], str | None]) -> None:
        """End waits involving ``peer`` when ``check()`` gives a reason (it went silent)."""
        self._watches[peer] = check

    def stopped(self, peer: int | None) -> str | None:
        """Why waits involving ``peer`` (None: any) must end, or None."""
        if self._closed is not None:
            return self._closed
        if peer is None:
            return None
        check = self._watches.get(peer)
        why = None if check is None else check()
        if why is not None:
            return why
        with self._lock:
            if peer not in self._gone and self.comm.Iprobe(peer, _BYE):
                self.comm.Recv(bytearray(1), peer, _BYE)
                self._gone[peer] = f"rank {self.world_ranks[peer]} closed its end of the connection"
        return self._gone.get(peer)

    def cancel(self, request: Any) -> None:
        """Withdraw a request whose wait ended early (a receive that never matched)."""
        with contextlib.suppress(Exception):  # a request that completed meanwhile needs nothing
            if not request.Test():
                request.Cancel()

    def abort(self) -> None:
        """Close this end: pending waits end, and the peers are told (bounded, best effort).

        On rank 0, a collector rank that has not closed its end within a moment did not stop;
        MPI cannot end one rank and ``MPI_Finalize`` would wait for it forever, so the job is
        aborted when this process exits (after it has saved what it holds)."""
        if self._closed is not None:
            return
        peers = [p for p in range(self.size) if p != self.rank] if self.rank == 0 else [0]
        deadline = time.monotonic() + _GRACE
        while self.rank == 0 and time.monotonic() < deadline:
            if all(self.stopped(p) for p in peers):
                break
            time.sleep(2e-3)
        stuck = [p for p in peers if self.rank == 0 and not self.stopped(p)]
        self._closed = "the connection was closed"
        requests = [self.comm.Isend(bytearray(1), p, _BYE) for p in peers if p not in self._gone]
        while not all(r.Test() for r in requests) and time.monotonic() < deadline + _GRACE:
            time.sleep(1e-3)
        if stuck:  # named by their numbers in the job (a gathered job's group is not all of it)
            end_job_at_exit([self.world_ranks[p] for p in stuck], lost=False)

    def _buffer(self, tensors: torch.Tensor | Sequence[torch.Tensor]) -> Any:
        """The tensor's memory as an array MPI reads or writes in place (CPU tensors only),
        cached for the last few tensors: a channel moves the same buffers again and again."""
        tensor = tensors if isinstance(tensors, torch.Tensor) else tensors[0]
        known = self._arrays.get(id(tensor))
        if known is not None and known[0] is tensor:
            return known[1]
        if not tensor.is_contiguous():
            raise ValueError("the MPI transport moves contiguous tensors only")
        if len(self._arrays) >= 8:
            self._arrays.clear()
        array = self._arrays[id(tensor)] = (tensor, tensor.numpy())
        return array[1]

    def _check_open(self, peer: int | None) -> None:
        """Refuse a new operation once closed, or with a peer known to be gone (a goodbye not
        seen yet ends the operation's wait)."""
        why = self._closed or self._gone.get(peer)  # type: ignore[arg-type]
        if why is not None:
            raise RuntimeError(why)


class _Inside:
    """The context that counts a thread inside one group, in its ``calls``."""

    __slots__ = ("calls",)

    def __init__(self, calls: list[None]) -> None:
        self.calls = calls

    def __enter__(self) -> None:
        self.calls.append(None)

    def __exit__(self, *_: object) -> None:
        self.calls.pop()
