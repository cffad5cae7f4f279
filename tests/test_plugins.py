"""Plug-ins from a package outside: every extension kind (launcher, transport, collector kind,
storage format, execution backend) is declared in an entry-point group (``_lazy.GROUPS``), and
hpccollect finds and uses them with no code of the user's beyond installing the package. The
test builds such a package, installs it with pip (into a folder of its own, put on the path
of the process that uses it), and runs a distributed job made only of what it adds."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpccollect._lazy import GROUPS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PLUGIN = '''
"""A package that adds one of each kind of hpccollect plug-in."""
from hpccollect import MultiSyncDataCollector, SyncDataCollector
from hpccollect.launchers import MPLauncher
from hpccollect.storage import StorageFormat, dataset_format
from hpccollect.transport.backends import Backend, backend_named


class CountingLauncher(MPLauncher):
    """launcher="plugin-counting": local ranks, as "mp" starts them, counted."""

    started = 0

    def start(self, ranks):
        CountingLauncher.started += len(ranks)
        return super().start(ranks)


def _open_over_gloo(store, rank, world_size, name):
    return backend_named("gloo").open_group(store, rank, world_size, name)


TRANSPORT = Backend("plugin-gloo", lambda: True, _open_over_gloo, "nothing to install")


class TaggedCollector(SyncDataCollector):
    """collector_class="plugin-tagged": a single-process collector that marks its batches (a reward
    of 7 for every step; CartPole's is 1)."""

    def rollout(self):
        batch = super().rollout()
        batch["next", "reward"].fill_(7)  # in place: the batch is sent from its buffers
        return batch


class TaggedMulti(MultiSyncDataCollector):
    """Collector(backend="plugin-exec"): worker processes in lockstep, whatever ``sync`` says."""

    def __init__(self, *args, sync=None, **kwargs):
        super().__init__(*args, **kwargs)


def _hdf5(attr):
    return getattr(dataset_format(name="hdf5"), attr)


DEMO_FORMAT = StorageFormat(
    name="plugin-hdf5",
    suffixes=(".demo",),
    writer=lambda path, **options: _hdf5("writer")(path, **options),
    open=lambda path: _hdf5("open")(path),
    merge=lambda *a, **k: _hdf5("merge")(*a, **k),
    repair=lambda path: _hdf5("repair")(path),
    partial_path=lambda path: _hdf5("partial_path")(path),
)
'''

ENTRY_POINTS = {
    "launcher": ("plugin-counting", "hpccollect_demo_plugin:CountingLauncher"),
    "transport": ("plugin-gloo", "hpccollect_demo_plugin:TRANSPORT"),
    "collector kind": ("plugin-tagged", "hpccollect_demo_plugin:TaggedCollector"),
    "storage format": ("plugin-hdf5", "hpccollect_demo_plugin:DEMO_FORMAT"),
    "execution backend": ("plugin-exec", "hpccollect_demo_plugin:TaggedMulti"),
}

USE = """
import gymnasium as gym
from hpccollect import Collector, DistributedDataCollector
from hpccollect.collectors.torchrl_api.kinds import collector_kinds
from hpccollect.launchers import launcher_names
from hpccollect.storage import open_sink, read_dataset
from hpccollect.transport.backends import backend_names
import hpccollect_demo_plugin as plugin

assert "plugin-counting" in launcher_names() and "plugin-gloo" in backend_names(), "not found"
assert "plugin-tagged" in collector_kinds()
collector = DistributedDataCollector(
    [lambda: gym.make("CartPole-v1")] * 2, None, frames_per_batch=64, total_frames=256,
    launcher="plugin-counting", backend="plugin-gloo", collector_class="plugin-tagged",
)
batches = [b.clone() for b in collector]
collector.shutdown()
assert len(batches) == 4 and all(bool((b["next", "reward"] == 7).all()) for b in batches), batches[0]
assert plugin.CountingLauncher.started == 2

sink = open_sink("out.demo", env="CartPole-v1")
for batch in Collector("CartPole-v1", None, frames_per_batch=100, total_frames=300):
    sink.extend(batch)
sink.close()
assert len(read_dataset("out.demo")) == 300

built = Collector("CartPole-v1", None, backend="plugin-exec", frames_per_batch=8, total_frames=16)
assert type(built) is plugin.TaggedMulti
assert sum(b.numel() for b in built) == 16
built.shutdown()
print("PLUGINS USED")
"""


def test_a_package_that_declares_plug_ins_is_found_and_used(tmp_path: Path) -> None:
    package = tmp_path / "package"
    (package / "hpccollect_demo_plugin").mkdir(parents=True)
    (package / "hpccollect_demo_plugin" / "__init__.py").write_text(PLUGIN)
    groups = "\n".join(
        f'[project.entry-points."{GROUPS[kind]}"]\n"{name}" = "{target}"\n'
        for kind, (name, target) in ENTRY_POINTS.items()
    )
    (package / "pyproject.toml").write_text(
        textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "hpccollect-demo-plugin"
        version = "0.1"
        """)
        + groups
    )
    site = tmp_path / "site"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            site,
            package,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
    }
    used = subprocess.run(
        [sys.executable, "-c", USE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert used.returncode == 0 and "PLUGINS USED" in used.stdout, used.stderr[-4000:]


def test_without_the_package_its_names_are_unknown() -> None:
    """The same names, not installed: each registry refuses them, naming what it has."""
    from hpccollect.collectors.torchrl_api.kinds import collector_kinds
    from hpccollect.launchers import launcher_names
    from hpccollect.transport.backends import backend_names

    assert "plugin-counting" not in launcher_names()
    assert "plugin-gloo" not in backend_names()
    assert "plugin-tagged" not in collector_kinds()
