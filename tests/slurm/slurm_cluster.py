"""A real single-node SLURM cluster for the ``slurm`` tests, started by ``slurm/up.sh``.

The cluster is private to the test session (its own state directory and ports), so it never
meets a developer's own cluster. In CI (``CI`` set) it must start: a failure fails the tests; on
a developer machine that cannot start it (not root, no apt-get) the tests skip, saying why.
``slurm/down.sh`` always runs at teardown, after checking that no job was left queued; the
state directory (logs) stays in pytest's temporary directory.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UP, DOWN = REPO / "slurm" / "up.sh", REPO / "slurm" / "down.sh"


@dataclass
class Cluster:
    """A running cluster: ``env`` is what its commands need (``SLURM_CONF``, no job's vars)."""

    state: Path
    env: dict[str, str]

    def run(self, *cmd: str, timeout: float = 30, check: bool = True, **env: str) -> str:
        """A SLURM command (``squeue``, ``scancel``, ...) against this cluster, with ``env``
        added to its environment; its stdout."""
        done = subprocess.run(
            cmd,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr}")
        return done.stdout

    def queued(self) -> list[str]:
        """Ids of the jobs still queued or running."""
        return self.run("squeue", "-h", "-o", "%A").split()

    def wait_gone(self, job: str, timeout: float) -> None:
        """Wait until ``job`` has left the queue (bounded)."""
        deadline = time.monotonic() + timeout
        while job in self.queued():
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job} still queued after {timeout} s")
            time.sleep(0.5)

    def sbatch_wait(
        self,
        cwd: Path,
        name: str,
        script: Path,
        *args: str,
        options: tuple[str, ...] = (),
        timeout: float = 260,
        **env: str,
    ) -> tuple[str, int, str]:
        """``sbatch --wait OPTIONS --job-name=NAME SCRIPT ARGS`` from ``cwd``, with this venv
        (and ``env``): the job id, sbatch's exit code, and its stderr followed by the job's log
        (``logs/NAME-ID.out``, as the project's job scripts write it)."""
        (cwd / "logs").mkdir(exist_ok=True)
        done = subprocess.run(
            ["sbatch", "--wait", "--parsable", *options, f"--job-name={name}", str(script), *args],
            cwd=cwd,
            env={**self.env, "HPCCOLLECT_VENV": sys.prefix, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        job = done.stdout.strip().split(";")[0]
        assert job, done.stderr
        log = cwd / "logs" / f"{name}-{job}.out"
        return job, done.returncode, f"{done.stderr}\n{log.read_text() if log.exists() else ''}"

    def assert_job_gone(self, job: str, timeout: float = 15) -> None:
        """``job`` has left the queue, and no process of it is left (waited for, bounded)."""
        assert job not in self.queued()
        deadline = time.monotonic() + timeout
        while (left := self.job_processes(job)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"processes of job {job} still running: {left}"

    def job_processes(self, job: str) -> list[int]:
        """Pids of processes that belong to ``job`` of this cluster (read from /proc)."""
        marks = (f"SLURM_JOB_ID={job}".encode(), f"SLURM_CONF={self.env['SLURM_CONF']}".encode())
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if all(mark in environ for mark in marks):
                pids.append(int(entry.name))
        return pids


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_env() -> dict[str, str]:
    """This process's environment without the variables of a job or MPI launcher around it."""
    drop = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PMI_", "OMPI_", "MPI_", "HYDRA_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Start a private single-node cluster with ``slurm/up.sh``; always stop it with
    ``slurm/down.sh``."""
    yield from _cluster(tmp_path_factory)


@pytest.fixture(scope="module")
def slurm_nodes_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A private cluster over two simulated nodes (``slurm/up.sh --nodes 2``: one slurmd in
    each of node1 and node2, slurmctld here); ``slurm/down.sh`` stops the daemons and removes
    the nodes, and nothing of either may be left."""
    cluster = None
    for cluster in _cluster(tmp_path_factory, "--nodes", "2"):
        yield cluster
    assert cluster is not None
    assert not list((cluster.state / "run").glob("*.pid")), "a daemon's pid file is left"
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "hpcc-" not in netns, netns
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "hpcc0" not in links and "hpcc-v" not in links
    assert "hpccollect simulated nodes" not in Path("/etc/hosts").read_text()
    assert not Path("/run/hpccollect-nodes").exists()


def _cluster(tmp_path_factory: pytest.TempPathFactory, *up_args: str) -> Iterator[Cluster]:
    """``slurm/up.sh UP_ARGS`` on a state directory and ports of its own; the cluster, then
    ``slurm/down.sh`` (after checking that no job was left queued); the state directory (logs)
    stays in pytest's temporary directory."""
    state = tmp_path_factory.mktemp("slurm", numbered=True)
    env = _clean_env()
    env.update(
        HPCCOLLECT_SLURM_DIR=str(state),
        HPCCOLLECT_SLURM_CTLD_PORT=str(_free_port()),
        HPCCOLLECT_SLURM_SLURMD_PORT=str(_free_port()),
        # a requeued job is held this long (+1 s) before it starts again: the requeue test
        # waits it out (SLURM refuses values under 5)
        HPCCOLLECT_SLURM_CRED_EXPIRE="10",
    )
    try:
        up = subprocess.run(
            ["bash", str(UP), *up_args],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        failure = None if up.returncode == 0 else f"slurm/up.sh exited {up.returncode}"
        detail = up.stderr.strip()[-2000:]
    except subprocess.TimeoutExpired:
        failure, detail = "slurm/up.sh did not finish in 240 s", ""
    try:
        if failure:
            if os.environ.get("CI"):
                pytest.fail(f"{failure} (CI needs the cluster):\n{detail}")
            pytest.skip(f"no SLURM cluster on this machine: {failure}: {detail[-300:]}")
        for line in up.stdout.splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = value
        assert env.get("SLURM_CONF"), f"slurm/up.sh printed no SLURM_CONF: {up.stdout!r}"
        cluster = Cluster(state, env)
        yield cluster
        left = cluster.queued()
        if left:  # ended before the daemons stop, or their job steps would outlive them
            cluster.run("scancel", "--full", *left, check=False)
            for job in left:
                with contextlib.suppress(AssertionError):
                    cluster.wait_gone(job, 30)
        assert not left, f"jobs left queued after the slurm tests: {left}"
    finally:
        down = subprocess.run(
            ["bash", str(DOWN)], env=env, timeout=120, capture_output=True, text=True
        )
    assert down.returncode == 0, down.stderr
