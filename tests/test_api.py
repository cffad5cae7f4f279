"""The public names: TorchRL's collector names (old and 0.14.1's) and the version."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import hpccollect


def test_torchrl_0_14_1_names_are_the_same_classes():
    assert hpccollect.Collector is hpccollect.SyncDataCollector
    assert hpccollect.AsyncCollector is hpccollect.aSyncDataCollector
    assert hpccollect.MultiSyncCollector is hpccollect.MultiSyncDataCollector
    assert hpccollect.MultiAsyncCollector is hpccollect.MultiaSyncDataCollector
    assert hpccollect.BaseCollector is hpccollect.DataCollectorBase
    assert all(hasattr(hpccollect, name) for name in hpccollect.__all__)


def test_version_module_imports_nothing():
    source = Path(hpccollect.__file__).with_name("_version.py").read_text()
    tree = ast.parse(source)
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert hpccollect.__version__ == importlib.metadata.version("hpccollect")


_IMPORT_ONLY = """
import sys
hook = sys.excepthook
import hpccollect
loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'mpi4py'
                or m.startswith(('hpccollect.distributed', 'hpccollect.launchers')))
print('loaded', loaded, 'hook kept', sys.excepthook is hook)
cls = hpccollect.DistributedDataCollector  # the distributed names load the layer on first use
print('distributed', cls.__module__, 'hook set', getattr(sys.excepthook, '_hpccollect_abort', False))
"""


def test_import_has_no_side_effects_even_under_mpiexec():
    """``import hpccollect`` loads no distributed, launcher or MPI module and leaves
    ``sys.excepthook`` alone, also in a process an MPI launcher started (PMI_SIZE); loading the
    distributed layer there installs the hook that ends the whole job on an uncaught error."""
    env = {**os.environ, "PMI_SIZE": "3", "PMI_RANK": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_ONLY], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "loaded [] hook kept True" in out.stdout
    assert "distributed hpccollect.distributed.collector hook set True" in out.stdout


# what a process started by hpccollect (a worker, a rank, a SLURM job) or a user may import first
ENTRY_MODULES = [
    "hpccollect.collectors.workers.worker",
    "hpccollect.collectors.distributed",
    "hpccollect.distributed",
    "hpccollect.launchers.rank",
    "hpccollect.distributed.collector",
    "hpccollect.launchers",
    "hpccollect.launchers.base",
    "hpccollect.launchers.mp",
    "hpccollect.launchers.mpi",
    "hpccollect.launchers.submitit",
    "hpccollect.app.mpi_job",
    "hpccollect.app.cli",
]


def test_every_entry_module_imports_first_in_a_fresh_process():
    """No import cycle bites whichever module a fresh process loads first (a spawned rank
    unpickles its entry point from ``hpccollect.launchers.mp`` before anything else)."""
    # one process loads the third-party packages once and forks a child per module, which
    # imports that module before any other of hpccollect's (as a fresh process would)
    code = (
        "import importlib, os, sys, traceback\n"
        "import gymnasium, h5py, numpy, tensordict, torch\n"
        "assert not [m for m in sys.modules if m.startswith('hpccollect')]\n"
        "bad = []\n"
        "for m in sys.argv[1:]:\n"
        "    r, w = os.pipe()\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os.close(r)\n"
        "        try:\n"
        "            importlib.import_module(m)\n"
        "        except BaseException:\n"
        "            os.write(w, traceback.format_exc().strip().splitlines()[-1].encode())\n"
        "            os._exit(1)\n"
        "        os._exit(0)\n"
        "    os.close(w)\n"
        "    with os.fdopen(r) as f:\n"
        "        why = f.read()\n"
        "    if os.waitpid(pid, 0)[1]:\n"
        "        bad.append((m, why))\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *ENTRY_MODULES], capture_output=True, text=True, timeout=600
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
