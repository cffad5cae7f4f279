"""What the suite's processes would leave in ``/tmp``: none of it stays after a run.

Many tests kill a job on purpose (a lost launcher, a lost node, a stopped rank 0, a hung job's
cleanup), and a killed process cleans nothing up:

* MPICH's and Intel MPI's launcher (hydra's proxy) writes the machine's topology to
  ``/tmp/hydra_hwloc_xmlfile_XXXXXX`` when its ranks' ``MPI_Init`` asks for it, and deletes it
  when it exits. A hydra that finds ``HWLOC_XMLFILE`` set writes none, so the run's first
  process makes one copy of the file a hydra wrote (for two ranks under MPICH's ``mpiexec``), in
  a folder of its own, points ``HWLOC_XMLFILE`` at it for every process the run starts, and
  removes it at the end (19 files a CI run before).
* A script whose collector started a fork server (``launcher="mp"``) has Python's
  ``multiprocessing`` make ``/tmp/pymp-XXXXXXXX/listener-XXXXXXXX``, removed at the script's
  exit. At the end of the run, each such folder made during it whose socket no longer has a
  server (another run's live fork server answers) is removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
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


_FOLDER = pytest.StashKey[Path]()
_STARTED = pytest.StashKey[float]()


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # an xdist worker: its parent, the run's first process, does this
    config.stash[_STARTED] = time.time()
    if not os.environ.get("HWLOC_XMLFILE"):  # else set by the user
        _share_a_topology(config)


def _share_a_topology(config: pytest.Config) -> None:
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    if mpiexec is None:
        return  # no MPI job can start
    folder = Path(tempfile.mkdtemp(prefix="hpccollect-topology-"))
    topology = folder / "topology.xml"
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(
            [mpiexec, "-n", "2", sys.executable, "-c", _COPY, str(topology)],
            capture_output=True,
            timeout=60,
            # MPICH's own library, whatever MPI the run's jobs use (tests/mpirun.py)
            env={k: v for k, v in os.environ.items() if k != "MPI4PY_LIBMPI"},
            check=False,
        )
    if not topology.exists():  # jobs then write their own, as without this module
        shutil.rmtree(folder, ignore_errors=True)
        return
    os.environ["HWLOC_XMLFILE"] = str(topology)
    config.stash[_FOLDER] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_FOLDER, None)
    if folder is not None:
        os.environ.pop("HWLOC_XMLFILE", None)
        shutil.rmtree(folder, ignore_errors=True)
    started = config.stash.get(_STARTED, None)
    if started is not None:
        for made in Path(tempfile.gettempdir()).glob("pymp-*"):
            if _a_dead_fork_servers(made, started):
                shutil.rmtree(made, ignore_errors=True)


def _a_dead_fork_servers(folder: Path, since: float) -> bool:
    """Whether ``folder`` was made after ``since`` and holds nothing but fork-server sockets
    that no process has open (a live one is listed in ``/proc/net/unix``: connecting to it to
    find out would end it, as a fork server takes any connection for a fork request)."""
    try:
        if folder.stat().st_mtime < since:
            return False
        entries = list(folder.iterdir())
        bound = Path("/proc/net/unix").read_text()
    except OSError:
        return False
    named = [e for e in entries if e.name.startswith("listener-")]
    return bool(entries) and named == entries and not any(str(e) in bound for e in named)
