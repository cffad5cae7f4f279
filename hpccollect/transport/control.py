"""The control plane (``rank_channel.py``): one TCP connection between rank 0 (or a node's
gatherer) and each collector rank, framed. A plain socket, because the kernel closes it when a
process dies (whatever the MPI or the launcher), ``select`` watches thousands of them beside pipes
and process sentinels, and a frame is read only once it is there.

A frame is ``FRAME`` (the length of the rest, the kind, a value, the sender's weights version,
the bytes announced on the data plane) and its payload. A connection opens with ``HELLO`` (the
rank and the job's token), so only the job's ranks are accepted. ``Beats`` (one thread per
process) sends the heartbeats; ``Link.silence`` tells a peer silent past the liveness timeout (a
stopped process, a node cut off), never holding a pause of this process against it.
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Collection
from typing import NamedTuple

from hpccollect.errors import ArgumentValueError, CollectorTimeoutError

__all__ = [
    "BEAT",
    "BEATS",
    "DEFAULT_LIVENESS_TIMEOUT",
    "FRAME",
    "Beats",
    "ControlListener",
    "Frame",
    "Link",
    "beat_interval",
    "connect",
]

#: the length of the rest (little-endian u32), kind (i16), value, version, data bytes (i64 each)
FRAME = struct.Struct("<Ihqqq")
_REST = FRAME.size - 4
HELLO = struct.Struct("<i16s")  # a connection's first bytes: the rank, the job's token
BEAT = -1  # the kind of a heartbeat frame (protocol kinds are >= 0)
DEFAULT_LIVENESS_TIMEOUT = 30.0
_MAX_PAYLOAD = 1 << 31
_MAX_INTERVAL = 5.0


def beat_interval(timeout: float) -> float:
    """s between beats: six fit in ``timeout``, so a few late ones never count as silence."""
    return min(_MAX_INTERVAL, timeout / 6)


class Frame(NamedTuple):
    """One control message as it travelled."""

    kind: int
    value: int = 0
    version: int = 0
    data: int = 0  # bytes of the transfer that follows on the data plane
    payload: bytes = b""


class Link:
    """One end of a control connection: framed sends and reads, and when the peer was last heard.

    Args:
        sock: the connected socket (the link owns it).
        timeout: the liveness timeout in s (None: the peer is never counted silent).
        read_timeout: s a frame whose first bytes came may take to arrive whole.
    """

    def __init__(
        self, sock: socket.socket, timeout: float | None = None, read_timeout: float = 60.0
    ) -> None:
        sock.setblocking(True)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.timeout = timeout
        self.heard = self.sent = time.monotonic()
        self._read_timeout = read_timeout
        self._send_lock = threading.Lock()
        self._closed = False
        self._beats: Beats | None = None

    def fileno(self) -> int:
        """The socket's descriptor, for ``select`` (readable: a frame, or the peer's end)."""
        return self.sock.fileno()

    def send(self, frame: Frame) -> None:
        """Send ``frame`` whole; ``ConnectionError`` when the peer is gone."""
        if len(frame.payload) >= _MAX_PAYLOAD:
            raise ValueError(f"a control message of {len(frame.payload)} bytes is too large")
        data = _pack(frame)
        with self._send_lock:
            try:
                self.sock.sendall(data)
            except OSError as err:
                raise ConnectionError(f"its control connection closed ({err})") from err
            self.sent = time.monotonic()

    def beat(self) -> None:
        """Send a heartbeat unless a frame is being sent (it tells the same) or the socket
        cannot take one now (the peer stopped reading: its own silence tells)."""
        if not self._send_lock.acquire(blocking=False):
            return
        try:
            # writable: room for far more than one frame, so the beat never blocks the thread
            if not select.select([], [self.sock], [], 0)[1]:
                return
            self.sock.sendall(_BEAT_BYTES)
            self.sent = time.monotonic()
        except (OSError, ValueError):  # closed: the link's owner sees it
            pass
        finally:
            self._send_lock.release()

    def ready(self, timeout: float = 0.0) -> bool:
        """Whether a frame (or the peer's end) can be read within ``timeout`` s."""
        if self._closed:
            return True
        return bool(select.select([self.sock], [], [], max(0.0, timeout))[0])

    def ended(self) -> bool:
        """Whether the peer closed the connection (a look: what came before stays to be read)."""
        if self._closed:
            return True
        try:
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    def take(self) -> Frame:
        """The next frame (heartbeats too), blocking; ``ConnectionError`` once the link ended."""
        head = self._read(FRAME.size, first=True)
        length, kind, value, version, data = FRAME.unpack(head)
        payload = self._read(length - _REST) if length > _REST else b""
        self.heard = time.monotonic()
        return Frame(kind, value, version, data, payload)

    def _read(self, n: int, first: bool = False) -> bytes:
        """Exactly ``n`` bytes, waiting ``read_timeout`` s at most for each part past a frame's
        first bytes (a peer stopped mid-frame fails the link)."""
        if self._closed:
            raise ConnectionError("the control connection is closed")
        out = bytearray()
        sock = self.sock
        while len(out) < n:
            waits = bool(out) or not first  # the first bytes: the caller waits for them
            if waits and not select.select([sock], [], [], self._read_timeout)[0]:
                raise ConnectionError(
                    f"sent part of a control message and then nothing for {self._read_timeout:g} s"
                )
            try:
                chunk = sock.recv(n - len(out))
            except OSError as err:
                raise ConnectionError(f"its control connection closed ({err})") from err
            if not chunk:
                raise ConnectionError("closed its control connection (its process ended)")
            out += chunk
        return bytes(out)

    def silence(self) -> str | None:
        """Why the peer counts as lost though its connection is open (silent past the liveness
        timeout), or None; None too while this process cannot tell (it was paused itself)."""
        if self.timeout is None or self._closed:
            return None
        beats = self._beats
        now = time.monotonic()
        if beats is None or beats.paused(now):
            return None
        quiet = now - max(self.heard, beats.resumed)
        limit = self.timeout - min(4.0, self.timeout / 4)
        if quiet <= limit:
            return None
        return (
            f"has sent nothing, not even a heartbeat, for {quiet:.0f} s "
            f"(liveness_timeout={self.timeout:g} s)"
        )

    def close(self) -> None:
        """Close the connection (the peer sees it end); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._beats is not None:
            self._beats.remove(self)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def _pack(frame: Frame) -> bytes:
    kind, value, version, data, payload = frame
    return FRAME.pack(_REST + len(payload), kind, value, version, data) + payload


_BEAT_BYTES = _pack(Frame(BEAT))


class Beats:
    """The one thread of a process that sends a heartbeat on each link silent for
    ``beat_interval`` s, and tells when this process was paused (stopped, or starved of the
    interpreter): the peers' silence then is not theirs."""

    def __init__(self, name: str = "hpccollect-beats") -> None:
        self.name = name
        self.resumed = time.monotonic()  # the end of this process's last pause
        self._ticked = self.resumed
        self._interval = _MAX_INTERVAL
        self._links: set[Link] = set()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, link: Link) -> None:
        """Beat on ``link`` from now on (a link without a liveness timeout is left alone)."""
        if link.timeout is None:
            return
        with self._changed:
            link._beats = self
            self._links.add(link)
            self._interval = min(beat_interval(x.timeout or _MAX_INTERVAL) for x in self._links)
            if self._thread is None:
                self._ticked = self.resumed = time.monotonic()
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._changed.notify()

    def remove(self, link: Link) -> None:
        """Stop beating on ``link`` (the thread ends with the last link)."""
        with self._changed:
            self._links.discard(link)
            self._changed.notify()

    def paused(self, now: float) -> bool:
        """Whether this process has not run its beats for a while (it was paused)."""
        return now - self._ticked > 2 * self._interval + 1.0

    def _run(self) -> None:
        with self._changed:
            while self._links:
                now = time.monotonic()
                if self.paused(now):
                    self.resumed = now  # a fresh window for every peer
                self._ticked = now
                for link in list(self._links):
                    if now - link.sent >= self._interval * 0.9:
                        link.beat()
                self._changed.wait(self._interval)
            self._thread = None


