"""Launchers are registered by name: a new one is a module plus one ``register_launcher`` call,
its module loads on first use, and a name nobody registered gets an error listing those that
are."""

from __future__ import annotations

import subprocess
import sys
from functools import partial
from pathlib import Path

import mpirun
import pytest
from conftest import CounterEnv

from hpccollect import DistributedDataCollector
from hpccollect.errors import ArgumentValueError
from hpccollect.launchers import (
    MPLauncher,
    get_launcher,
    job_launchers,
    launcher_names,
    register_launcher,
)


def test_the_builtin_launchers_are_registered():
    assert launcher_names()[:4] == ("mp", "mpi", "submitit", "submitit_delayed")
    assert job_launchers() == ("mpi",)  # the one whose ranks all run the job's own command
    for starts_processes in (False, True):  # ranks may start processes either way (TorchRL's)
        launcher = get_launcher("mp", starts_processes=starts_processes)
        assert type(launcher) is MPLauncher and launcher.daemon is False


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_the_jobs_address_options_reach_the_launcher_through_the_registry(tmp_path):
    """``python -m hpccollect collect`` takes its launcher from the registry (app/mpi_job.py),
    and ``--master-addr``/``--interface`` travel in the request to the launcher's class."""
    if mpirun.skip_reason():
        pytest.skip(mpirun.skip_reason())
    code = (
        "import sys\n"
        "from hpccollect.launchers import get_launcher\n"
        "named = get_launcher('mpi', master_addr='10.1.2.3', interface='ib0')\n"
        "plain = get_launcher('mpi')\n"
        "with open(f'{sys.argv[1]}.{named.comm.Get_rank()}', 'w') as f:\n"
        "    print(type(named).__name__, named.master_addr, named.interface, plain.master_addr,"
        " file=f)\n"
    )
    out = tmp_path / "seen"
    cmd = mpirun.command(2, sys.executable, "-c", code, str(out))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        assert Path(f"{out}.{rank}").read_text() == "MPILauncher 10.1.2.3 ib0 None\n"


def test_an_unknown_or_unusable_launcher_is_refused_with_what_there_is():
    with pytest.raises(ArgumentValueError, match=r"launcher must be one of \['mp', 'mpi'"):
        get_launcher("slurmish")
    register_launcher("needs-a-package", "no_such_pkg_xyz.launch:L", requires="no_such_pkg_xyz")
    with pytest.raises(ArgumentValueError, match="needs the no_such_pkg_xyz package: pip install"):
        get_launcher("needs-a-package")
    with pytest.raises(ArgumentValueError, match="'module:attr'"):
        register_launcher("bad", "no colon here")


def test_naming_a_launcher_loads_only_its_module():
    code = (
        "import sys\n"
        "from hpccollect.launchers import get_launcher\n"
        "get_launcher('mp')\n"
        "print(sorted(m for m in sys.modules if m.startswith(('mpi4py', 'submitit', "
        "'hpccollect.launchers.mpi', 'hpccollect.launchers.submitit'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_launcher_registered_by_the_user_starts_the_ranks(monkeypatch):
    import counting_launcher

    monkeypatch.setattr(counting_launcher, "STARTED", [])
    register_launcher("counting", "counting_launcher:CountingLauncher")
    assert "counting" in launcher_names() and "counting" not in job_launchers()
    collector = DistributedDataCollector(
        [partial(CounterEnv, 4)] * 2,
        None,
        frames_per_batch=20,
        total_frames=40,
        launcher="counting",
    )
    try:
        batches = list(collector)
    finally:
        collector.shutdown()
    assert counting_launcher.STARTED == [2]
    assert sum(b.numel() for b in batches) == 40
