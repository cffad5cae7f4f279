"""A job's data plane (``rank_channel.py``): the rendezvous store and the process groups, opened
through the registered backend; private to the collector, not torch's default group (a trainer's
own), so collectors can follow one another in a process.
"""

from __future__ import annotations

import contextlib
import datetime
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from hpccollect.errors import ArgumentValueError, CollectorTimeoutError
from hpccollect.transport.backends import backend_named
from hpccollect.transport.control import Link
from hpccollect.transport.rank_channel import RankChannel

__all__ = ["RankGroups", "open_store"]

_DROP_WAIT = 2.0  # s: how long close() waits for the aborted groups to be released


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
    """This process's place in a collector job's data plane: its rank, the store, and the
    process groups batches and weights travel on."""

    rank: int
    world_size: int
    backend: str
    store: Any
    messages: Any = None  # point-to-point: batches, weights to some ranks
    broadcast: Any = None  # weights to every rank at once (``messages`` where one_group)
    _closed: bool = field(default=False, repr=False)
    _links: list[RankChannel] = field(default_factory=list, repr=False)
    _droppers: list[threading.Thread] = field(default_factory=list, repr=False)  # see _drop

    @classmethod
    def open(
        cls, backend: str, store: Any, rank: int, world_size: int, comm: Any = None
    ) -> RankGroups:
        """Join the job's groups (every rank calls this once; it returns when all have).
        ``comm``: the MPI communicator the ranks meet in, for a backend that needs no store
        (None: ``MPI.COMM_WORLD``)."""
        groups = cls(rank, world_size, backend, store)
        chosen = backend_named(backend)
        mpi = {} if comm is None or chosen.needs_store else {"comm": comm}
        for name in ("messages",) if chosen.one_group else ("messages", "broadcast"):
            prefixed = None if store is None else dist.PrefixStore(f"hpccollect/{name}", store)
            setattr(groups, name, chosen.open_group(prefixed, rank, world_size, name, **mpi))
        if chosen.one_group:
            groups.broadcast = groups.messages
        return groups

    def channel(
        self,
        peer: int,
        link: Link,
        *,
        process: Any = None,
        device: Any = "cpu",
        send_timeout: float = 600.0,
    ) -> RankChannel:
        """This process's end of the link with rank ``peer`` over its control connection
        ``link`` (see ``RankChannel`` for the arguments)."""
        channel = RankChannel(
            self, peer, link, process=process, device=device, send_timeout=send_timeout
        )
        self._links.append(channel)
        return channel

    def _drop(self, aborted: list[Any]) -> None:
        """Release the ``aborted`` groups (held by that list alone) in a thread that ``close()``
        waits for a moment: releasing a gloo group joins gloo's threads, which a transfer cut
        short by a lost rank may hold until that rank has ended."""
        dropper = threading.Thread(target=aborted.clear, name="hpccollect-drop", daemon=True)
        self._droppers.append(dropper)
        dropper.start()

    def close(self) -> None:
        """Abort both groups (ends transfers pending on them), drop the links' posted receives,
        and release the groups (``_drop``) and the store."""
        if self._closed:
            return
        self._closed = True
        mpi = not backend_named(self.backend).needs_store
        # one group twice with a one_group backend; nothing but the list may hold a group
        # past _drop (a tuple or loop variable here would release it in this thread)
        groups = list(dict.fromkeys(g for g in (self.messages, self.broadcast) if g is not None))
        self.messages = self.broadcast = self.store = None
        _abort(groups)  # a loop here would keep the last group past _drop
        for link in self._links:  # their receives posted for batches end with the groups
            link.unexpect()
        self._links.clear()
        if mpi:
            groups.clear()  # mpi4py's: released here, in the thread that uses MPI
        else:
            self._drop(groups)
        deadline = time.monotonic() + _DROP_WAIT
        for dropper in self._droppers:  # what cannot end is left to the process's end
            dropper.join(max(0.0, deadline - time.monotonic()))


def _abort(groups: list[Any]) -> None:
    """Abort each of ``groups``, errors ignored."""
    for group in groups:
        with contextlib.suppress(Exception):
            group.abort()
