"""``sbatch jobs/collect.sh`` against a real single-node SLURM cluster (see slurm_cluster.py).

The jobs run ``python -m hpccollect collect`` under ``srun --mpi=pmi2``: 3 ranks (rank 0 + 2
collector ranks) for the dataset test, 2 for the SIGTERM tests; they are small (``--collector
sync``, 200-frame batches) to keep the module short on a 2-core machine (about 70 s when it is
quiet; every rank imports torch, so start-up stretches when other work runs).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import mpirun
import numpy as np
import pytest

from hpccollect.storage import open_dataset

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "jobs" / "collect.sh"
Cluster = Any  # slurm_cluster.Cluster: the slurm_cluster fixture
SMALL = ["--collector", "single", "--frames-per-batch", "200", "--seed", "3"]


def _inspect(path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "hpccollect", "inspect", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "integrity         ok" in done.stdout, done.stdout
    return done.stdout


def under(flavour: str) -> dict[str, str]:
    """The environment a job submitted from here needs to run its ranks under MPI
    ``flavour`` (``--export=ALL``, sbatch's default, takes it into the job)."""
    reason = mpirun.skip_reason(flavour)
    if flavour == "mpich" != mpirun.FLAVOUR:  # this process's environment names another MPI
        reason = f"MPICH's case runs from MPICH's processes, not {mpirun.FLAVOUR}'s (suite 1)"
    if reason is not None:
        pytest.skip(reason)
    return {**mpirun.flavour_env(flavour), **mpirun.SRUN_ENVS[flavour]}


#: the MPIs a SLURM job is run under here: suite 1 (MPICH) runs them all, each in its own env
FLAVOURS = pytest.mark.parametrize("flavour", list(mpirun.FLAVOURS))


@pytest.mark.timeout(300)
@FLAVOURS
def test_sbatch_collect_writes_every_rank(
    slurm_cluster: Cluster, tmp_path: Path, flavour: str
) -> None:
    """`sbatch --wait jobs/collect.sh ARGS` runs distributed, under each MPI: every collector
    rank writes its shard, rank 0 the merged view in runs/<name>-<id>/, which `inspect` reads
    whole."""
    args = [*SMALL, "--total-frames", "2000", "--shards", "--quiet"]
    # 25 s on a quiet 2-core machine; 3 ranks importing torch when it is busy
    job, code, text = slurm_cluster.sbatch_wait(
        tmp_path, "t-collect", JOB, *args, timeout=280, **under(flavour)
    )
    assert code == 0, text
    run = tmp_path / "runs" / f"t-collect-{job}"
    out = _inspect(run / "data.h5")
    assert "2000 committed" in out, out
    assert "2 collector rank(s)" in text

    merged = open_dataset(run / "data.h5")
    ids = set(np.unique(merged.episode_ids).tolist())
    shard_ids = []
    for rank in (1, 2):
        shard = open_dataset(run / "data.shards" / f"rank-{rank:04d}.h5")
        assert shard.complete and shard.written_steps > 0, rank
        shard_ids.append(set(np.unique(shard.episode_ids).tolist()))
        shard.close()
    merged.close()
    assert shard_ids[0] and shard_ids[1] and not shard_ids[0] & shard_ids[1]
    assert shard_ids[0] | shard_ids[1] == ids
    slurm_cluster.assert_job_gone(job)


@pytest.mark.timeout(120)
@FLAVOURS
def test_srun_starts_the_ranks_under_each_mpi(slurm_cluster: Cluster, flavour: str) -> None:
    """What jobs/collect.sh's srun line starts, with the environment each MPI needs: every
    rank runs that MPI, and they form one world."""
    code = (
        "from mpi4py import MPI; "
        "print(MPI.COMM_WORLD.size, MPI.Get_library_version().splitlines()[0], flush=True)"
    )
    env = under(flavour)
    plugin = env.get("HPCCOLLECT_SRUN_MPI", "pmi2")
    out = slurm_cluster.run(
        "srun", f"--mpi={plugin}", "-n", "2", sys.executable, "-c", code, timeout=90, **env
    )  # fmt: skip
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 2 and all(line.startswith("2 ") for line in lines), out
    expected = {"mpich": "MPICH", "impi": "Intel(R) MPI", "openmpi": "Open MPI"}[flavour]
    assert all(expected in line for line in lines), out


def _submit(cluster: Cluster, tmp_path: Path, name: str, *args: str) -> tuple[str, Path]:
    """``sbatch jobs/collect.sh`` with 2 tasks (rank 0 + 1 collector rank); the job id and its
    log, once the log shows the first batch (rank 0's first progress line)."""
    (tmp_path / "logs").mkdir()
    job = cluster.run(
        "sbatch", "--parsable", f"--job-name={name}", "--ntasks=2", f"--chdir={tmp_path}",
        *args, HPCCOLLECT_VENV=sys.prefix,
    ).strip().split(";")[0]  # fmt: skip
    log = tmp_path / "logs" / f"{name}-{job}.out"
    deadline = time.monotonic() + 200  # start-up: about 10 s unless the machine is busy
    while not (log.exists() and re.search(r"\] [1-9]\d*/\d+ frames", log.read_text())):
        if time.monotonic() > deadline or job not in cluster.queued():
            cluster.run("scancel", job, check=False)
            pytest.fail(f"no batch within 200 s, or the job ended:\n{log.read_text()}")
        time.sleep(0.3)
    return job, log


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "how",
    [
        pytest.param([], id="steps"),  # every rank gets SIGTERM (`scancel -s TERM` by a user)
        # the shell only, as `--signal=B:TERM@120` does, in a job that may not be requeued
        pytest.param(["--batch"], id="batch-no-requeue"),
    ],
)
def test_scancel_term_keeps_committed_episodes(
    slurm_cluster: Cluster, tmp_path: Path, how: list[str]
) -> None:
    """A job sent SIGTERM mid-run stops after the current batch, exits 0 and keeps every
    committed episode in a complete, readable dataset; it is not requeued."""
    submit = ["--no-requeue"] if how else []
    job, log = _submit(
        slurm_cluster, tmp_path, "t-term", *submit, str(JOB), *SMALL, "--total-frames", "10000000"
    )
    try:
        slurm_cluster.run("scancel", "--signal=TERM", *how, job)
        slurm_cluster.wait_gone(job, timeout=60)
    finally:
        slurm_cluster.run("scancel", job, check=False)
    text = log.read_text()
    assert "stopped early by SIGTERM" in text, text
    assert "collect exited with 0" in text, text
    assert "requeueing" not in text and "(start 1)" not in text, text
    kept = int(re.search(r"episodes kept\s+(\d+)", text).group(1))
    out = _inspect(tmp_path / "runs" / f"t-term-{job}" / "data.h5")
    assert "(complete)" in out, out
    written = re.search(r"^episodes\s+(\d+)", out, re.MULTILINE)
    assert written and int(written.group(1)) == kept > 0, (out, text)
    slurm_cluster.assert_job_gone(job)


