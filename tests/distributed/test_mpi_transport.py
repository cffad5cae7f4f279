"""The mpi4py transport itself (``MPIGroup``) under a real ``mpiexec -n 2``: the batch hot path
moves headers, batches and multi-megabyte transfers intact, a look with nothing there returns at
once, a closed peer's goodbye ends receives from it, and nothing stays inside MPI at the end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_mpi import MPIEXEC, assert_gone, job_pids, run_job

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.usefixtures("no_mpich_segments_left")]
if MPIEXEC is None and not os.environ.get("CI"):  # in CI the test runs, and fails
    pytestmark.append(pytest.mark.skip(reason="no mpiexec next to this Python (pip install mpich)"))

JOB = Path(__file__).with_name("transport_job.py")


@pytest.mark.timeout(120)
def test_the_hot_path_moves_every_size_and_ends_on_goodbye(tmp_path):
    out = tmp_path / "out"
    code, output, seconds = run_job(out, ranks=2, timeout=90, job=JOB)
    assert code == 0, output
    for line in ("ok nothing to receive", "ok messages", "ok goodbye", "ok quiesced"):
        assert line in output, output
    assert len(job_pids(out)) == 2
    assert_gone(job_pids(out))
    assert seconds < 60, f"the job took {seconds:.1f} s"
