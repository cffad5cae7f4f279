"""What a collector rank runs, however it was started: join the job, then serve rank 0's
commands with the worker loop every collector worker runs (``collectors/worker.py``)."""

from __future__ import annotations

import contextlib
import signal
import socket
from dataclasses import dataclass

from hpccollect.collectors.worker import serve
from hpccollect.transport.groups import RankGroups, open_store

__all__ = ["RankArgs", "ready_key", "serve_rank"]


@dataclass(frozen=True)
class RankArgs:
    """Everything a collector rank needs to join its job (what a launcher hands each rank)."""

    rank: int
    world_size: int
    host: str  # where rank 0's store listens
    port: int
    backend: str
    payload: bytes  # the pickled ``WorkerSpec`` of this rank's collector
    start_timeout: float
    device: str = "cpu"  # where wire buffers live (cuda for nccl)
    send_timeout: float = 600.0


def ready_key(rank: int) -> str:
    """The store key a rank sets when it is about to join the process groups."""
    return f"hpccollect/ready/{rank}"


def serve_rank(args: RankArgs, stop_on_sigterm: bool = False) -> None:
    """Join the job as ``args.rank`` and serve rank 0 until it says stop or goes away.

    SIGTERM and SIGINT are ignored: a scheduler signals every process of a job, and the stop
    belongs to rank 0, which sends ``SHUTDOWN`` after committing its last batch.
    ``stop_on_sigterm``: SIGTERM ends the process instead (a rank in a job of its own, whose
    rank 0 is outside the job: the signal means the scheduler ends the job).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL if stop_on_sigterm else signal.SIG_IGN)
    store = open_store(args.host, args.port, args.world_size, False, args.start_timeout)
    store.set(ready_key(args.rank), socket.gethostname())
    groups = RankGroups.open(args.backend, store, args.rank, args.world_size)
    channel = groups.channel(0, device=args.device, send_timeout=args.send_timeout)
    try:
        serve(channel, args.payload, None)
    finally:
        with contextlib.suppress(Exception):
            groups.close()
        channel.join_threads(5.0)
