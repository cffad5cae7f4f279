"""``launcher="submitit"`` and ``"submitit_delayed"``: real submitit jobs, on submitit's local
executor and on a real single-node SLURM cluster (``tests/slurm/slurm_cluster.py``)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from hpccollect.distributed.collector import DistributedDataCollector
from hpccollect.errors import (
    ArgumentTypeError,
    ArgumentValueError,
    CollectorTimeoutError,
    WorkerError,
)
from hpccollect.launchers import get_launcher
from hpccollect.launchers.submitit import SubmititLauncher

Cluster = Any  # slurm_cluster.Cluster


def _collector(folder: Path, launcher: str = "submitit", **kwargs: Any) -> Any:
    slurm_kwargs = {"folder": str(folder), **kwargs.pop("slurm_kwargs", {})}
    return DistributedDataCollector(
        ["CartPole-v1", "CartPole-v1"],
        None,
        frames_per_batch=kwargs.pop("frames_per_batch", 100),
        total_frames=kwargs.pop("total_frames", 400),
        launcher=launcher,
        slurm_kwargs=slurm_kwargs,
        start_timeout=kwargs.pop("start_timeout", 120.0),
        **kwargs,
    )


def _check_batches(collector: Any) -> int:
    frames = 0
    for batch in collector:
        assert batch.shape == (2, 50)
        assert batch["next", "observation"].shape == (2, 50, 4)
        assert (batch["action"].sum(-1) == 1).all()  # one-hot CartPole actions
        frames += batch.numel()
    return frames


def _log_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*/*_log.err"))


# ---------------------------------------------------------------------- arguments
def test_bad_slurm_kwargs_are_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ArgumentTypeError, match="slurm_kwargs"):
        get_launcher("submitit", slurm_kwargs=["slurm_partition", "cpu"])  # type: ignore[arg-type]
    with pytest.raises(ArgumentValueError, match="slurm_kwargs.*bogus_key"):
        _collector(tmp_path, slurm_kwargs={"cluster": "local", "bogus_key": 1})
    with pytest.raises(ArgumentValueError, match="slurm_kwargs.*timeout_min"):
        _collector(tmp_path, slurm_kwargs={"cluster": "local", "timeout_min": "ten"})
    with pytest.raises(ArgumentValueError, match=r"slurm_kwargs\['cluster'\]"):
        _collector(tmp_path, slurm_kwargs={"cluster": "kubernetes"})
    with pytest.raises(ArgumentTypeError, match=r"slurm_kwargs\['folder'\]"):
        get_launcher("submitit", slurm_kwargs={"cluster": "local", "folder": 3})
    assert list(tmp_path.iterdir()) == []  # no job, no run folder


def test_local_executor_without_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch: a workstation
    monkeypatch.delenv("HPCCOLLECT_SUBMITIT_CLUSTER", raising=False)
    launcher = get_launcher("submitit", slurm_kwargs={"folder": str(tmp_path / "jobs")})
    assert isinstance(launcher, SubmititLauncher)
    assert (launcher.cluster, launcher.address(), launcher.shares_host) == (
        "local",
        "127.0.0.1",
        True,
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_collects_through_the_local_executor(tmp_path: Path) -> None:
    collector = _collector(tmp_path, slurm_kwargs={"cluster": "local"}, sync=True)
    try:
        assert _check_batches(collector) == 400
        jobs = collector.launcher.jobs
        assert len(jobs) == 2 and len({job.job_id for job in jobs}) == 2
    finally:
        collector.shutdown()
    assert all(job._process.poll() is not None for job in jobs)  # no controller left
    assert len(_log_files(tmp_path)) == 2


#: an env maker whose module, in a job's process, writes at exit how many objects were frozen
_ENV_MAKER = """
import atexit, gc, os
import gymnasium as gym

def _said():
    with open(os.path.join({folder!r}, f"frozen-{{os.getpid()}}"), "w") as f:
        f.write(str(gc.get_freeze_count()))

if os.getpid() != {test_pid}:
    atexit.register(_said)

