"""The MPI launcher processes above a rank, and the reaper that ends one an abort left stuck.

Open MPI 5's launcher (PRRTE 3.0.14's ``prterun``/``prted``) sometimes deadlocks tearing down a
job after a rank aborted (its main thread in ``PMIx_server_deregister_client`` waits for the
PMIx thread, which waits on a lock): every rank is gone and ``mpirun`` never returns (about 1
job in 40 on a loaded 2-core machine). So a rank that aborts under Open MPI first starts a
reaper in its own session, which SIGKILLs the launcher (its ranks first) unless it ends within
``grace`` s, or ``childless`` s once it has no rank left. Run as a script (``python -I -S
_launchers.py PID START GRACE CHILDLESS``), this file is that reaper: stdlib only, fast to start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

__all__ = ["LAUNCHERS", "Process", "launcher_chain", "process", "reap_after_abort"]

#: process names of MPI launchers and their per-node daemons
LAUNCHERS = frozenset(
    {
        "mpirun",
        "mpiexec",
        "mpiexec.hydra",
        "hydra_pmi_proxy",
        "prterun",
        "prte",
        "prted",
        "orterun",
        "orted",
    }
)
#: the launchers that an abort can leave stuck (Open MPI 5's PRRTE)
STUCK_AFTER_ABORT = frozenset({"prterun", "prte", "prted"})
_REAP_PERIOD = 0.2  # s between two looks of the reaper
_reapers: list[subprocess.Popen] = []  # kept, so that no ResourceWarning is raised


class Process(NamedTuple):
    """What ``/proc/PID/stat`` says of a process."""

    name: str
    state: str  # "Z": ended, not yet waited for by its parent
    parent: int
    started: int  # clock ticks since boot: with the pid, names one process for good


def process(pid: int) -> Process | None:
    """``pid``'s name, state, parent and start time, or None if it is gone."""
    try:  # a process may name itself with any bytes (prctl), UTF-8 or not
        text = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    name = text[text.index("(") + 1 : text.rindex(")")]
    return Process(name, fields[0], int(fields[1]), int(fields[19]))


def launcher_chain(pid: int | None = None) -> list[tuple[int, int]]:
    """The ancestors of ``pid`` (default: this process) while named in ``LAUNCHERS``, nearest
    first, each as (pid, start time)."""
    chain: list[tuple[int, int]] = []
    own = process(os.getpid() if pid is None else pid)
    parent = own.parent if own else 0
    while parent > 1:
        found = process(parent)
        if found is None or found.name not in LAUNCHERS:
            break
        chain.append((parent, found.started))
        parent = found.parent
    return chain


def reap_after_abort(grace: float = 10.0, childless: float = 3.0) -> int | None:
    """Start a reaper for this process's launcher if an abort can leave it stuck (see above);
    call it just before ending the job.

    Args:
        grace: seconds the launcher has to end by itself before it and its processes are killed.
        childless: seconds the launcher may live on once no process of it is left.

    Returns:
        The reaper's pid, or None when no such launcher is above.
    """
    chain = launcher_chain()
    launcher = process(chain[0][0]) if chain else None
    if launcher is None or launcher.name not in STUCK_AFTER_ABORT:
        return None
    watched = [str(chain[0][0]), str(launcher.started), repr(float(grace)), repr(float(childless))]
    reaper = subprocess.Popen(
        [sys.executable, "-I", "-S", __file__, *watched],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # the launcher ends its ranks' process groups, not this one
    )
    _reapers.append(reaper)
    return reaper.pid


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and has not ended (a zombie has)."""
    found = process(pid)
    return found is not None and found.state != "Z"


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` now, nearest first (ended ones not yet waited for too)."""
    by_parent = _by_parent()
    found, todo = [], [pid]
    while todo:
        for child in by_parent.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _by_parent() -> dict[int, list[int]]:
    """Every process now, under its parent's pid."""
    table: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := process(int(entry))) is not None:
            table.setdefault(found.parent, []).append(int(entry))
    return table


def _children(pid: int) -> list[int]:
    """The live (not ended) children of ``pid``."""
    return [child for child in _by_parent().get(pid, []) if alive(child)]


def _reap(pid: int, started: int, grace: float, childless: float) -> None:
    begun = time.monotonic()
    alone_since: float | None = None
    while True:
        time.sleep(_REAP_PERIOD)
        found = process(pid)
        if found is None or found.started != started or found.state == "Z":
            return  # the launcher ended by itself
        now = time.monotonic()
        children = _children(pid)
        alone_since = None if children else alone_since or now
        if now - begun >= grace or (alone_since is not None and now - alone_since >= childless):
            for child in children:
                with contextlib.suppress(OSError):
                    os.kill(child, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            return


if __name__ == "__main__":
    _reap(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]))
