"""``transport/base.py``'s ``cut_wait``: a signal ends the main thread's armed wait in ``ready`` at once,
and nothing else."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from hpccollect.transport.base import cut_wait, cut_waits_by, ready


class Cut(BaseException):
    pass


@pytest.fixture
def bell() -> Iterator[_Pipe]:
    """A pipe nobody writes to unless the test does, and SIGUSR2 calling ``cut_wait`` as
    the app's handler does."""
    old = signal.signal(signal.SIGUSR2, lambda *_: cut_wait())
    bell = _Pipe()
    try:
        yield bell
    finally:
        bell.close()
        signal.signal(signal.SIGUSR2, old)


class _Pipe:
    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()

    def fileno(self) -> int:
        return self.read_end

    def ring(self) -> None:
        os.write(self.write_end, b"!")

    def close(self) -> None:
        os.close(self.read_end)
        os.close(self.write_end)


def signal_in(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGUSR2))
    timer.start()
    return timer


@pytest.mark.timeout(60)
def test_a_signal_ends_the_armed_wait_under_way(bell) -> None:
    start = time.monotonic()
    with pytest.raises(Cut), cut_waits_by(Cut):
        timer = signal_in(0.2)  # armed first: a slow start cannot make the signal come early
        ready([bell], 30)
    timer.join()
    assert time.monotonic() - start < 20  # the wait would have lasted 30 s


@pytest.mark.timeout(60)
def test_a_signal_before_the_wait_ends_the_next_one(bell) -> None:
    with cut_waits_by(Cut):
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
    with cut_waits_by(Cut):
        os.kill(os.getpid(), signal.SIGUSR2)
        seen: list = []
        thread = threading.Thread(target=lambda: seen.append(ready([bell], 0.1)))
        thread.start()
        thread.join(10)
        assert seen == [[]]  # another thread's wait ends by its own timeout
        bell.ring()
        with pytest.raises(Cut):  # the main thread's, though the bell rang
            ready([bell], 1)
