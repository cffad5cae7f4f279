"""``sbatch --wait jobs/train.sh`` against a real single-node SLURM cluster (see slurm_cluster.py):
3 ranks under ``srun --mpi=pmi2`` run examples/ppo_distributed.py with launcher="mpi"; rank 0
trains PPO and the learning curve lands in runs/<job name>-<job id>/.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import pytest

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
    args = ["--total-frames", "24000", "--frames-per-batch", "2000", "--seed", "0"]
    # the repository's script: the job runs in tmp_path
    job, code, text = slurm_cluster.sbatch_wait(
        tmp_path, "t-train", JOB, *args, timeout=280, HPCCOLLECT_TRAIN_SCRIPT=str(SCRIPT)
    )
    assert code == 0, text
    finals = re.findall(r"^final mean return (\d+\.\d) over (\d+) frames$", text, re.M)
    assert len(finals) == 1, text  # rank 0 only
    assert finals[0][1] == "24000" and float(finals[0][0]) > 80, text
    run = tmp_path / "runs" / f"t-train-{job}"
    with open(run / "curve.csv", newline="") as f:
        assert len(list(csv.reader(f))) == 1 + 12  # header + one row per 2000-frame batch
    assert (run / "curve.png").read_bytes()[:4] == b"\x89PNG"
    assert "training exited with 0" in text
    slurm_cluster.assert_job_gone(job)


@pytest.mark.timeout(120)
def test_sbatch_train_without_script_fails(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """Submitted from a directory without the script (and no HPCCOLLECT_TRAIN_SCRIPT): exit 2
    with a line saying where it looked and what to do."""
    job, code, text = slurm_cluster.sbatch_wait(tmp_path, "t-noscript", JOB, timeout=100)
    assert code != 0
    assert f"no training script at {tmp_path}/examples/ppo_distributed.py" in text
    assert "HPCCOLLECT_TRAIN_SCRIPT" in text
    assert job not in slurm_cluster.queued()
