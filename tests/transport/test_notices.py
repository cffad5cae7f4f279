"""Rank 0's notices (``hpccollect/transport/notices.py``) over real TCP connections: each byte a
rank writes makes its link take one message in, a connection that closes ends its link, and the
board is the bell its waiters sleep on. The links here record what the board asks of them; the
collector's tests run the board with real gloo links."""

from __future__ import annotations

import threading
import time

import pytest

from hpccollect.transport.doorbell import ready
from hpccollect.transport.notices import NoticeBoard, Notifier


class Link:
    """Records the board's calls; ``messages`` is how many ``noticed`` takes before it ends."""

    def __init__(self, peer: int, messages: int = 1_000) -> None:
        self.peer, self.messages = peer, messages
        self.expected = self.noticed_count = self.closed = 0

    def expect(self) -> None:
        self.expected += 1

    def noticed(self) -> bool:
        self.noticed_count += 1
        return self.noticed_count < self.messages

    def notice_line_closed(self) -> None:
        self.closed += 1

    def unexpect(self) -> None:
        self.expected -= 1


def settle(board: NoticeBoard, until, timeout: float = 5.0) -> None:
    """Wait on the board as a collecting thread does until ``until()`` holds."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "the board never took it in"
        if ready([board], 0.1):
            board.clear()


@pytest.fixture
def board():
    board = NoticeBoard("127.0.0.1")
    yield board
    board.close()


@pytest.mark.timeout(30)
def test_each_notice_takes_one_message_in_and_a_closed_connection_ends_the_link(board):
    links = [Link(1), Link(2)]
    for link in links:
        board.add(link)
    assert [link.expected for link in links] == [1, 1]  # a receive posted for each
    tellers = [Notifier("127.0.0.1", board.port, link.peer, 5.0) for link in links]
    for _ in range(3):
        tellers[0].tell()
    tellers[1].tell()
    settle(board, lambda: links[0].noticed_count == 3 and links[1].noticed_count == 1)
    tellers[1].close()  # rank 2's process ended
    settle(board, lambda: links[1].closed == 1)
    tellers[0].tell()
    settle(board, lambda: links[0].noticed_count == 4)
    assert links[0].closed == 0 and links[1].closed == 1
    tellers[0].close()


@pytest.mark.timeout(30)
def test_a_rank_that_connected_and_ended_before_its_link_was_made_is_seen_ended(board):
    Notifier("127.0.0.1", board.port, 3, 5.0).close()
    deadline = time.monotonic() + 5
    while 3 not in board._ended:  # taken in by the pulse, as it is before the links exist
        assert time.monotonic() < deadline
        board.drain()
        time.sleep(0.01)
    late = Link(3)
    board.add(late)
    assert late.closed == 1


@pytest.mark.timeout(30)
def test_a_link_that_ended_is_asked_for_nothing_more(board):
    link = Link(1, messages=1)  # its first message is its SHUTDOWN
    board.add(link)
    teller = Notifier("127.0.0.1", board.port, 1, 5.0)
    teller.tell()
    teller.tell()
    settle(board, lambda: link.noticed_count == 1)
    teller.close()
    time.sleep(0.2)
    board.drain()
    assert link.noticed_count == 1 and link.closed == 0
    assert not board._conns  # its connection is released


@pytest.mark.timeout(30)
def test_rings_from_other_threads_wake_the_waiter_and_its_own_do_not(board):
    other = threading.Thread(target=board.ring)
    other.start()
    other.join()
    assert ready([board], 1.0) == [board]
    board.clear()
    assert ready([board], 0.0) == []

    class RingsWhenNoticed(Link):
        def noticed(self) -> bool:
            board.ring()  # a hand-over in the thread that takes messages in
            return super().noticed()

    link = RingsWhenNoticed(1)
    board.add(link)
    teller = Notifier("127.0.0.1", board.port, 1, 5.0)
    teller.tell()
    settle(board, lambda: link.noticed_count == 1)
    assert ready([board], 0.0) == []  # nothing left to wake anyone for
    teller.close()


@pytest.mark.timeout(30)
def test_a_notice_to_a_rank_0_that_is_gone_fails_as_a_connection_error(board):
    teller = Notifier("127.0.0.1", board.port, 1, 5.0)
    settle(board, lambda: board._conns)  # accepted
    board.close()
    with pytest.raises(ConnectionError, match="rank 0's notice connection closed"):
        for _ in range(100):  # the first bytes may still go out before the reset comes back
            teller.tell()
            time.sleep(0.01)
    teller.close()
