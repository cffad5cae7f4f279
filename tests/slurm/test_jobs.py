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

import numpy as np
import pytest

# the fixture lives in slurm_cluster.py: a conftest.py here would shadow tests/conftest.py, which
# other test modules import as ``conftest``
from slurm_cluster import slurm_cluster  # noqa: F401

from hpccollect.storage import open_dataset

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "jobs" / "collect.sh"
Cluster = Any  # slurm_cluster.Cluster: the slurm_cluster fixture
SMALL = ["--collector", "sync", "--frames-per-batch", "200", "--seed", "3"]


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


def _assert_no_process_left(cluster: Cluster, job: str) -> None:
    deadline = time.monotonic() + 15
    while (left := cluster.job_processes(job)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes of job {job} still running: {left}"


@pytest.mark.timeout(300)
def test_sbatch_collect_writes_every_rank(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """`sbatch --wait jobs/collect.sh ARGS` runs distributed: every collector rank writes its
    shard, rank 0 the merged view in runs/<name>-<id>/, which `inspect` reads whole."""
    (tmp_path / "logs").mkdir()
    args = [*SMALL, "--total-frames", "2000", "--shards", "--quiet"]
    done = subprocess.run(
        ["sbatch", "--wait", "--parsable", "--job-name=t-collect", str(JOB), *args],
        cwd=tmp_path,
        env={**slurm_cluster.env, "HPCCOLLECT_VENV": sys.prefix},  # this venv
        capture_output=True,
        text=True,
        timeout=280,  # 25 s on a quiet 2-core machine; 3 ranks importing torch when it is busy
        check=False,
    )
    job = done.stdout.strip().split(";")[0]
    log = tmp_path / "logs" / f"t-collect-{job}.out"
    assert done.returncode == 0, f"{done.stderr}\n{log.read_text() if log.exists() else ''}"
    run = tmp_path / "runs" / f"t-collect-{job}"
    out = _inspect(run / "data.h5")
    assert "2000 committed" in out, out
    assert "2 collector rank(s)" in log.read_text()

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
    assert job not in slurm_cluster.queued()
    _assert_no_process_left(slurm_cluster, job)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "how",
    [
        pytest.param([], id="steps"),  # every rank gets SIGTERM (preemption, `scancel -s TERM`)
        pytest.param(["--batch"], id="batch"),  # the shell only, as `--signal=B:TERM@120` does
    ],
)
def test_scancel_term_keeps_committed_episodes(
    slurm_cluster: Cluster, tmp_path: Path, how: list[str]
) -> None:
    """A job sent SIGTERM mid-run stops after the current batch, exits 0 and keeps every
    committed episode in a complete, readable dataset."""
    (tmp_path / "logs").mkdir()
    job = slurm_cluster.run(
        "sbatch", "--parsable", "--job-name=t-term", "--ntasks=2", f"--chdir={tmp_path}", str(JOB),
        *SMALL, "--total-frames", "10000000", HPCCOLLECT_VENV=sys.prefix,
    ).strip().split(";")[0]  # fmt: skip
    log = tmp_path / "logs" / f"t-term-{job}.out"
    try:
        deadline = time.monotonic() + 200  # start-up: about 10 s unless the machine is busy
        # Rank 0 prints a progress line once the first batch is in: collecting has begun.
        while not (log.exists() and re.search(r"\d+/10000000 frames", log.read_text())):
            assert time.monotonic() < deadline, f"no batch within 200 s:\n{log.read_text()}"
            assert job in slurm_cluster.queued(), f"job ended early:\n{log.read_text()}"
            time.sleep(0.3)
        slurm_cluster.run("scancel", "--signal=TERM", *how, job)
        slurm_cluster.wait_gone(job, timeout=60)
    finally:
        slurm_cluster.run("scancel", job, check=False)
    text = log.read_text()
    assert "stopped early by SIGTERM" in text, text
    assert "collect exited with 0" in text, text
    kept = int(re.search(r"episodes kept\s+(\d+)", text).group(1))
    out = _inspect(tmp_path / "runs" / f"t-term-{job}" / "data.h5")
    assert "(complete)" in out, out
    written = re.search(r"^episodes\s+(\d+)", out, re.MULTILINE)
    assert written and int(written.group(1)) == kept > 0, (out, text)
    _assert_no_process_left(slurm_cluster, job)
