"""``LinkLook`` (rank 0's one look at all its mpi4py links) under a real ``mpiexec -n 4``:
what came from any rank is found, a message its link cannot take yet does not hide those
behind it, each message comes once and in order, a goodbye ends its link whichever look took
it, and a pool of enough links waits through it."""

from __future__ import annotations

from pathlib import Path

import mpirun
import pytest

JOB = Path(__file__).with_name("link_look_job.py")


@pytest.mark.mpi
@pytest.mark.anympi
@mpirun.needs()
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_mpich_segments_left")
def test_rank_0_waits_for_its_links_through_one_look(tmp_path):
    code, output, _ = mpirun.run(JOB, tmp_path / "out", ranks=4, timeout=90)
    assert code == 0, output
    for line in (
        "ok a wait with nothing for it ends empty at its timeout",
        "ok a link holding a message is found by each wait for it",
        "ok a message behind one its link cannot take yet is found",
        "ok a link's messages come each once, in order",
        "ok a goodbye ends its link, whichever look took it",
        "ok a pool of enough links waits through their look",
        "ok a link with a bell of its own leaves the look",
    ):
        assert line in output, output
