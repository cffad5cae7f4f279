"""Rank 0's start of a job: listen, have the launcher start the collector ranks, wait until each
is about to join, and join the process groups with them. A rank that ends during any of it is
reported at once, never after ``start_timeout``."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from hpccollect.errors import CollectorTimeoutError, WorkerError
from hpccollect.launchers.rank import RankArgs, ready_key
from hpccollect.transport.backends import backend_named
from hpccollect.transport.groups import RankGroups, open_store
from hpccollect.transport.rank_channel import RankChannel

__all__ = ["start_ranks"]


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
    """Start one collector rank per payload (a pickled ``WorkerSpec``) and join them; the
    job's groups and one ``RankChannel`` per rank, beating to its rank every few seconds when
    ``liveness_timeout`` is set (both ends then notice a silent peer within it). On failure
    nothing started is left running."""
    n = len(payloads)
    # a backend that meets in the launcher's own world (MPI) needs no address and no store
    needs_store = backend_named(backend).needs_store or not launcher.mpi_world
    address = launcher.address() if needs_store else None
    store = open_store(address, port, n + 1, True, start_timeout) if address else None
    processes: list = []
    try:
        ranks = [
            RankArgs(
                rank=i + 1,
                world_size=n + 1,
                host=address,
                port=store.port if store is not None else 0,
                backend=backend,
                payload=payload,
                start_timeout=start_timeout,
                device=str(device),
                send_timeout=send_timeout,
                liveness_timeout=liveness_timeout,
            )
            for i, payload in enumerate(payloads)
        ]
        processes = launcher.start(ranks)
        if store is not None:
            _await_ranks(store, processes, start_timeout, f"{address}:{store.port}")
        groups = _open_groups(backend, store, processes, start_timeout)
    except BaseException:
        for process in processes:
            if process is not None:
                process.kill()
                process.close()
        launcher.close()
        raise
    channels = [
        groups.channel(i + 1, process=process, device=device, send_timeout=send_timeout)
        for i, process in enumerate(processes)
    ]
    for channel in channels:
        channel.start_heartbeats(liveness_timeout)
    return groups, channels


def _await_ranks(store: Any, processes: Sequence[Any], timeout: float, address: str) -> None:
    """Return once every rank is about to join."""
    deadline = time.monotonic() + timeout
    waiting = set(range(len(processes)))
    while waiting:
        for i in sorted(waiting):
            if store.check([ready_key(i + 1)]):
                waiting.discard(i)
        _check_started(processes, waiting)
        if waiting and time.monotonic() > deadline:
            raise CollectorTimeoutError(
                f"collector ranks {sorted(r + 1 for r in waiting)} did not join within "
                f"start_timeout={timeout:g} s; pass a larger start_timeout if they start "
                f"slowly, or check that they can reach {address}."
            )
        if waiting:
            time.sleep(0.02)


def _open_groups(backend: str, store: Any, processes: Sequence[Any], timeout: float) -> RankGroups:
    """Join the process groups in a thread, watching the ranks meanwhile (the joining thread
    is abandoned when one ends: it cannot be interrupted)."""
    result: dict[str, Any] = {}

    def join() -> None:
        try:
            result["groups"] = RankGroups.open(backend, store, 0, len(processes) + 1)
        except BaseException as err:
            result["error"] = err

    thread = threading.Thread(target=join, name="hpccollect-join", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while thread.is_alive():
        thread.join(0.05)
        _check_started(processes)
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
