"""What a collector rank runs, however it was started: join the job, then serve rank 0's
commands with the worker loop every collector worker runs (``collectors/workers/worker.py``)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpccollect._signals import ignore_stop_signals
from hpccollect.collectors.workers.worker import serve
from hpccollect.transport.groups import RankGroups, open_store

__all__ = ["LOST_RANK0_STATUS", "RankArgs", "ready_key", "serve_rank"]

_STUCK_EXIT = 3.0  # s a rank that lost rank 0 gives its own threads to end
LOST_RANK0_STATUS = 3  # the exit status of a collector rank whose rank 0 was lost


@dataclass(frozen=True)
class RankArgs:
    """Everything a collector rank needs to join its job (what a launcher hands each rank)."""

    rank: int
    world_size: int
    host: str | None  # where rank 0's store listens; None: the backend needs no store
    port: int
    backend: str
    payload: bytes  # the pickled ``WorkerSpec`` of this rank's collector
    start_timeout: float
    device: str = "cpu"  # where wire buffers live (cuda for nccl)
    send_timeout: float = 600.0
    liveness_timeout: float | None = None  # s rank 0 may stay silent before this rank ends


def ready_key(rank: int) -> str:
    """The store key a rank sets when it is about to join the process groups."""
    return f"hpccollect/ready/{rank}"


def serve_rank(
    args: RankArgs,
    stop_on_sigterm: bool = False,
    end_lost: Callable[[], Any] | None = None,
) -> None:
    """Join the job as ``args.rank`` and serve rank 0 until it says stop or goes away.

    SIGTERM, SIGINT and SIGUSR1 are ignored: a scheduler signals every process of a job, and the stop
    belongs to rank 0, which sends ``SHUTDOWN`` after committing its last batch.
    ``stop_on_sigterm``: SIGTERM ends the process instead (a rank in a job of its own, whose
    rank 0 is outside the job: the signal means the scheduler ends the job).
    A rank 0 silent for ``args.liveness_timeout`` s (its node lost, its network cut, stopped)
    ends this rank too, saying so on standard error: once its own collector is shut down,
    ``end_lost()`` ends the process (default: exit status ``LOST_RANK0_STATUS`` at once, with
    no teardown that could wait on rank 0).
    """
    ignore_stop_signals()
    if stop_on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    store = None
    if args.host is not None:
        store = open_store(args.host, args.port, args.world_size, False, args.start_timeout)
        store.set(ready_key(args.rank), socket.gethostname())
    groups = RankGroups.open(args.backend, store, args.rank, args.world_size)
    channel = groups.channel(0, device=args.device, send_timeout=args.send_timeout)
    channel.start_heartbeats(args.liveness_timeout)
    served = threading.Event()
    lost: list[str] = []
    watch = threading.Thread(
        target=_watch_rank0,
        args=(channel, groups, args, served, lost),
        name="hpccollect-rank0-watch",
        daemon=True,
    )
    watch.start()
    try:
        serve(channel, args.payload, None)
    finally:
        served.set()
        gone = None if lost else _why_gone(channel)
        with contextlib.suppress(Exception):
            groups.close()
        channel.join_threads(5.0)
        watch.join(2.0)
    if gone is not None and not lost:  # the link failed before the watch saw rank 0 silent
        _report(args, gone)
        lost.append(gone)
    if lost:
        (end_lost or _exit_lost)()


def _why_gone(channel: Any) -> str | None:
    """Why rank 0 counts as lost once ``serve`` returned without its SHUTDOWN, or None."""
    failed = channel.lost_peer()
    if failed is None:
        return None
    return channel.silence() or f"cannot be reached ({failed})"


def _report(args: RankArgs, why: str) -> None:
    where = f" ({args.host})" if args.host else ""
    print(
        f"hpccollect: collector rank {args.rank} on {socket.gethostname()}: rank 0{where} "
        f"{why}; this rank stops collecting and ends.",
        file=sys.stderr,
        flush=True,
    )


def _exit_lost() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(LOST_RANK0_STATUS)


def _watch_rank0(
    channel: Any, groups: RankGroups, args: RankArgs, served: threading.Event, lost: list[str]
) -> None:
    """End this rank's part of the job once rank 0 has been silent too long: the channel fails
    every wait on rank 0, ``serve`` returns and the process ends. A send rank 0 never takes
    cannot be woken: the process then ends here, ``_STUCK_EXIT`` s later (what this rank's
    shard had committed stays readable)."""
    while not served.wait(1.0):
        why = channel.silence()
        if why is None:
            continue
        _report(args, why)
        lost.append(f"rank 0 {why}")
        channel.lose(lost[0])
        with contextlib.suppress(Exception):
            groups.close()
        if not served.wait(_STUCK_EXIT):
            os._exit(LOST_RANK0_STATUS)
        return