BEATS = Beats()  # this process's one


def connect(
    address: tuple[str, int], rank: int, token: bytes, timeout: float, liveness: float | None
) -> Link:
    """A collector rank's control connection to rank 0 at ``address``.

    Args:
        address: where rank 0's ``ControlListener`` listens.
        rank: this rank.
        token: the job's token (rank 0 handed it through the launcher).
        timeout: s to connect.
        liveness: the liveness timeout (None: none).

    Raises:
        CollectorTimeoutError: rank 0 could not be reached within ``timeout`` s.
    """
    try:
        sock = socket.create_connection(address, timeout=timeout)
        sock.sendall(HELLO.pack(rank, token))
    except OSError as err:
        raise CollectorTimeoutError(
            f"rank {rank} could not reach rank 0's control connection at "
            f"{address[0]}:{address[1]} within {timeout:g} s ({err})."
        ) from err
    return Link(sock, liveness)


class ControlListener:
    """Rank 0's side of the control connections: it listens on ``host`` and accepts each
    collector rank's connection, checking its rank and the job's token.

    Args:
        host: the address every collector rank reaches rank 0 at.
        port: the port (0: a free one).

    Raises:
        ArgumentValueError: ``host`` is not an address of this host.
    """

    def __init__(self, host: str, port: int = 0) -> None:
        try:
            self._sock = socket.create_server((host, port), backlog=4096)
        except OSError as err:
            raise ArgumentValueError(
                f"cannot listen on {host} for the collector ranks' control connections "
                f"({err.strerror or err}); the address is not this host's: pass master_addr= "
                "(--master-addr) or interface= (--interface) for an address of this host that "
                "the ranks reach."
            ) from err
        self._sock.setblocking(False)
        self.address: tuple[str, int] = (host, self._sock.getsockname()[1])
        self.token = secrets.token_bytes(HELLO.size - 4)
        self._hellos: dict[socket.socket, bytearray] = {}

    def accept(
        self,
        ranks: Collection[int],
        timeout: float,
        liveness: float | None = None,
        watch: Callable[[set[int]], None] | None = None,
        late: Callable[[list[int]], BaseException] | None = None,
    ) -> dict[int, Link]:
        """The control link of each of ``ranks``, once each has connected.

        Args:
            ranks: the ranks expected.
            timeout: s to wait for all of them.
            liveness: their links' liveness timeout.
            watch: called with the ranks still awaited between looks (a launcher's check that
                raises for a rank whose process ended).
            late: makes the error raised for the ranks that did not connect in time.

        Raises:
            CollectorTimeoutError: some ranks did not connect within ``timeout`` s.
        """
        waiting = set(ranks)
        links: dict[int, Link] = {}
        deadline = time.monotonic() + timeout
        try:
            while waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    if late is not None:
                        raise late(sorted(waiting))
                    raise CollectorTimeoutError(
                        f"collector ranks {sorted(waiting)} did not connect to rank 0 at "
                        f"{self.address[0]}:{self.address[1]} within {timeout:g} s."
                    )
                readable, _, _ = select.select([self._sock, *self._hellos], [], [], min(left, 0.05))
                for sock in readable:
                    if sock is self._sock:
                        self._take_new()
                    else:
                        rank = self._hello(sock, waiting)
                        if rank is not None:
                            links[rank] = Link(sock, liveness)
                            waiting.discard(rank)
                if watch is not None and waiting:
                    watch(waiting)
        except BaseException:
            for link in links.values():
                link.close()
            raise
        return links

    def _take_new(self) -> None:
        while True:
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            self._hellos[sock] = bytearray()

    def _hello(self, sock: socket.socket, waiting: set[int]) -> int | None:
        """Read what came of ``sock``'s hello; its rank once whole and valid (a stranger, a
        rank not awaited or a wrong token is dropped)."""
        got = self._hellos[sock]
        try:
            chunk = sock.recv(HELLO.size - len(got))
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            chunk = b""
        got += chunk
        if chunk and len(got) < HELLO.size:
            return None
        del self._hellos[sock]
        if chunk:
            rank, token = HELLO.unpack(bytes(got))
            if rank in waiting and hmac.compare_digest(token, self.token):
                return rank
        sock.close()
        return None

    def close(self) -> None:
        """Stop listening (the links accepted stay open); idempotent."""
        for sock in self._hellos:
            sock.close()
        self._hellos.clear()
        self._sock.close()
