"""What the run's processes write to the temporary folder goes into one folder of the run's own,
removed when the run ends: nothing a run makes stays behind in ``/tmp`` but pytest's own
``tmp_path`` folders, and no run touches what another run (or anything else on the machine)
keeps there.

Many tests kill a job on purpose (a lost launcher, a lost node, a stopped rank 0, a hung job's
cleanup), and a killed process cleans nothing up. What they would leave:

* A script whose collector started a fork server (``launcher="mp"``) has Python's
  ``multiprocessing`` make ``pymp-XXXXXXXX/listener-XXXXXXXX`` in the temporary folder,
  removed only by the script's own exit. The run's first process points ``TMPDIR`` at
  ``hpcc-XXXXXXXX`` in the machine's temporary folder, so every process the run starts (xdist's
  workers, ranks, jobs) makes its folders there, and removes that folder at the end of the run.
  pytest's ``tmp_path`` stays in ``/tmp/pytest-of-USER`` (``PYTEST_DEBUG_TEMPROOT``), which
  pytest keeps for the last three runs. Looking through ``/tmp`` for such folders instead is
  unsafe: a live process keeps its ``pymp-`` folder after its fork server ended, and runs side
  by side (``tests/all.sh``) would remove each other's.
* MPICH's and Intel MPI's launcher (hydra's proxy) writes the machine's topology to
  ``/tmp/hydra_hwloc_xmlfile_XXXXXX`` (whatever ``TMPDIR`` says) when its ranks' ``MPI_Init``
  asks for it, and deletes it when it exits. A hydra that finds ``HWLOC_XMLFILE`` set writes
  none, so the run's first process copies the file a hydra wrote (for two ranks under MPICH's
  ``mpiexec``) into the run's folder and points ``HWLOC_XMLFILE`` at it, with
  ``HWLOC_THISSYSTEM=1`` (the file describes this machine: Open MPI still binds its ranks).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from multiprocessing.util import Finalize
from pathlib import Path

import pytest

#: run by two ranks: hydra's proxy writes the file once a rank's MPI_Init asks for it (not for
#: a single rank), and keeps it open; the first rank copies it
_COPY = """
import os, shutil, sys
from mpi4py import MPI
if MPI.COMM_WORLD.rank == 0:
    fds = f"/proc/{os.getppid()}/fd"
    for fd in os.listdir(fds):
        path = os.readlink(os.path.join(fds, fd))
        if path.startswith("/tmp/hydra_hwloc_xmlfile_"):
            shutil.copyfile(path, sys.argv[1])
"""

#: what the run changes in its environment, restored at its end
_SET = ("TMPDIR", "PYTEST_DEBUG_TEMPROOT", "HWLOC_XMLFILE", "HWLOC_THISSYSTEM")
_RUN = pytest.StashKey[tuple[Path, dict[str, str | None]]]()


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # an xdist worker: it inherits the environment of the run's first process
    folder = Path(tempfile.mkdtemp(prefix="hpcc-"))
    config.stash[_RUN] = (folder, {name: os.environ.get(name) for name in _SET})
    # pytest's own tmp_path stays where it was: kept after the run for a failed test's files,
    # and short (the SLURM tests' sockets live there, within AF_UNIX's 108 bytes)
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = None  # tempfile caches the folder it found first
    if not os.environ.get("HWLOC_XMLFILE"):  # else set by the user
        _share_a_topology(folder / "topology.xml")


def _share_a_topology(topology: Path) -> None:
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    if mpiexec is None:
        return  # no MPI job can start
    job = subprocess.Popen(
        [mpiexec, "-n", "2", sys.executable, "-c", _COPY, str(topology)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # MPICH's own library, whatever MPI the run's jobs use (tests/mpirun.py)
        env={k: v for k, v in os.environ.items() if k != "MPI4PY_LIBMPI"},
        start_new_session=True,  # a job past its time is killed with its proxy
    )
    try:
        job.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=10)
    if topology.exists():  # else jobs write their own, as without this module
        os.environ["HWLOC_XMLFILE"] = str(topology)
        os.environ["HWLOC_THISSYSTEM"] = "1"


def pytest_unconfigure(config: pytest.Config) -> None:
    run = config.stash.get(_RUN, None)
    if run is None:
        return
    folder, before = run
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    tempfile.tempdir = None
    # after multiprocessing's own clean-up at exit, which removes this process's ``pymp-``
    # folder in there (a run without xdist workers starts fork servers itself) and raises
    # where it is gone already
    Finalize(None, shutil.rmtree, (folder,), {"ignore_errors": True}, exitpriority=-200)
