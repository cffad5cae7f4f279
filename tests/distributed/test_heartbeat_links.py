"""Heartbeats on a real gloo link between two processes: they never take the receive that a
stopped rank left posted, so the next message to it still goes out at once (a gloo send
completes only into a receive the peer has posted), and the stopped rank is then reported
silent within the liveness timeout."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import pytest

from hpccollect.protocol import Command, message
from hpccollect.transport.groups import RankGroups, open_store

pytestmark = [pytest.mark.slow]

LIVENESS = 3.0


def peer(port: int, ready) -> None:
    """Rank 1: joins the groups, beats, and waits for messages (its receiving thread)."""
    store = open_store("127.0.0.1", port, 2, False, 30.0)
    groups = RankGroups.open("gloo", store, 1, 2)
    channel = groups.channel(0)
    channel.start_heartbeats(LIVENESS)
    ready.set()
    time.sleep(120)


@pytest.mark.timeout(90)
def test_a_message_to_a_stopped_rank_goes_out_after_heartbeats_and_the_rank_is_reported():
    store = open_store("127.0.0.1", 0, 2, True, 30.0)
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=peer, args=(store.port, ready), daemon=True)
    proc.start()
    groups = channel = None
    try:
        groups = RankGroups.open("gloo", store, 0, 2)
        channel = groups.channel(1, send_timeout=60.0)
        channel.start_heartbeats(LIVENESS)
        assert ready.wait(60), "rank 1 never joined"
        time.sleep(1.0)  # beats flow both ways
        os.kill(proc.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        time.sleep(1.5)  # three of this side's beats go to the stopped rank meanwhile
        sent = threading.Event()

        def send() -> None:
            channel.send(message(Command.COLLECT))
            sent.set()

        threading.Thread(target=send, daemon=True).start()
        assert sent.wait(2.0), "the message waited for the stopped rank to receive again"
        while channel.silence() is None and time.monotonic() - stopped < LIVENESS + 2:
            time.sleep(0.1)
        why = channel.silence()
        assert why is not None and "not even a heartbeat" in why
        assert time.monotonic() - stopped <= LIVENESS + 1.0
    finally:
        proc.kill()
        proc.join(10)
        if channel is not None:
            channel.close()
        if groups is not None:
            groups.close()
