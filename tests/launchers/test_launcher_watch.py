"""``launcher_watch``: a process started by an MPI launcher that ends without passing SIGTERM on
(Intel MPI's ``mpirun`` script) gets SIGTERM from hpccollect instead. Real processes: a shell
script named ``mpirun`` runs a Python child, and is killed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import parent

from hpccollect.launchers.launcher_watch import launcher_chain

CHILD = """
import signal, sys, time
from hpccollect.launchers.launcher_watch import watch_launcher
got = []
signal.signal(signal.SIGTERM, lambda *a: got.append(time.monotonic()))
print(watch_launcher(), flush=True)
deadline = time.monotonic() + 20
while not got and time.monotonic() < deadline:
    time.sleep(0.02)
print("SIGTERM" if got else "no signal", flush=True)
"""


#: how often the watching thread woke in 2 s (it sleeps until a launcher ends)
WAKES = """
import time
from hpccollect.launchers import launcher_watch
launcher_watch.watch_launcher()
task = f"/proc/self/task/{launcher_watch._watcher.native_id}/status"
def switches():
    with open(task) as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt"))
time.sleep(0.5)
before = switches()
time.sleep(2.0)
print(switches() - before, flush=True)
"""


def start(tmp_path: Path, name: str, code: str = CHILD) -> subprocess.Popen:
    launcher = tmp_path / name
    launcher.write_text('#!/bin/sh\n"$@"\n')  # the child runs under the script, not in its place
    launcher.chmod(0o755)
    return subprocess.Popen(
        [str(launcher), sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@contextlib.contextmanager
def started(tmp_path: Path, name: str, code: str = CHILD) -> Iterator[subprocess.Popen]:
    """``start``, and every process of it ended and reaped after the block."""
    proc = start(tmp_path, name, code)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):  # the whole session may be gone
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
        proc.stdout.close()


@pytest.mark.timed
@pytest.mark.timeout(60)
def test_a_rank_whose_launcher_dies_gets_sigterm_within_a_second(tmp_path: Path) -> None:
    with started(tmp_path, "mpirun") as proc:
        assert proc.stdout.readline().strip() == "True"  # the launcher was found
        proc.kill()  # the script dies without passing anything on
        killed = time.monotonic()
        proc.wait(5)
        assert proc.stdout.readline().strip() == "SIGTERM"
        assert time.monotonic() - killed < 3


@pytest.mark.timeout(60)
def test_the_watching_thread_sleeps_until_a_launcher_ends(tmp_path: Path) -> None:
    """It waits on the launchers' process descriptors: no wake-up while they run (looking
    every half second, it woke 4 times in 2 s)."""
    with started(tmp_path, "mpiexec", WAKES) as proc:
        assert proc.stdout.readline().strip() == "0"


@pytest.mark.timeout(60)
def test_a_process_under_no_launcher_watches_nothing(tmp_path: Path) -> None:
    with started(tmp_path, "not-a-launcher") as proc:
        assert proc.stdout.readline().strip() == "False"


def test_the_chain_is_the_launchers_above_a_process_nearest_first(tmp_path: Path) -> None:
    with started(tmp_path, "mpiexec") as proc:
        assert proc.stdout.readline().strip() == "True"
        child = next(
            int(p.name)
            for p in Path("/proc").iterdir()
            if p.name.isdigit() and parent(int(p.name)) == proc.pid
        )
        assert [pid for pid, _ in launcher_chain(child)] == [proc.pid]
