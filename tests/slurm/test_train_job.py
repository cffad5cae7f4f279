"""``sbatch --wait jobs/train.sh`` against a real single-node SLURM cluster (see slurm_cluster.py):
3 ranks under ``srun --mpi=pmi2`` run examples/ppo_distributed.py with launcher="mpi"; rank 0
trains PPO and the learning curve lands in runs/<job name>-<job id>/.
"""

# ruff: noqa: F811  (the imported slurm_cluster fixture, taken as an argument)
from __future__ import annotations

import csv
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

# the fixture lives in slurm_cluster.py: a conftest.py here would shadow tests/conftest.py, which
# other test modules import as ``conftest``
from slurm_cluster import slurm_cluster  # noqa: F401

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "jobs" / "train.sh"
SCRIPT = REPO / "examples" / "ppo_distributed.py"
Cluster = Any  # slurm_cluster.Cluster: the slurm_cluster fixture


@pytest.mark.timeout(300)
def test_sbatch_train_learns(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """24k frames, seed 0: the job exits 0, its log ends with the final line (a mean return well
    above a random policy's 22), curve.csv and curve.png are in the run directory, and the job
    leaves nothing queued and no process behind."""
    (tmp_path / "logs").mkdir()
    args = ["--total-frames", "24000", "--frames-per-batch", "2000", "--seed", "0"]
    done = subprocess.run(
        ["sbatch", "--wait", "--parsable", "--job-name=t-train", str(JOB), *args],
        cwd=tmp_path,
        # this venv, and the repository's script (the job runs in tmp_path)
        env={
            **slurm_cluster.env,
            "HPCCOLLECT_VENV": sys.prefix,
            "HPCCOLLECT_TRAIN_SCRIPT": str(SCRIPT),
        },
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    job = done.stdout.strip().split(";")[0]
    log = tmp_path / "logs" / f"t-train-{job}.out"
    text = log.read_text() if log.exists() else ""
    assert done.returncode == 0, f"{done.stderr}\n{text}"
    finals = re.findall(r"^final mean return (\d+\.\d) over (\d+) frames$", text, re.M)
    assert len(finals) == 1, text  # rank 0 only
    assert finals[0][1] == "24000" and float(finals[0][0]) > 80, text
    run = tmp_path / "runs" / f"t-train-{job}"
    with open(run / "curve.csv", newline="") as f:
        assert len(list(csv.reader(f))) == 1 + 12  # header + one row per 2000-frame batch
    assert (run / "curve.png").read_bytes()[:4] == b"\x89PNG"
    assert "training exited with 0" in text

    assert job not in slurm_cluster.queued()
    deadline = time.monotonic() + 15
    while (left := slurm_cluster.job_processes(job)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes of job {job} still running: {left}"


@pytest.mark.timeout(120)
def test_sbatch_train_without_script_fails(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """Submitted from a directory without the script (and no HPCCOLLECT_TRAIN_SCRIPT): exit 2
    with a line saying where it looked and what to do."""
    (tmp_path / "logs").mkdir()
    done = subprocess.run(
        ["sbatch", "--wait", "--parsable", "--job-name=t-noscript", str(JOB)],
        cwd=tmp_path,
        env={**slurm_cluster.env, "HPCCOLLECT_VENV": sys.prefix},
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    job = done.stdout.strip().split(";")[0]
    text = (tmp_path / "logs" / f"t-noscript-{job}.out").read_text()
    assert done.returncode != 0
    assert f"no training script at {tmp_path}/examples/ppo_distributed.py" in text
    assert "HPCCOLLECT_TRAIN_SCRIPT" in text
    assert job not in slurm_cluster.queued()
