"""``submitit_delayed_launcher``: the decorated main runs as its own submitit job, and the
collection jobs submitted before it become its collector's ranks (``launcher=
"submitit_delayed"`` inside the main); on submitit's local executor and on a real SLURM
cluster (``tests/slurm/slurm_cluster.py``)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import alive, descendants

from hpccollect.collectors.distributed import (
    DEFAULT_SLURM_CONF,
    DistributedDataCollector,
    submitit_delayed_launcher,
)
from hpccollect.collectors.distributed.default_configs import DEFAULT_SLURM_CONF_MAIN
from hpccollect.errors import ArgumentValueError, JobError

Cluster = Any  # slurm_cluster.Cluster


def collect(ranks: int, total_frames: int) -> dict:
    """The main: a collector over ``ranks`` pre-launched ranks; what it saw."""
    collector = DistributedDataCollector(
        ["CartPole-v1"] * ranks,
        None,
        frames_per_batch=100,
        total_frames=total_frames,
        launcher="submitit_delayed",
        start_timeout=120.0,
    )
    frames = 0
    try:
        for batch in collector:
            assert batch.numel() == 100
            frames += batch.numel()
        seen = {"frames": frames, "pid": os.getpid(), "ranks": len(collector._pool.channels)}
    finally:
        collector.shutdown()
    return seen


def confs(folder: Path, cluster: str) -> dict:
    conf = {"cluster": cluster, "folder": str(folder), "timeout_min": 5}
    return {"submitit_main_conf": conf, "submitit_collection_conf": conf}


def test_arguments_are_checked_when_decorating() -> None:
    with pytest.raises(ArgumentValueError, match="num_jobs must be an int >= 1"):
        submitit_delayed_launcher(num_jobs=0)
    with pytest.raises(ArgumentValueError, match="tcpport must be a port number"):
        submitit_delayed_launcher(num_jobs=1, tcpport="http")
    with pytest.raises(
        ArgumentValueError, match=r"framework must be one of \['distributed', 'rpc'\]"
    ):
        submitit_delayed_launcher(num_jobs=1, framework="mpi")
    with pytest.raises(TypeError, match="submitit_main_conf must be a dict"):
        submitit_delayed_launcher(num_jobs=1, submitit_main_conf=["train"])
    # the defaults ask for what any cluster has: its default partition, one CPU
    assert "slurm_partition" not in DEFAULT_SLURM_CONF | DEFAULT_SLURM_CONF_MAIN


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_main_runs_in_its_own_job_over_the_pre_launched_ranks(tmp_path: Path) -> None:
    before = set(descendants(os.getpid()))
    main = submitit_delayed_launcher(num_jobs=2, **confs(tmp_path, "local"))(collect)
    seen = main(2, 400)
    assert seen["frames"] == 400 and seen["ranks"] == 2
    assert seen["pid"] != os.getpid()  # the main ran in a job, not here
    handoff = next(tmp_path.glob("*/handoff"))
    assert sorted(p.name for p in handoff.iterdir()) == [
        "main.ended", "rank-1.args", "rank-2.args",
    ]  # fmt: skip
    deadline = time.monotonic() + 10
    while set(descendants(os.getpid())) - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in set(descendants(os.getpid())) - before if alive(p)]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_main_asking_for_other_ranks_than_were_launched_fails_and_ends_them(
    tmp_path: Path,
) -> None:
    before = set(descendants(os.getpid()))
    main = submitit_delayed_launcher(num_jobs=1, **confs(tmp_path, "local"))(collect)
    started = time.monotonic()
    with pytest.raises(JobError, match=r"num_jobs=1\) submitted 1 collection job"):
        main(2, 400)
    assert time.monotonic() - started < 120
    deadline = time.monotonic() + 10
    while set(descendants(os.getpid())) - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in set(descendants(os.getpid())) - before if alive(p)]


@pytest.fixture
def cluster(slurm_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Cluster:
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
    monkeypatch.delenv("HPCCOLLECT_SUBMITIT_CLUSTER", raising=False)
    return slurm_cluster


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_on_the_cluster_the_main_and_its_ranks_are_three_slurm_jobs(
    cluster: Cluster, tmp_path: Path
) -> None:
    queued_before = set(cluster.queued())
    main = submitit_delayed_launcher(num_jobs=2, **confs(tmp_path, "slurm"))(collect)
    seen = main(2, 400)
    assert seen["frames"] == 400 and seen["ranks"] == 2
    logs = sorted(p.name for p in tmp_path.glob("*/*_log.err"))
    assert len(logs) == 3, logs  # the main job and two collection jobs
    ids = {name.split("_")[0] for name in logs}
    for job in ids:
        cluster.wait_gone(job, 20)
        assert cluster.job_processes(job) == [], f"processes of job {job} left"
    assert set(cluster.queued()) <= queued_before
