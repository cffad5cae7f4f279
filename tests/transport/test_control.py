"""The control plane (``transport/control.py``): real sockets, real rank processes that connect,
beat, die and stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from hpccollect.errors import ArgumentValueError, CollectorTimeoutError
from hpccollect.transport.control import (
    BEAT,
    HELLO,
    Beats,
    ControlListener,
    Frame,
    Link,
    connect,
)

pytestmark = pytest.mark.timeout(60)

#: a collector rank that connects, beats every 0.2 s (liveness 1.2 s) and sends one frame
RANK = """
import sys, time
from hpccollect.transport.control import BEATS, Frame, connect
host, port, rank, token = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), bytes.fromhex(sys.argv[4])
link = connect((host, port), rank, token, 10.0, 1.2)
BEATS.add(link)
link.send(Frame(7, value=rank, payload=b"hello from %d" % rank))
time.sleep(60)
"""


def _rank(listener: ControlListener, rank: int, token: bytes | None = None) -> subprocess.Popen:
    host, port = listener.address
    token = listener.token if token is None else token
    return subprocess.Popen(
        [sys.executable, "-c", RANK, host, str(port), str(rank), token.hex()],
        stderr=subprocess.DEVNULL,
    )


def _end(*processes: subprocess.Popen) -> None:
    for process in processes:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)
            process.kill()
        process.wait(10)


def _first_message(link: Link) -> Frame:
    while True:
        frame = link.take()
        if frame.kind != BEAT:
            return frame


def test_frames_cross_whole_and_in_order_with_their_header_and_payload():
    listener = ControlListener("127.0.0.1")
    rank_end = connect(listener.address, 1, listener.token, 5.0, None)
    links = listener.accept([1], 5.0)
    rank0_end = links[1]
    big = os.urandom(3 << 20)  # more than both sockets' buffers: the send and reads interleave
    sender = threading.Thread(
        target=lambda: [rank_end.send(Frame(3, 5, 2, 1024, big)), rank_end.send(Frame(4, -1))]
    )
    sender.start()
    assert rank0_end.ready(5.0)
    assert rank0_end.take() == Frame(3, 5, 2, 1024, big)
    assert rank0_end.take() == Frame(4, -1, 0, 0, b"")
    sender.join(5)
    rank0_end.send(Frame(9, payload=b"x"))
    assert rank_end.take() == Frame(9, payload=b"x")
    rank_end.send(Frame(5))
    assert rank0_end.ready(5.0) and not rank0_end.ended()  # a frame, not the end
    rank_end.close()
    assert rank0_end.take() == Frame(5)  # what came before the end is still read
    assert rank0_end.ready(5.0) and rank0_end.ended()
    with pytest.raises(ConnectionError, match="closed its control connection"):
        rank0_end.take()
    rank0_end.close()
    listener.close()


def test_only_the_jobs_ranks_with_its_token_are_accepted_and_missing_ones_are_named():
    listener = ControlListener("127.0.0.1")
    stranger = socket.create_connection(listener.address)
    stranger.sendall(HELLO.pack(1, b"0" * 16))  # rank 1, the wrong token
    unexpected = connect(listener.address, 5, listener.token, 5.0, None)
    good = connect(listener.address, 2, listener.token, 5.0, None)
    with pytest.raises(CollectorTimeoutError, match=r"collector ranks \[1\] did not connect"):
        listener.accept([1, 2], 1.0)
    assert stranger.recv(1) == b""  # dropped
    unexpected.sock.settimeout(5)
    assert unexpected.sock.recv(1) == b""
    stranger.close()
    for link in (unexpected, good):
        link.close()
    listener.close()


def test_an_address_of_another_host_is_refused_naming_it_and_the_fix():
    with pytest.raises(ArgumentValueError, match=r"cannot listen on 192\.0\.2\.1 .*master_addr"):
        ControlListener("192.0.2.1")  # TEST-NET-1: no host here has it


def test_a_launcher_check_ends_the_wait_for_a_rank_that_died():
    listener = ControlListener("127.0.0.1")
    seen = []

    def watch(waiting: set[int]) -> None:
        seen.append(sorted(waiting))
        raise RuntimeError("collector rank 3 exited with code 1")

    with pytest.raises(RuntimeError, match="rank 3 exited"):
        listener.accept([3], 30.0, watch=watch)
    assert seen == [[3]]
    listener.close()


@pytest.mark.timed
def test_a_rank_that_dies_is_seen_at_once_and_one_that_stops_within_its_liveness_timeout():
    listener = ControlListener("127.0.0.1")
    beats = Beats("test-beats")
    ranks = [_rank(listener, 1), _rank(listener, 2), _rank(listener, 3)]
    try:
        links = listener.accept([1, 2, 3], 30.0, liveness=1.2)
        for rank, link in links.items():
            beats.add(link)
            assert _first_message(link) == Frame(7, rank, 0, 0, b"hello from %d" % rank)
        ranks[0].kill()
        start = time.monotonic()
        assert links[1].ready(5.0)
        with pytest.raises(ConnectionError):
            while True:
                links[1].take()  # its last beats, then its end
        assert time.monotonic() - start < 1.0
        os.kill(ranks[1].pid, signal.SIGSTOP)
        stopped = time.monotonic()
        while links[2].silence() is None:
            for link in (links[2], links[3]):
                while link.ready(0):
                    link.take()
            assert links[3].silence() is None  # the live rank beats
            assert time.monotonic() - stopped < 2.0
            time.sleep(0.05)
        assert "not even a heartbeat" in links[2].silence()
        assert "liveness_timeout=1.2 s" in links[2].silence()
        # this side beats too: the rank reads them (they reach a rank's reading thread)
        assert links[3].sent > stopped
    finally:
        _end(*ranks)
        for link in links.values():
            link.close()
        listener.close()


def test_beats_go_only_on_links_that_sent_nothing_lately_and_never_block():
    listener = ControlListener("127.0.0.1")
    far = connect(listener.address, 1, listener.token, 5.0, 0.6)
    near = listener.accept([1], 5.0, liveness=0.6)[1]
    beats = Beats("test-beats")
    beats.add(near)
    far.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    time.sleep(0.5)
    assert far.ready(0) and far.take().kind == BEAT
    # the far end stops reading: beats fill nothing past the send buffer and never block
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        near.beat()
    assert beats._thread is not None and beats._thread.is_alive()
    near.close()
    far.close()
    listener.close()
    time.sleep(0.3)
    assert beats._thread is None  # it ends with its last link
