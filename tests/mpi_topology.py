"""One hwloc topology file for every MPI job the suite starts.

MPICH's and Intel MPI's launcher (hydra's proxy) writes the machine's topology to
``/tmp/hydra_hwloc_xmlfile_XXXXXX`` when its ranks' ``MPI_Init`` asks for it, and deletes it
when it exits, but not when it is killed, as many tests do on purpose (a lost launcher, a lost node, a
hung job's cleanup): each such test left a file in ``/tmp``. A hydra that finds
``HWLOC_XMLFILE`` set writes none, so the run's first process makes one copy of the file a
hydra wrote (for two ranks under MPICH's ``mpiexec``), in a folder of its own, points
``HWLOC_XMLFILE`` at it for every process the run starts, and removes it at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
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


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("HWLOC_XMLFILE") or hasattr(config, "workerinput"):
        return  # set by the user, or by this run's first process (an xdist worker's parent)
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


_FOLDER = pytest.StashKey[Path]()


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_FOLDER, None)
    if folder is not None:
        os.environ.pop("HWLOC_XMLFILE", None)
        shutil.rmtree(folder, ignore_errors=True)
