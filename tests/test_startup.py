"""``import hpccollect`` imports nothing heavy and changes nothing of Python's or torch's; the
command line checks its options and reads datasets without torch."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from hpccollect.app.cli import main

pytestmark = pytest.mark.timeout(120)


def _python(code: str, **kw) -> subprocess.CompletedProcess:
    """``code`` run in a fresh interpreter (it must exit 0)."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=90, check=True, **kw
    )


def test_importing_and_collecting_change_nothing_of_pythons_or_torchs():
    """``import hpccollect`` and a collection install no import hook and replace no function of
    torch's (``tests/test_boundaries.py`` reads the same in the source)."""
    code = (
        "import sys\n"
        "import torch.compiler as tc\n"
        "hooks, fns = list(sys.meta_path), (tc.allow_in_graph, tc.assume_constant_result)\n"
        "from hpccollect import GymEnv, SyncDataCollector\n"
        "c = SyncDataCollector(lambda: GymEnv('CartPole-v1'), None, frames_per_batch=50,"
        " total_frames=200)\n"
        "n = sum(b.numel() for b in c)\n"
        "c.shutdown()\n"
        "print(n, sys.meta_path == hooks, (tc.allow_in_graph, tc.assume_constant_result) == fns)\n"
    )
    assert _python(code).stdout.split()[-3:] == ["200", "True", "True"]


def test_import_hpccollect_and_its_command_line_load_no_torch():
    """The package's names load on first use: ``python -m hpccollect`` reads its command line,
    answers --help and reports a mistake in it (on every rank of an mpiexec job) before torch
    loads, in a fraction of a second where torch takes seconds."""
    code = (
        "import sys\n"
        "import hpccollect\n"
        "from hpccollect.app.cli import main\n"
        "alone = sorted(m for m in ('torch', 'tensordict', 'numpy') if m in sys.modules)\n"
        "codes = [main(argv) for argv in (['collect', '--total-frames', '-5'], ['colect'],"
        " ['export', 'a.h5', '--format', 'd4rl'], ['collect', '--backend', 'mpi',"
        " '--gather', '0'], ['collect', '--backend', 'gloo'])]\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit as end:\n"
        "    codes.append(end.code)\n"
        "print(alone, codes, 'torch' in sys.modules)\n"
        "print(hpccollect.envs.__name__, hpccollect.collectors.sync.__name__)\n"
    )
    out = _python(code)
    lines = out.stdout.splitlines()
    assert lines[-2] == "[] [2, 2, 2, 2, 2, 0] False", out.stderr
    # a submodule is still an attribute of its package, as when the package imported it
    assert lines[-1] == "hpccollect.envs hpccollect.collectors.sync"
    assert "--total-frames must be a positive integer" in out.stderr
    assert "unknown command 'colect'" in out.stderr


def test_inspect_repair_and_merge_of_a_dataset_load_no_torch(tmp_path):
    """Describing, checking, repairing and merging datasets need h5py and numpy, not torch:
    ``inspect`` of a file takes a fraction of a second."""
    from hpccollect import SyncDataCollector
    from hpccollect.storage import HDF5Writer

    collector = SyncDataCollector("CartPole-v1", None, frames_per_batch=100, total_frames=200)
    with HDF5Writer(tmp_path / "run.h5", env="CartPole-v1") as writer:
        for batch in collector:
            writer.extend(batch)
    collector.shutdown()
    code = (
        "import sys\n"
        "from hpccollect.app.cli import main\n"
        "codes = [main(argv.split()) for argv in ('inspect run.h5', 'repair run.h5',"
        " 'merge run.h5 --out all.h5', 'inspect all.h5')]\n"
        "print(codes, 'torch' in sys.modules, 'tensordict' in sys.modules)\n"
    )
    out = _python(code, cwd=tmp_path)
    assert out.stdout.splitlines()[-1] == "[0, 0, 0, 0] False False", out.stderr
    assert out.stdout.count("integrity         ok") == 2
    assert "nothing to repair" in out.stdout and "merged 1 shards into" in out.stdout


#: registered first, so it runs last at exit: how many objects the collector leaves alone then
_FROZEN_AT_EXIT = """
import atexit, gc, sys
def said():
    sys.stderr.write(f"FROZEN {gc.get_freeze_count()}\\n")
"""

#: a module whose function, run first in each worker, has the worker say the same at its exit
_PROBE = (
    _FROZEN_AT_EXIT
    + """
def at_exit():
    atexit.register(said)
"""
)

#: a user's script: a multi-sync collector whose worker is spawned (TorchRL's default)
_SPAWNED = """
import atexit
import probe
from hpccollect import MultiSyncDataCollector
if __name__ == "__main__":
    atexit.register(probe.said)
    c = MultiSyncDataCollector(["CartPole-v1"], None, frames_per_batch=50, total_frames=100,
                               init_fn=probe.at_exit)
    for batch in c:
        pass
    c.shutdown()
"""


def _frozen(stderr: str) -> list[int]:
    return [int(line.split()[1]) for line in stderr.splitlines() if line.startswith("FROZEN ")]


@pytest.mark.slow
def test_the_command_line_and_a_spawned_worker_end_without_the_last_collection(tmp_path):
    """The processes hpccollect runs itself freeze what is alive once their work is done, so
    that Python's last collections at exit, about 0.4 s of CPU with torch imported, skip it
    (``hpccollect/_exit.py``); a user's own script is left as it is, and so is a process
    that calls the command line's ``main()``."""
    assert main(["inspect", str(tmp_path / "none.h5")]) == 2
    assert gc.get_freeze_count() == 0
    cli = _python(
        _FROZEN_AT_EXIT
        + "atexit.register(said)\n"
        + "import runpy\n"
        + "sys.argv = ['hpccollect', 'collect', '--collector', 'single', '--total-frames', "
        + "'100', '--frames-per-batch', '50', '--out', 'run.h5', '--quiet']\n"
        + "runpy.run_module('hpccollect', run_name='__main__', alter_sys=True)\n",
        cwd=tmp_path,
    )
    assert (tmp_path / "run.h5").exists()
    assert [n > 10_000 for n in _frozen(cli.stderr)] == [True], cli.stderr

    (tmp_path / "probe.py").write_text(_PROBE)
    script = tmp_path / "spawned.py"
    script.write_text(_SPAWNED)
    spawned = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=90, cwd=tmp_path
    )
    assert spawned.returncode == 0, spawned.stderr[-3000:]
    counts = sorted(_frozen(spawned.stderr))  # the script's, then its worker's
    assert [n > 10_000 for n in counts] == [False, True] and counts[0] == 0, spawned.stderr