def make():
    return gym.make("CartPole-v1")
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("launcher", ["submitit", "submitit_delayed"])
def test_env_makers_from_the_callers_path_load_in_the_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: str
) -> None:
    """An env maker from a module found through a path the caller added (a script's directory,
    ``sys.path.insert``) loads in the jobs, as it does in ``launcher="mp"``'s processes. Each
    job's rank ends without Python's last collection over torch's objects: at its exit it has
    frozen them (``hpccollect/_exit.py``)."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "hpc_local_envs.py").write_text(
        _ENV_MAKER.format(folder=str(tmp_path), test_pid=os.getpid())
    )
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    import hpc_local_envs

    collector = DistributedDataCollector(
        [hpc_local_envs.make, hpc_local_envs.make],
        None,
        frames_per_batch=100,
        total_frames=200,
        sync=True,
        launcher=launcher,
        slurm_kwargs={"folder": str(tmp_path / "jobs"), "cluster": "local"},
        start_timeout=120.0,
    )
    try:
        assert _check_batches(collector) == 200
        jobs = collector.launcher.jobs
    finally:
        collector.shutdown()
    assert all(job._process.poll() is not None for job in jobs)
    frozen = [int(path.read_text()) for path in tmp_path.glob("frozen-*")]
    assert len(frozen) == 2 and min(frozen) > 10_000, frozen


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_killed_local_job_is_reported(tmp_path: Path) -> None:
    collector = _collector(tmp_path, slurm_kwargs={"cluster": "local"}, sync=True, total_frames=-1)
    try:
        jobs = collector.launcher.jobs
        batches = iter(collector)
        next(batches)
        controller = jobs[0]._process.pid
        children = Path(f"/proc/{controller}/task/{controller}/children").read_text().split()
        assert children, "the local job's controller runs no task"
        os.kill(int(children[0]), signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(WorkerError) as caught:
            for _ in range(10_000):
                next(batches)
        assert time.monotonic() - killed < 30
        text = str(caught.value)
        assert f"submitit local job {jobs[0].job_id}" in text and "_0_log.err" in text, text
    finally:
        collector.shutdown()
    assert all(job._process.poll() is not None for job in jobs)


# ---------------------------------------------------------------------- the local cluster
@pytest.fixture
def cluster(slurm_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Cluster:
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
    monkeypatch.delenv("HPCCOLLECT_SUBMITIT_CLUSTER", raising=False)
    return slurm_cluster


def _assert_nothing_left(cluster: Cluster, ids: list[str]) -> None:
    for job in ids:
        cluster.wait_gone(job, 20)
        assert cluster.job_processes(job) == [], f"processes of job {job} left"


def _slurm_ids(collector: Any) -> list[str]:
    ids = [str(job.job_id) for job in collector.launcher.jobs]
    assert collector.launcher.cluster == "slurm" and ids
    return ids


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("launcher", ["submitit", "submitit_delayed"])
def test_collects_on_the_cluster(cluster: Cluster, tmp_path: Path, launcher: str) -> None:
    collector = _collector(tmp_path, launcher, sync=False, total_frames=600)
    try:
        ids = _slurm_ids(collector)
        assert len(ids) == (1 if launcher == "submitit_delayed" else 2)
        assert sorted(cluster.queued()) == sorted(ids)
        frames = 0
        for batch in collector:
            frames += batch.numel()
        assert frames == 600
    finally:
        collector.shutdown()
    _assert_nothing_left(cluster, ids)


def _task_pids(cluster: Cluster, job: str, task: int) -> list[int]:
    """The python processes of task ``task`` of SLURM job ``job`` (submitit's task runner)."""
    found = []
    for pid in cluster.job_processes(job):
        proc = Path(f"/proc/{pid}")
        try:
            runs_task = b"submitit.core._submit" in (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if runs_task and f"SLURM_PROCID={task}".encode() in environ:
            found.append(pid)
    return found


def _kill_mid_run(cluster: Cluster, tmp_path: Path, how: str, launcher: str = "submitit") -> None:
    """Kill collector rank 2 after the first batch (its job, or its task of the shared job):
    the collector raises within seconds, naming the job and the rank's log."""
    collector = _collector(tmp_path, launcher, sync=True, total_frames=-1)
    try:
        ids = _slurm_ids(collector)
        batches = iter(collector)
        next(batches)
        victim, task = (ids[0], 1) if launcher == "submitit_delayed" else (ids[1], 0)
        if how == "scancel":
            cluster.run("scancel", victim)
        else:
            pids = _task_pids(cluster, victim, task)
            assert pids, f"no python process of task {task} of job {victim}"
            hit = 0
            for pid in pids:  # one may have ended meanwhile (a child between fork and exec)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    hit += 1
            assert hit, f"every python process of task {task} of job {victim} had ended"
        killed = time.monotonic()
        with pytest.raises(WorkerError) as caught:
            for _ in range(10_000):
                next(batches)
        # well within 30 s, and before KillWait (10 s here) would end a rank that ignored SIGTERM
        assert time.monotonic() - killed < 8
        text = str(caught.value)
        assert f"submitit job {victim}" in text and f"{victim}_{task}_log.err" in text, text
    finally:
        collector.shutdown()
    _assert_nothing_left(cluster, ids)


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_scancelled_job_is_reported(cluster: Cluster, tmp_path: Path) -> None:
    _kill_mid_run(cluster, tmp_path, "scancel")


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigkilled_job_process_is_reported(cluster: Cluster, tmp_path: Path) -> None:
    _kill_mid_run(cluster, tmp_path, "sigkill")


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigkilled_task_of_the_shared_job_is_reported(cluster: Cluster, tmp_path: Path) -> None:
    """submitit_delayed: one task of the one job dies while the other still runs."""
    _kill_mid_run(cluster, tmp_path, "sigkill", launcher="submitit_delayed")


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_job_pending_past_start_timeout(cluster: Cluster, tmp_path: Path) -> None:
    later = {"slurm_additional_parameters": {"begin": "now+1hour"}}  # stays PENDING
    started = time.monotonic()
    with pytest.raises((WorkerError, CollectorTimeoutError)) as caught:
        _collector(tmp_path, slurm_kwargs=later, start_timeout=5.0)
    assert time.monotonic() - started < 30
    text = str(caught.value)
    assert "stayed PENDING" in text and "_0_log.err" in text, text
    assert cluster.queued() == []  # cancelled
