"""``Heartbeat``'s ping and answer (gloo: rank 0 learns that its beat was taken from the rank's
answer, not from the send): an answer that comes before the send returned is never lost, and
the end that answers sends no beat of its own."""

from __future__ import annotations

import threading
import time

from hpccollect.transport.heartbeat import Heartbeat
from hpccollect.transport.pulse import Pulse


class Work:
    """A sent beat: ``wait`` returns (the peer took it)."""

    def __init__(self) -> None:
        self.waited = False

    def wait(self, *_: object) -> None:
        self.waited = True


def test_an_answer_that_comes_before_the_send_returns_is_not_lost():
    """The peer answers while ``send`` still runs (gloo lets go of the interpreter while it
    posts): the answer must find the beat it answers, or no beat would ever go again."""
    sent: list[Work] = []
    answering: list[threading.Thread] = []

    def send() -> Work:
        work = Work()
        sent.append(work)
        answer = threading.Thread(target=beat.answered)  # the messages thread takes the answer
        answering.append(answer)
        answer.start()
        time.sleep(0.2)  # ... before this send returns
        return work

    pulse = Pulse("test-pulse")
    beat = Heartbeat(600.0, send, lambda: False, pollable=False, pulse=pulse)
    try:
        for turn in range(3):
            beat.tick(time.monotonic())
            answering[-1].join(5)
            assert len(sent) == turn + 1, "a beat was answered, yet no next one went"
            assert sent[-1].waited
    finally:
        beat.release(0.5)


def test_the_end_that_answers_sends_only_answers():
    sent: list[Work] = []

    def send() -> Work:
        sent.append(Work())
        return sent[-1]

    pulse = Pulse("test-pulse")
    beat = Heartbeat(600.0, send, lambda: False, pollable=False, answers=True, pulse=pulse)
    try:
        beat.tick(time.monotonic())
        beat.part()
        assert sent == []
        beat.answer()  # a beat of the peer's came: the answer goes and is seen through
        assert len(sent) == 1 and sent[0].waited
    finally:
        beat.release(0.5)
