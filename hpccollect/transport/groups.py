"""The process groups of a job: the rendezvous store, and the two groups a collector job uses
(messages and batches; weight broadcasts), opened through the registered backend.

The groups are private to the collector (not torch's default group), so a trainer that uses
torch.distributed for itself is not disturbed, and several collectors can live one after another
in one process.
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
from hpccollect.transport.notices import KEY, NoticeBoard, Notifier
from hpccollect.transport.polled import PolledRankChannel
from hpccollect.transport.rank_channel import RankChannel
from hpccollect.transport.receiver import Receiver
from hpccollect.transport.waited import WaitedRankChannel

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
    """This process's place in a collector job: its rank, the store, and the process groups."""

    rank: int
    world_size: int
    backend: str
    store: Any
    messages: Any = None  # point-to-point: commands, replies, batches, weights to some ranks
    broadcast: Any = None  # weights to every rank at once
    _closed: bool = field(default=False, repr=False)
    #: a collector rank's notice connection to rank 0 (``notices.py``), where rank 0 has one
    notifier: Notifier | None = None
    _receiver: Receiver | NoticeBoard | None = field(default=None, repr=False)
    _links: list[RankChannel] = field(default_factory=list, repr=False)
    _droppers: list[threading.Thread] = field(default_factory=list, repr=False)  # see _drop

    @property
    def receiver(self) -> Receiver | NoticeBoard:
        """What receives for this process's links where the messages group cannot be polled:
        rank 0's ``NoticeBoard`` (made as the groups open), else a ``Receiver`` (made with the
        first such link)."""
        if self._receiver is None:
            self._receiver = Receiver()
        return self._receiver

    @classmethod
    def open(
        cls, backend: str, store: Any, rank: int, world_size: int, comm: Any = None
    ) -> RankGroups:
        """Join the job's groups (every rank calls this once; it returns when all have).
        ``comm``: the MPI communicator the job's ranks meet in, for a backend that needs no
        store (None: its own default, ``MPI.COMM_WORLD``)."""
        groups = cls(rank, world_size, backend, store)
        chosen = backend_named(backend)
        mpi = {} if comm is None or chosen.needs_store else {"comm": comm}
        for name in ("messages", "broadcast"):
            prefixed = None if store is None else dist.PrefixStore(f"hpccollect/{name}", store)
            setattr(groups, name, chosen.open_group(prefixed, rank, world_size, name, **mpi))
        host = getattr(store, "host", None)
        if not groups.polled and host:
            groups._open_notices(host)
        return groups

    def _open_notices(self, host: str) -> None:
        """Set up the notices (``notices.py``): rank 0 listens and publishes its port in the
        store, every other rank connects."""
        timeout = self.store.timeout.total_seconds()
        if self.rank == 0:
            self._receiver = NoticeBoard(host)
            self.store.set(KEY, str(self._receiver.port))
        else:
            self.notifier = Notifier(host, int(self.store.get(KEY)), self.rank, timeout)

    def channel(
        self, peer: int, *, process: Any = None, device: Any = "cpu", send_timeout: float = 600.0
    ) -> RankChannel:
        """This process's end of the link with rank ``peer`` (see ``RankChannel`` for the
        arguments): polled where the messages group can be polled (the mpi4py transport),
        otherwise waited in (``waited.py``: rank 0 once a rank's notice came, a collector rank
        from a thread)."""
        kind = PolledRankChannel if self.polled else WaitedRankChannel
        link = kind(self, peer, process=process, device=device, send_timeout=send_timeout)
        self._links.append(link)
        return link

    @property
    def polled(self) -> bool:
        """Whether the groups' receives can be polled (the mpi4py transport), not only waited."""
        return getattr(self.messages, "can_poll", False)

    def stop_sent(self) -> None:
        """On rank 0, once it has told every rank to stop (or lost it): no weights are
        broadcast again, so the broadcast group is aborted now. That lets each rank's thread
        waiting in the next broadcast go: over gloo, such a wait ends only from rank 0's side,
        and a rank's own abort of the group waits for it (until rank 0 kills the rank, 10 s
        into its shutdown). Groups that can be polled need none of it: there, rank 0's abort
        waits for the ranks to close their end, which they do once they have stopped."""
        if self.rank != 0 or self.broadcast is None or self.polled:
            return  # polled groups (mpi4py): a rank ends its own waits, and rank 0 sees it end
        if all(link.told_to_stop_or_lost() for link in self._links):
            aborted, self.broadcast = [self.broadcast], None
            _abort(aborted)
            self._drop(aborted)

    def _drop(self, aborted: list[Any]) -> None:
        """Release the ``aborted`` groups (the list's only holder is this call's caller) in a
        thread of their own, which ``close()`` waits for a moment: releasing a gloo group
        joins gloo's threads, and never returns where one of them cannot end. A broadcast
        cut short by a lost rank holds one until that rank has ended; a receive that was
        posted and then dropped unwaited (a Ctrl-C that came between the post and the line
        that keeps it) holds gloo's loop for good once its message comes, and the process
        hung at its exit."""
        dropper = threading.Thread(target=aborted.clear, name="hpccollect-drop", daemon=True)
        self._droppers.append(dropper)
        dropper.start()

    def close(self) -> None:
        """Abort both groups (ends receives still pending on them), drop the links' posted
        receives, and release the groups (``_drop``) and the store."""
        if self._closed:
            return
        self._closed = True
        polled = self.polled
        groups = [group for group in (self.messages, self.broadcast) if group is not None]
        # first, so that a receiving thread that takes one more message posts no new receive
        self.messages = self.broadcast = self.store = None
        _abort(groups)  # a loop here would keep the last group past _drop
        if self._receiver is not None:
            self._receiver.close()  # the posted receives go while their groups hold gloo's context
        if self.notifier is not None:
            self.notifier.close()
        if polled:
            groups.clear()  # mpi4py's: released here, in the thread that uses MPI
        else:
            self._drop(groups)
        deadline = time.monotonic() + _DROP_WAIT
        for dropper in self._droppers:  # what cannot end is left to the process's end
            dropper.join(max(0.0, deadline - time.monotonic()))


def _abort(groups: list[Any]) -> None:
    """Abort each of ``groups`` (ends what is pending on them), errors ignored."""
    for group in groups:
        with contextlib.suppress(Exception):
            group.abort()
