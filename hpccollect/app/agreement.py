"""The start-up agreement of a distributed ``collect``: every rank runs its own start-up checks
and tells rank 0 how they went; rank 0 then tells every rank to go on, or to end with the first
error's exit code. So a mistake found on any rank ends every rank at once and cleanly, and no rank
waits for one that already left."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpccollect.app.signals import Stopped
from hpccollect.errors import CollectorTimeoutError
from hpccollect.launchers.rendezvous import recv_object, send_object

__all__ = ["Describe", "JobEnded", "agree"]

_STATUS_TAG = 32761  # each rank's start-up outcome, to rank 0
_VERDICT_TAG = 32762  # rank 0's decision, to each rank
_START_WAIT = 600.0  # s a rank waits for the others' start-up checks (env imports, probe)
_POLL = 0.02

#: ``describe(err)``: (exit code, the one line to print) for an error the command line reports
Describe = Callable[[BaseException], "tuple[int, str] | None"]


class JobEnded(Exception):
    """The job ended during start-up on every rank: ``code`` is this rank's exit code, ``line``
    what it prints (only rank 0 has one)."""

    def __init__(self, code: int, line: str | None = None) -> None:
        super().__init__(line or f"exit {code}")
        self.code, self.line = code, line


def agree(comm: Any, checks: Callable[[], Any], describe: Describe, stop: Any = None) -> Any:
    """Run this rank's start-up ``checks``; return their result once every rank passed
    its own. Otherwise every rank raises ``JobEnded`` (rank 0 with the first error's line),
    or, when rank 0 was stopped by a signal, rank 0 raises ``Stopped``."""
    status: tuple[int, str | None] | None = None
    result = None
    try:
        result = checks()
    except Stopped:
        status = (0, None)
    except Exception as err:
        status = describe(err)
        if status is None:
            raise
    if comm.Get_rank():
        _send(comm, status, 0, _STATUS_TAG)
        verdict = _receive(comm, 0, _VERDICT_TAG, "rank 0's start-up checks")
        if verdict is not None:
            raise JobEnded(verdict)
        return result
    failures = [(0, status)] if status is not None else []
    with stop.held():  # the other ranks wait for the verdict: it is always sent
        for rank in range(1, comm.Get_size()):
            theirs = _receive(comm, rank, _STATUS_TAG, f"rank {rank}'s start-up")
            if theirs is not None:
                failures.append((rank, theirs))
        errors = [f for f in failures if f[1][1] is not None]
        stopped = stop.signal is not None
        verdict = errors[0][1][0] if errors else (0 if failures or stopped else None)
        for rank in range(1, comm.Get_size()):
            _send(comm, verdict, rank, _VERDICT_TAG)
    if errors:
        rank, (code, line) = errors[0]
        raise JobEnded(code, f"{line} [MPI rank {rank}]" if rank else line)
    if verdict is not None:
        raise Stopped
    return result


def _send(comm: Any, value: Any, dest: int, tag: int) -> None:
    send_object(comm, value, dest, tag, _START_WAIT, f"the message to rank {dest}", _POLL)


def _receive(comm: Any, source: int, tag: int, what: str) -> Any:
    try:
        return recv_object(comm, source, tag, _START_WAIT, what, _POLL)
    except CollectorTimeoutError as err:
        raise CollectorTimeoutError(
            f"MPI rank {comm.Get_rank()} waited {_START_WAIT:g} s for {what}; every rank must run "
            "the same python -m hpccollect collect command."
        ) from err
