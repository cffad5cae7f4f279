"""Notices: how rank 0 learns, without a thread per rank, that a message from a collector rank
has come over a process group whose receives cannot be polled (gloo).

A gloo receive is seen complete only by a thread that waits in it, and such a wait cannot be
cut short (``receiver.py``). So rank 0 keeps one receive posted for each collector rank and
waits in none of them until it knows the message is there: each collector rank, once rank 0
has taken the head of a message it sent (its send completed into rank 0's posted receive),
writes one byte on a TCP connection of its own to rank 0. Rank 0 watches every such connection
in one ``epoll`` (``NoticeBoard``), whose descriptor the collecting thread waits on beside the
launcher's processes, as it waited on the receiving threads' doorbell before. A byte read means
"wait in this link's receive: it completes at once"; a connection that closes means the rank's
process ended (it is seen at once, as a receiving thread saw it).

Rank 0 then runs no thread per rank: at 2 ranks and at 10,000 it runs its collecting thread,
the pulse (``pulse.py``, which also takes the heartbeats' answers while the collecting thread
is busy elsewhere) and gloo's own. It holds one connection per rank beside gloo's.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from typing import Any

from hpccollect.errors import CollectorTimeoutError
from hpccollect.transport.doorbell import Doorbell

__all__ = ["KEY", "NoticeBoard", "Notifier"]

#: the store key under which rank 0 publishes the port its notices arrive on
KEY = "hpccollect/notices"
_HELLO = struct.Struct("<i")  # a connection's first bytes: the rank it comes from
_NOTICE = b"\x01"


class NoticeBoard:
    """Rank 0's end of the notices (see the module). It is the process's doorbell for the rank
    links (``fileno``, ``ring``, ``clear``, ``close``, as ``Doorbell``), and their receiver
    (``add``, ``drain``, as ``Receiver``): ``clear`` takes in every message whose notice came.

    Args:
        host: the address rank 0's store listens on, which every rank reaches.
    """

    def __init__(self, host: str) -> None:
        self._listener = socket.create_server((host, 0), backlog=4096)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._rings = Doorbell()  # rung by other threads that hand a message over
        self._epoll = select.epoll()
        self._epoll.register(self._listener.fileno(), select.EPOLLIN)
        self._epoll.register(self._rings.fileno(), select.EPOLLIN)
        self._links: dict[int, Any] = {}  # by rank
        self._conns: dict[int, _Conn] = {}  # by descriptor
        self._ended: set[int] = set()  # ranks whose connection closed before their link came
        self._lock = threading.Lock()  # one thread takes messages in at a time
        self._quiet: int | None = None  # the thread in ``clear``: its hand-overs ring nothing
        self._open = True
        self.bell = self

    # ------------------------------------------------------------------ the receiver
    def add(self, channel: Any) -> None:
        """Take ``channel``'s messages in from now on (posts its first receive)."""
        with self._lock:
            self._links[channel.peer] = channel
            ended = channel.peer in self._ended
        channel.expect()
        if ended:
            channel.notice_line_closed()

    def drain(self) -> None:
        """Take in what came, from a thread that does not wait on the bell (the pulse): rings
        for what it hands over. Skipped while another thread takes messages in."""
        if self._lock.acquire(blocking=False):
            try:
                self._take_in()
            finally:
                self._lock.release()

    # ------------------------------------------------------------------ the bell
    def fileno(self) -> int:
        return self._epoll.fileno()

    def ring(self) -> None:
        """Wake the waiter (a no-op from the thread taking messages in for it, or once
        closed)."""
        if self._quiet != threading.get_ident():
            self._rings.ring()

    def clear(self) -> None:
        """Take in every message whose notice came, and every ring so far (the caller looks
        at the inboxes next)."""
        with self._lock:
            self._quiet = threading.get_ident()
            try:
                self._take_in()
            finally:
                self._quiet = None

    def close(self) -> None:
        """Once the groups are aborted: drop the links' posted receives, and close every
        connection and the listener; idempotent."""
        with self._lock:
            if not self._open:
                return
            self._open = False
            for link in self._links.values():
                link.unexpect()  # its posted receive holds gloo's context, and the store with it
            self._links.clear()
            for conn in self._conns.values():
                conn.sock.close()
            self._conns.clear()
            self._listener.close()
            self._epoll.close()
            self._rings.close()

    # ------------------------------------------------------------------ taking in
    def _take_in(self) -> None:
        if not self._open:
            return
        for fd, _ in self._epoll.poll(0):
            if fd == self._rings.fileno():
                self._rings.clear()
            elif fd == self._listener.fileno():
                self._accept()
            else:
                conn = self._conns.get(fd)
                if conn is not None:
                    self._read(fd, conn)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            self._conns[sock.fileno()] = _Conn(sock)
            self._epoll.register(sock.fileno(), select.EPOLLIN)

    def _read(self, fd: int, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        closed = not data  # the rank's process ended (or it closed its groups)
        if conn.rank is None and data:
            conn.hello += data
            if len(conn.hello) < _HELLO.size:
                return
            conn.rank = _HELLO.unpack_from(conn.hello)[0]
            data = bytes(conn.hello[_HELLO.size :])
        link = None if conn.rank is None else self._links.get(conn.rank)
        for _ in range(len(data) if link is not None else 0):
            if not link.noticed():  # the link ended: nothing more comes on it
                self._links.pop(conn.rank, None)
                link = None
                break
        if not closed:
            return
        self._epoll.unregister(fd)
        conn.sock.close()
        del self._conns[fd]
        if conn.rank is None:
            return
        if link is not None:
            self._links.pop(conn.rank, None)
            link.notice_line_closed()
        elif conn.rank not in self._links:
            self._ended.add(conn.rank)


class _Conn:
    """One rank's notice connection, as rank 0 holds it."""

    __slots__ = ("hello", "rank", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rank: int | None = None
        self.hello = bytearray()


class Notifier:
    """A collector rank's end of the notices: ``tell`` rank 0 that it took a message's head.

    Args:
        host: rank 0's address (its store's).
        port: the port rank 0 published under ``KEY``.
        rank: this rank.
        timeout: seconds to connect, and for a notice to be taken (it never waits in practice:
            rank 0 reads every byte, and at most one per message is ever unread).
    """

    def __init__(self, host: str, port: int, rank: int, timeout: float) -> None:
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout)
            self._sock.sendall(_HELLO.pack(rank))
        except OSError as err:
            raise CollectorTimeoutError(
                f"rank {rank} could not open its notice connection to rank 0 at "
                f"{host}:{port} ({err})."
            ) from err
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._lock = threading.Lock()  # the collecting thread and the beats' answers tell

    def tell(self) -> None:
        """Rank 0 took the head of a message this rank sent; ``ConnectionError`` when rank 0
        is gone."""
        try:
            with self._lock:
                self._sock.sendall(_NOTICE)
        except OSError as err:
            raise ConnectionError(f"rank 0's notice connection closed ({err})") from err

    def close(self) -> None:
        """Close the connection (rank 0 sees it close); idempotent."""
        with contextlib.suppress(OSError):
            self._sock.close()