@pytest.mark.timeout(420)
def test_the_warning_signal_requeues_the_job_and_it_resumes(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """SLURM's warning before the time limit (``--signal=B:TERM``, sent here with ``scancel
    --batch``): the run stops after its batch, the job requeues itself, and the requeued job
    resumes the run to exactly its total, with its own shards and no episode twice."""
    total = 60_000  # about 10 s on a quiet machine: the stop lands mid-run (with 20k it did not)
    job, log = _submit(
        slurm_cluster, tmp_path, "t-requeue", str(JOB), *SMALL, "--total-frames", str(total),
        "--shards",
    )  # fmt: skip
    try:
        slurm_cluster.run("scancel", "--batch", "--signal=TERM", job)
        deadline = time.monotonic() + 90
        while "Restarts=1" not in slurm_cluster.run("scontrol", "show", "job", job):
            assert time.monotonic() < deadline, f"not requeued:\n{log.read_text()}"
            time.sleep(0.5)
        # the requeued job starts again on its own once the killed attempt's credential expires
        # (the cluster fixture sets cred_expire=10; forcing StartTime=now earlier makes slurmd
        # refuse it)
        slurm_cluster.wait_gone(job, timeout=240)
    finally:
        slurm_cluster.run("scancel", job, check=False)
    text = log.read_text()
    assert "stopped early by SIGTERM" in text and f"requeueing job {job}" in text, text
    before = int(re.search(r"resuming \S+: (\d+) of", text).group(1))
    assert 0 < before < total, text
    assert f"holds {total} of {total} frames" in text, text
    assert text.count("collect exited with 0") == 2, text
    run = tmp_path / "runs" / f"t-requeue-{job}"
    out = _inspect(run / "data.h5")
    assert f"{total} committed" in out, out
    names = sorted(p.name for p in (run / "data.shards").iterdir())
    assert names == ["attempt-1.rank-0001.h5", "rank-0001.h5"], names
    with open_dataset(run / "data.h5") as ds:
        ids = np.asarray(ds.episode_ids)
        order = ids[np.concatenate([[True], ids[1:] != ids[:-1]])]
        assert len(order) == len(np.unique(order)) == ds.committed_episodes
    with open_dataset(run / "data.shards" / "rank-0001.h5") as ds:
        assert len(ds) == before
    slurm_cluster.assert_job_gone(job)
