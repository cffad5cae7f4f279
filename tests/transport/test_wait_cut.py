"""``transport/wait_cut.py``: a signal ends the main thread's armed wait in ``ready`` or
``paced`` at once, and nothing else; ``paced``'s pauses."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from hpccollect.transport import wait_cut
from hpccollect.transport.doorbell import Doorbell, ready


class Cut(BaseException):
    pass


@pytest.fixture
def bell() -> Iterator[Doorbell]:
    """A bell nobody rings, and SIGUSR2 calling ``wait_cut.cut`` as the app's handler does."""
    old = signal.signal(signal.SIGUSR2, lambda *_: wait_cut.cut())
    bell = Doorbell()
    try:
        yield bell
    finally:
        bell.close()
        signal.signal(signal.SIGUSR2, old)


def signal_in(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGUSR2))
    timer.start()
    return timer


@pytest.mark.timeout(60)
def test_a_signal_ends_the_armed_wait_under_way(bell) -> None:
    start = time.monotonic()
    with pytest.raises(Cut), wait_cut.cut_by(Cut):
        timer = signal_in(0.2)  # armed first: a slow start cannot make the signal come early
        ready([bell], 30)
    timer.join()
    assert time.monotonic() - start < 20  # the wait would have lasted 30 s


@pytest.mark.timeout(60)
def test_a_signal_before_the_wait_ends_the_next_one(bell) -> None:
    with wait_cut.cut_by(Cut):
        assert ready([bell], 0) == []
        os.kill(os.getpid(), signal.SIGUSR2)  # handled here, outside any wait
        with pytest.raises(Cut):
            ready([bell], 30)
    assert ready([bell], 0) == []  # disarmed: nothing pending is left


@pytest.mark.timeout(60)
def test_unarmed_waits_and_other_threads_waits_are_not_cut(bell) -> None:
    timer = signal_in(0.2)
    start = time.monotonic()
    assert ready([bell], 0.6) == []  # not armed: the signal is handled, the wait goes on
    assert time.monotonic() - start >= 0.6
    timer.join()
    with wait_cut.cut_by(Cut):
        os.kill(os.getpid(), signal.SIGUSR2)
        seen: list = []
        thread = threading.Thread(target=lambda: seen.append(ready([bell], 0.1)))
        thread.start()
        thread.join(10)
        assert seen == [[]]  # another thread's wait ends by its own timeout
        bell.ring()
        with pytest.raises(Cut):  # the main thread's, though the bell rang
            ready([bell], 1)


def test_a_paced_wait_looks_again_after_pauses_from_50_us_doubling_to_1_ms(monkeypatch) -> None:
    """``paced`` (a wait with nothing to block on) pauses in ``sleep``s shorter than the
    millisecond ``poll`` counts in, and never past its timeout."""
    pauses: list[float] = []
    monkeypatch.setattr(wait_cut, "sleep", lambda s: (pauses.append(s), time.sleep(s)))
    answers = iter([[]] * 7 + [["here"]])
    assert wait_cut.paced(lambda: next(answers), 10.0) == ["here"]
    assert pauses == pytest.approx([50e-6, 100e-6, 200e-6, 400e-6, 800e-6, 1e-3, 1e-3])
    pauses.clear()
    assert wait_cut.paced(list, 0.0) == [] and not pauses  # one look
    start = time.monotonic()
    assert wait_cut.paced(list, 0.02) == []
    assert time.monotonic() - start >= 0.02 and max(pauses) <= 1e-3


@pytest.mark.timeout(60)
def test_a_signal_ends_the_armed_paced_wait(bell) -> None:
    start = time.monotonic()
    with pytest.raises(Cut), wait_cut.cut_by(Cut):
        timer = signal_in(0.2)
        wait_cut.paced(list, 30.0)
    timer.join()
    assert time.monotonic() - start < 20
