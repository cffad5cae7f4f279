"""Rank 0's end of a real link (its control connection and gloo groups) to a rank that stops:
a command to it goes out at once (into its connection, whatever the rank does), and the stopped
rank is reported silent within the timeout, whether it stopped while reading its link or never
read it."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hpccollect.protocol import Command, message
from hpccollect.transport.control import ControlListener, connect
from hpccollect.transport.groups import RankGroups, open_store

pytestmark = [pytest.mark.slow, pytest.mark.timed]  # asserts how long detection takes

LIVENESS = 3.0


def listening_peer(port: int, control: tuple, token: bytes, ready: Any) -> None:
    """Rank 1: joins, beats, and reads its link (its reading thread)."""
    link = connect(control, 1, token, 30.0, LIVENESS)
    store = open_store("127.0.0.1", port, 2, False, 30.0)
    channel = RankGroups.open("gloo", store, 1, 2).channel(0, link)
    channel.start_reading()
    channel.start_heartbeats(LIVENESS)
    ready.set()
    time.sleep(120)


def silent_peer(port: int, control: tuple, token: bytes, ready: Any) -> None:
    """Rank 1 that joins, then neither reads nor beats (a rank stopped as it joined)."""
    link = connect(control, 1, token, 30.0, LIVENESS)
    store = open_store("127.0.0.1", port, 2, False, 30.0)
    groups = RankGroups.open("gloo", store, 1, 2)  # held: dropped, it would close the link
    ready.set()
    time.sleep(120)
    groups.close()
    link.close()


@contextlib.contextmanager
def link(peer: Callable[..., None]) -> Iterator[tuple[Any, mp.Process]]:
    """Rank 0's channel to ``peer`` run as rank 1 in a process of its own, heartbeats on."""
    store = open_store("127.0.0.1", 0, 2, True, 30.0)
    listener = ControlListener("127.0.0.1")
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(
        target=peer, args=(store.port, listener.address, listener.token, ready), daemon=True
    )
    proc.start()
    groups = channel = None
    try:
        control = listener.accept([1], 60.0, LIVENESS)[1]
        opened: dict[str, Any] = {}  # joined in a thread: a peer that died never joins
        joining = threading.Thread(
            target=lambda: opened.setdefault("groups", RankGroups.open("gloo", store, 0, 2)),
            daemon=True,
        )
        joining.start()
        joining.join(60)
        groups = opened.get("groups")
        assert groups is not None, f"rank 1 never joined (exit code {proc.exitcode})"
        channel = groups.channel(1, control, send_timeout=60.0)
        channel.start_heartbeats(LIVENESS)
        assert ready.wait(60), "rank 1 never joined"
        yield channel, proc
    finally:
        listener.close()
        proc.kill()
        proc.join(10)
        if channel is not None:
            channel.close()
        if groups is not None:
            groups.close()


def sent_within(channel: Any, seconds: float) -> bool:
    """Whether sending one command returns within ``seconds``."""
    sent = threading.Event()

    def send() -> None:
        channel.send(message(Command.COLLECT, 1))
        sent.set()

    threading.Thread(target=send, daemon=True).start()
    return sent.wait(seconds)


def reported_within(channel: Any, since: float, seconds: float) -> str | None:
    while channel.silence() is None and time.monotonic() - since < seconds:
        time.sleep(0.1)
    return channel.silence()


@pytest.mark.timeout(90)
def test_a_message_to_a_stopped_rank_goes_out_after_heartbeats_and_the_rank_is_reported():
    with link(listening_peer) as (channel, proc):
        time.sleep(1.0)  # beats flow both ways
        os.kill(proc.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        time.sleep(1.5)  # three of this side's beats go to the stopped rank meanwhile
        assert sent_within(channel, 2.0), "the message waited for the rank to receive again"
        why = reported_within(channel, stopped, LIVENESS + 2)
        assert why is not None and "not even a heartbeat" in why
        assert time.monotonic() - stopped <= LIVENESS + 1.0


@pytest.mark.timeout(90)
def test_a_command_to_a_rank_that_reads_nothing_does_not_hold_rank_0():
    """Rank 0 waits for the reply instead, where liveness is checked."""
    with link(silent_peer) as (channel, _):
        started = time.monotonic()
        assert sent_within(channel, 2.0), "rank 0 waited for the command to be taken"
        assert reported_within(channel, started, LIVENESS + 2) is not None
