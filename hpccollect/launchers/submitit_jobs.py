"""Watching and cancelling the submitit jobs of ``launcher="submitit"``/``"submitit_delayed"``.

submitit reads a SLURM job's state from ``sacct``, which clusters without a job database lack (a
dead job would look alive forever), so one thread per launcher polls ``squeue`` and ``scontrol``,
or the local executor's controller. A job that ends closes a pipe read by each rank's
``sentinel``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["JobWatch", "WatchedJob", "cancel", "slurm_nodes"]

_ALIVE = {"PENDING", "CONFIGURING", "RUNNING", "RESIZING", "SUSPENDED", "REQUEUED"}
_COMMAND_TIMEOUT = 20.0  # s for one squeue/scontrol/scancel call


def _slurm(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT, check=False
    )


def slurm_nodes() -> dict[str, str] | None:
    """The SLURM cluster's node names and addresses (``NodeAddr``); None without ``sbatch`` on
    PATH or when ``sinfo`` fails."""
    import shutil

    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return None
    try:
        done = _slurm("sinfo", "-h", "-N", "-o", "%N %o")
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return dict(sorted(line.split()[:2] for line in done.stdout.splitlines() if line.count(" ")))


class WatchedJob:
    """One submitted job: its state as last seen, and how it ended once it has."""

    def __init__(self, job: Any, ranks: Sequence[int], start_timeout: float, slurm: bool) -> None:
        self.job, self.id, self.slurm = job, str(job.job_id), slurm
        self.ranks = set(ranks)
        self.start_timeout = start_timeout
        self.submitted = time.monotonic()
        self.state = "PENDING" if slurm else "RUNNING"
        self.reason = ""
        self.ended: str | None = None
        self.event = threading.Event()
        self.read_fd, self._write_fd = os.pipe()
        self.killed: set[int] = set()
        self.closed: set[int] = set()

    def log(self, task: int = 0) -> Path:
        """The stderr file of task ``task`` of the job."""
        return Path(self.job.task(task).paths.stderr) if task else Path(self.job.paths.stderr)

    def pending_too_long(self) -> str | None:
        """Why the job counts as failed while it is PENDING past start_timeout, or None."""
        if self.ended is None and self.state == "PENDING":
            waited = time.monotonic() - self.submitted
            if waited > self.start_timeout:
                reason = f", reason {self.reason}" if self.reason else ""
                return (
                    f"(submitit job {self.id}) stayed PENDING{reason} for {waited:.0f} s, past "
                    f"start_timeout={self.start_timeout:g} s; it is cancelled (log: {self.log()}). "
                    "Free the resources it asks for, change slurm_kwargs, or raise start_timeout."
                )
        return None

    def end(self, how: str) -> None:
        if self.ended is None:
            self.ended = how
            self.event.set()
            with contextlib.suppress(OSError):
                os.close(self._write_fd)

    def release(self) -> None:
        self.end(self.ended or "was released")
        with contextlib.suppress(OSError):
            os.close(self.read_fd)


class JobWatch:
    """Polls its jobs' states every ``period`` s in one daemon thread until each has ended."""

    def __init__(self, period: float) -> None:
        self.period = period
        self.jobs: list[WatchedJob] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, job: WatchedJob) -> None:
        with self._lock:
            self.jobs.append(job)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="hpccollect-submitit-watch", daemon=True
                )
                self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._lock:
                live = [j for j in self.jobs if j.ended is None]
            if not live:
                return
            self.poll(live)
            time.sleep(self.period)

    def poll(self, jobs: Sequence[WatchedJob]) -> None:
        """Update ``jobs``' states; end those that are over."""
        slurm = [j for j in jobs if j.slurm]
        for job in jobs:
            if not job.slurm and job.job.done():  # the local controller's process ended
                job.end(f"(submitit local job {job.id}) ended, {job.job.state} (log: {job.log()})")
        if not slurm:
            return
        try:
            done = _slurm("squeue", "-h", "-j", ",".join(j.id for j in slurm), "-o", "%i %T %r")
        except (OSError, subprocess.TimeoutExpired):
            return  # the controller is busy: the next poll tells
        if done.returncode != 0 and "Invalid job id" not in done.stderr:
            return
        seen = {}
        for line in done.stdout.splitlines():
            parts = line.split(None, 2)
            if len(parts) >= 2:
                seen[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
        for job in slurm:
            job.state, job.reason = seen.get(job.id, ("GONE", ""))
            if job.state not in _ALIVE:
                job.end(self._slurm_end(job))

    @staticmethod
    def _slurm_end(job: WatchedJob) -> str:
        """How a SLURM job ended, from ``scontrol`` while the controller still knows it."""
        state, code = job.state, ""
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            done = _slurm("scontrol", "show", "job", "-o", job.id)
            fields = dict(f.split("=", 1) for f in done.stdout.split() if "=" in f)
            state = fields.get("JobState", state)
            code = f", exit code {fields['ExitCode']}" if "ExitCode" in fields else ""
        return f"(submitit job {job.id}) ended: SLURM job state {state}{code} (log: {job.log()})"


def cancel(job: WatchedJob, wait: float = 5.0) -> None:
    """End ``job`` now, whatever its state; wait up to ``wait`` s for its end to be seen."""
    if job.ended is not None and (not job.slurm or job.state == "GONE"):
        return
    if job.slurm:
        # the ranks ignore SIGTERM (the stop is rank 0's), so a plain scancel would take KillWait
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            _slurm("scancel", "--full", "--signal=KILL", job.id)
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            _slurm("scancel", job.id)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            job.state = _queue_state(job.id)
            if job.state == "GONE":
                break
            time.sleep(0.2)
        job.end(f"(submitit job {job.id}) was cancelled (log: {job.log()})")
        return
    # a local job's id is its controller's pid; done() reaps the controller once it ended
    if not job.job.done():
        for pid in _children(int(job.id)):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if not _ends(job.job, wait):
            with contextlib.suppress(OSError):
                os.kill(int(job.id), signal.SIGKILL)
            _ends(job.job, wait)
    job.end(f"(submitit local job {job.id}) was cancelled (log: {job.log()})")


def _ends(job: Any, timeout: float) -> bool:
    """Whether submitit local job ``job`` is done within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not job.done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _queue_state(job_id: str) -> str:
    """A SLURM job's state in the queue, ``"GONE"`` once it has left it."""
    try:
        done = _slurm("squeue", "-h", "-j", job_id, "-o", "%T")
    except (OSError, subprocess.TimeoutExpired):
        return "UNKNOWN"
    if done.returncode != 0 and "Invalid job id" not in done.stderr:
        return "UNKNOWN"
    return done.stdout.strip() or "GONE"


def _children(pid: int) -> list[int]:
    """The pids of ``pid``'s children (read from /proc)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found.extend(int(p) for p in f.read().split())
    return found
