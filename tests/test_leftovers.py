"""The suite's own plugin ``tests/leftovers.py``: a run's temporary files stay in a folder of its
own, which is gone when the run ends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

#: a test that leaves what a killed fork server and a killed job would, and reports where
_LEAVES = """
import multiprocessing.util, os, tempfile
from pathlib import Path

def test_leaves_files():
    Path(multiprocessing.util.get_temp_dir(), "listener-0").write_text("")
    Path(tempfile.mkdtemp(), "partial.h5").write_text("")
    seen = [os.environ.get(k, "") for k in ("TMPDIR", "HWLOC_XMLFILE", "HWLOC_THISSYSTEM")]
    Path(os.environ["SEEN"]).write_text("|".join(seen))
"""


@pytest.mark.timeout(120)
def test_a_run_leaves_nothing_in_the_temporary_folder(tmp_path: Path) -> None:
    """A run on a worker of xdist's: its processes see a ``TMPDIR`` of the run's own below the
    one they were given (and the topology file there, when MPICH's ``mpiexec`` is installed);
    what the test left there is gone when the run ends, and the outer folder holds nothing but
    pytest's own ``tmp_path`` root."""
    outer, tests = tmp_path / "tmp", tmp_path / "tests"
    outer.mkdir()
    tests.mkdir()
    (tests / "test_leave.py").write_text(_LEAVES)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HWLOC_", "PYTEST_"))}
    env.update(
        TMPDIR=str(outer), PYTHONPATH=str(Path(__file__).parent), SEEN=str(tmp_path / "seen")
    )
    run = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "leftovers", "-p", "no:cacheprovider"),
            *("-n", "1", "-q", "--rootdir", str(tests), "-c", os.devnull, str(tests)),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    folder, topology, this_system = (tmp_path / "seen").read_text().split("|")
    assert Path(folder).parent == outer and Path(folder).name.startswith("hpcc-")
    mpich = os.path.exists(os.path.join(os.path.dirname(sys.executable), "mpiexec"))
    if mpich:
        assert topology == os.path.join(folder, "topology.xml") and this_system == "1"
    # what stays: pytest's own tmp_path root, which pytest keeps for the last three runs
    assert [p.name for p in outer.iterdir() if not p.name.startswith("pytest-of-")] == []
