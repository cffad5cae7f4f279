"""A rank's start-up, both sides, however the ranks were started: rank 0 (``start_ranks``) and
a collector rank (``serve_rank``), which then serves rank 0 with the common worker loop."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hpccollect._signals import ignore_stop_signals
from hpccollect.collectors.workers.worker import serve
from hpccollect.errors import CollectorTimeoutError, WorkerError
from hpccollect.transport.backends import backend_named, rank_device
from hpccollect.transport.control import ControlListener, connect
from hpccollect.transport.groups import RankGroups, open_store
from hpccollect.transport.rank_channel import RankChannel

__all__ = ["LOST_RANK0_STATUS", "RankArgs", "serve_rank", "start_ranks"]

_STUCK_EXIT = 3.0  # s a rank that lost rank 0 gives its own threads to end
LOST_RANK0_STATUS = 3  # the exit status of a collector rank whose rank 0 was lost


@dataclass(frozen=True)
class RankArgs:
    """Everything a collector rank needs to join its job."""

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
    control: tuple[str, int] = ("", 0)  # where rank 0 takes this rank's control connection
    token: bytes = b""  # the job's token, which that connection starts with


def serve_rank(
    args: RankArgs,
    stop_on_sigterm: bool = False,
    end_lost: Callable[[], Any] | None = None,
    comm: Any = None,
    names: tuple[str, str] | None = None,
) -> None:
    """Join the job as ``args.rank`` and serve rank 0 until it says stop or goes away.

    The stop signals are ignored: the stop belongs to rank 0. ``stop_on_sigterm``: SIGTERM ends
    the process instead (a job of its own, whose rank 0 is outside it). A rank 0 silent for
    ``args.liveness_timeout`` s ends this rank, said on stderr; then ``end_lost()`` ends the
    process (default: status ``LOST_RANK0_STATUS`` at once, no teardown that could wait on
    rank 0). ``comm``: the job's MPI communicator (default ``MPI.COMM_WORLD``). ``names``: this
    rank's and its rank 0's names in that report (default ``collector rank N``, ``rank 0``).
    """
    names = names or (f"collector rank {args.rank}", "rank 0")
    ignore_stop_signals()
    if stop_on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    link = connect(args.control, args.rank, args.token, args.start_timeout, args.liveness_timeout)
    device = rank_device(args.device, args.rank)  # its GPU, current before its groups are made
    store = None
    try:
        if args.host is not None:
            store = open_store(args.host, args.port, args.world_size, False, args.start_timeout)
        groups = RankGroups.open(args.backend, store, args.rank, args.world_size, comm)
    except BaseException:
        link.close()
        raise
    channel = groups.channel(0, link, device=device, send_timeout=args.send_timeout)
    channel.start_reading()
    channel.start_heartbeats(args.liveness_timeout)
    served = threading.Event()
    lost: list[str] = []
    watch = threading.Thread(
        target=_watch_rank0,
        args=(channel, groups, args, served, lost, names),
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
        _report(args, names, gone)
        lost.append(gone)
    if lost:
        (end_lost or _exit_lost)()


def _why_gone(channel: Any) -> str | None:
    """Why rank 0 counts as lost once ``serve`` returned without its SHUTDOWN, or None."""
    failed = channel.lost_peer()
    if failed is None:
        return None
    return channel.silence() or f"cannot be reached ({failed})"


def _report(args: RankArgs, names: tuple[str, str], why: str) -> None:
    where = f" ({args.host})" if args.host else ""
    print(
        f"hpccollect: {names[0]} on {socket.gethostname()}: {names[1]}{where} "
        f"{why}; this rank stops collecting and ends.",
        file=sys.stderr,
        flush=True,
    )


def _exit_lost() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(LOST_RANK0_STATUS)


def _watch_rank0(
    channel: Any,
    groups: RankGroups,
    args: RankArgs,
    served: threading.Event,
    lost: list[str],
    names: tuple[str, str],
) -> None:
    """Once rank 0 is silent too long, fail the channel's waits so that ``serve`` returns; a
    send that cannot be woken has the process end here ``_STUCK_EXIT`` s later."""
    while not served.wait(1.0):
        why = channel.silence()
        if why is None:
            continue
        _report(args, names, why)
        lost.append(f"{names[1]} {why}")
        channel.link_closed(lost[0])
        with contextlib.suppress(Exception):
            groups.close()
        if not served.wait(_STUCK_EXIT):
            os._exit(LOST_RANK0_STATUS)
        return


def start_ranks(
    launcher: Any,
    payloads: Sequence[bytes],
    *,
    port: int,
    backend: str,
    start_timeout: float,
    send_timeout: float,
    device: Any = "cpu",
    liveness_timeout: float | None = None,
) -> tuple[RankGroups, list[RankChannel]]:
    """Start one collector rank per payload (a pickled ``WorkerSpec``) and join them; return the
    job's groups and one ``RankChannel`` per rank (heart-beating when ``liveness_timeout`` is
    set). A rank that ends during start-up is reported at once, by its control connection or
    its process; on failure nothing started is left running."""
    n = len(payloads)
    address = launcher.address()
    # a backend that meets in the launcher's own world (MPI) needs no store
    needs_store = backend_named(backend).needs_store or not launcher.mpi_world
    listener = ControlListener(address)
    store = None
    processes: list = []
    links: dict[int, Any] = {}
    try:
        store = open_store(address, port, n + 1, True, start_timeout) if needs_store else None
        ranks = [
            RankArgs(
                rank=i + 1,
                world_size=n + 1,
                host=address if store is not None else None,
                port=store.port if store is not None else 0,
                backend=backend,
                payload=payload,
                start_timeout=start_timeout,
                device=str(device),
                send_timeout=send_timeout,
                liveness_timeout=liveness_timeout,
                control=listener.address,
                token=listener.token,
            )
            for i, payload in enumerate(payloads)
        ]
        processes = launcher.start(ranks)
        named = getattr(launcher, "world_ranks", None)  # a gathered MPI job's ranks, as MPI's

        def watch(waiting: set[int]) -> None:
            _check_started(processes, [r - 1 for r in waiting])

        def late(waiting: list[int]) -> CollectorTimeoutError:
            return CollectorTimeoutError(
                f"collector ranks {[named[r] if named else r for r in waiting]} did not join "
                f"within start_timeout={start_timeout:g} s; pass a larger start_timeout if "
                f"they start slowly, or check that they can reach "
                f"{listener.address[0]}:{listener.address[1]}."
            )

        links = listener.accept(range(1, n + 1), start_timeout, liveness_timeout, watch, late)
        comm = getattr(launcher, "split_comm", None) if launcher.mpi_world else None
        groups = _open_groups(backend, store, processes, links, start_timeout, comm)
    except BaseException:
        for link in links.values():
            link.close()
        for process in processes:
            if process is not None:
                process.kill()
                process.close()
        launcher.close()
        raise
    finally:
        listener.close()
    channels = [
        groups.channel(
            i + 1, links[i + 1], process=process, device=device, send_timeout=send_timeout
        )
        for i, process in enumerate(processes)
    ]
    for channel in channels if named else ():
        channel.rank = named[channel.peer]
    for channel in channels:
        channel.start_heartbeats(liveness_timeout)
    return groups, channels


def _open_groups(
    backend: str,
    store: Any,
    processes: Sequence[Any],
    links: dict[int, Any],
    timeout: float,
    comm: Any = None,
) -> RankGroups:
    """Join the process groups in a thread (abandoned if a rank ends: it cannot be interrupted),
    watching the ranks' processes and control connections meanwhile."""
    result: dict[str, Any] = {}

    def join() -> None:
        try:
            result["groups"] = RankGroups.open(backend, store, 0, len(processes) + 1, comm)
        except BaseException as err:
            result["error"] = err

    thread = threading.Thread(target=join, name="hpccollect-join", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while thread.is_alive():
        thread.join(0.05)
        _check_started(processes)
        for rank, link in links.items():
            if link.ended():
                raise WorkerError(
                    f"collector rank {rank} closed its connection while joining the job; its "
                    "own output says why.",
                    worker=rank - 1,
                    host=getattr(processes[rank - 1], "host", "?") if processes else "?",
                    num_workers=len(processes),
                    rank=rank,
                )
        if time.monotonic() > deadline:
            raise CollectorTimeoutError(
                f"the collector ranks did not join the process groups within "
                f"start_timeout={timeout:g} s."
            )
    if "error" in result:
        raise result["error"]
    return result["groups"]


def _check_started(processes: Sequence[Any], which: Any = None) -> None:
    """Raise for the first rank (of ``which``) whose process ended during start-up."""
    for i in range(len(processes)) if which is None else which:
        if processes[i] is not None and (how := processes[i].death()) is not None:
            pid = f" (pid {processes[i].pid})" if processes[i].pid is not None else ""
            raise WorkerError(
                f"collector rank {i + 1}{pid} {how} before joining the job; its own output "
                "above says why.",
                worker=i,
                host=processes[i].host,
                num_workers=len(processes),
                rank=i + 1,
            )
