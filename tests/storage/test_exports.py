"""Exports read by their tools' own rules: Minari ids with nested namespaces (real minari), and
D4RL files whose actions and observations have the env's shapes (d4rl's get_dataset checks)."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import h5py
import numpy as np
import pytest

from hpccollect import SyncDataCollector
from hpccollect.envs.gym import GymEnv
from hpccollect.errors import ArgumentValueError
from hpccollect.storage import (
    HDF5Writer,
    export_d4rl,
    export_memmap,
    export_minari,
    merge_shards,
    open_dataset,
)

pytestmark = pytest.mark.timeout(120)


class ShiftedMultiDiscreteEnv(gym.Env):
    """A MultiDiscrete action with a non-zero start; the observation echoes the last action."""

    def __init__(self) -> None:
        self.action_space = gym.spaces.MultiDiscrete([3, 4], start=[1, -2])
        self.observation_space = gym.spaces.Box(-10, 10, (2,), np.float32)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.t += 1
        return np.asarray(action, np.float32), 1.0, self.t >= 6, False, {}


def write(path, make, frames=400, env=None, **collector_kw):
    collector = SyncDataCollector(
        make, None, frames_per_batch=100, total_frames=frames, **collector_kw
    )
    collector.set_seed(0)
    with HDF5Writer(path, env=env) as writer:
        for batch in collector:
            writer.extend(batch)
    collector.shutdown()
    return path


def d4rl_get_dataset(path, env):
    """d4rl's ``OfflineEnv.get_dataset`` checks, against the real env."""
    with h5py.File(path, "r") as f:
        data = {k: f[k][:] for k in f.keys()}
    n = data["observations"].shape[0]
    assert data["observations"].shape[1:] == env.observation_space.shape, "Observation shape"
    assert data["actions"].shape[1:] == env.action_space.shape, (
        f"Action shape does not match env: {data['actions'].shape[1:]} vs {env.action_space.shape}"
    )
    for key in ("actions", "rewards", "terminals", "timeouts", "next_observations"):
        assert data[key].shape[0] == n, key
    if data["rewards"].shape == (n, 1):
        data["rewards"] = data["rewards"][:, 0]
    assert data["rewards"].shape == (n,) and data["terminals"].shape in ((n,), (n, 1))
    return data


# ------------------------------------------------------------------ D4RL: discrete actions
def test_d4rl_cartpole_actions_are_integers_that_d4rl_accepts(tmp_path):
    src = write(tmp_path / "cp.h5", "CartPole-v1", env="CartPole-v1")
    out = export_d4rl(src, tmp_path / "cp.hdf5")
    env = gym.make("CartPole-v1")
    data = d4rl_get_dataset(out, env)
    assert data["actions"].dtype == np.int64 and data["actions"].shape == (400,)
    assert all(env.action_space.contains(int(a)) for a in data["actions"])
    with open_dataset(src) as ds, h5py.File(out) as f:
        np.testing.assert_array_equal(data["actions"], ds.file["actions"][:].argmax(-1))
        assert f.attrs["action_encoding"] == "integer"
        assert f.attrs["observation_encoding"] == "continuous"


def test_d4rl_multidiscrete_and_discrete_observations_in_the_env_format(tmp_path):
    src = write(tmp_path / "md.h5", ShiftedMultiDiscreteEnv, env=ShiftedMultiDiscreteEnv())
    env = ShiftedMultiDiscreteEnv()
    data = d4rl_get_dataset(export_d4rl(src, tmp_path / "md.hdf5"), env)
    assert data["actions"].dtype == np.int64 and data["actions"].shape == (400, 2)
    assert all(env.action_space.contains(a) for a in data["actions"])
    # the env echoes its action: the exported action is exactly what the env received
    np.testing.assert_array_equal(data["next_observations"], data["actions"].astype(np.float32))

    lake = lambda: gym.make("FrozenLake-v1", map_name="8x8")  # noqa: E731
    src = write(tmp_path / "lake.h5", lake, env=lake())
    out = export_d4rl(src, tmp_path / "lake.hdf5")
    data = d4rl_get_dataset(out, lake())
    assert data["observations"].dtype == np.int64 and data["observations"].max() < 64
    with h5py.File(out) as f:
        assert f.attrs["observation_encoding"] == "integer"
        assert json.loads(f.attrs["env_kwargs"]) == {"map_name": "8x8"}


def test_d4rl_actions_stored_as_indices_and_continuous_actions(tmp_path):
    # a collector with categorical_action_encoding stores indices, not one-hot
    src = write(
        tmp_path / "idx.h5",
        lambda: GymEnv(gym.make("CartPole-v1"), categorical_action_encoding=True),
        env="CartPole-v1",
    )
    data = d4rl_get_dataset(export_d4rl(src, tmp_path / "idx.hdf5"), gym.make("CartPole-v1"))
    with open_dataset(src) as ds:
        np.testing.assert_array_equal(data["actions"], ds.file["actions"][:])
    src = write(tmp_path / "box.h5", "Pendulum-v1", env="Pendulum-v1")
    out = export_d4rl(src, tmp_path / "box.hdf5")
    data = d4rl_get_dataset(out, gym.make("Pendulum-v1"))
    assert data["actions"].dtype == np.float32
    with h5py.File(out) as f:
        assert f.attrs["action_encoding"] == "continuous"


# ------------------------------------------------------------------ Minari: dataset ids
@pytest.mark.parametrize("dataset_id", ["hpc/pendulum/test-v0", "D4RL/door/human-v2", "flat-v3"])
def test_minari_accepts_nested_namespaces(tmp_path, monkeypatch, dataset_id):
    minari = pytest.importorskip("minari")
    minari_namespace = pytest.importorskip("minari.namespace")
    src = write(tmp_path / "p.h5", "Pendulum-v1", env="Pendulum-v1")
    root = tmp_path / "datasets"
    export_minari(src, root, dataset_id)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    assert dataset_id in minari.list_local_datasets()
    dataset = minari.load_dataset(dataset_id)
    assert dataset.total_steps == 400 and dataset.id == dataset_id
    namespace = dataset_id.rpartition("/")[0]
    if namespace:
        parts = namespace.split("/")
        parents = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        assert minari_namespace.list_local_namespaces() == sorted(parents)
        for name in parents:  # Minari's own metadata file in every level
            assert (root / name / "namespace_metadata.json").exists()
            assert isinstance(minari_namespace.get_namespace_metadata(name), dict)
    # a second version in the same namespace and overwriting both work
    if namespace:
        export_minari(src, root, f"{namespace}/other-v1")
        export_minari(src, root, dataset_id, overwrite=True)
        assert {dataset_id, f"{namespace}/other-v1"} <= set(minari.list_local_datasets())


@pytest.mark.parametrize("bad", ["bad id", "hpc/pend.ulum-v0", "hpc/pendulum", "/abs-v0"])
def test_minari_refuses_what_minari_refuses_with_the_accepted_form(tmp_path, bad):
    pytest.importorskip("minari")
    src = write(tmp_path / "p.h5", "Pendulum-v1", frames=100, env="Pendulum-v1")
    with pytest.raises(ArgumentValueError, match="NAMESPACE/NAME-vN") as info:
        export_minari(src, tmp_path / "datasets", bad)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "datasets").exists()


@pytest.mark.slow
def test_cli_export_refuses_a_bad_id_in_one_line(tmp_path):
    pytest.importorskip("minari")
    src = write(tmp_path / "p.h5", "Pendulum-v1", frames=100, env="Pendulum-v1")
    done = subprocess.run(
        [sys.executable, "-m", "hpccollect", "export", str(src), "--format", "minari",
         "--out", str(tmp_path / "d"), "--dataset-id", "hpc/pend.ulum-v0"],
        capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpccollect: error: --dataset-id")


def test_an_export_never_writes_over_what_it_reads(tmp_path, monkeypatch):
    """An export onto its own source, or onto a shard of the merged view it reads, is refused
    before anything is written (with --overwrite too: a merged view's export once replaced
    its shard with the D4RL file, exit 0); a D4RL export that fails part-way leaves the file
    it was to replace as it was."""
    a = write(tmp_path / "a.h5", lambda: gym.make("CartPole-v1"), frames=200)
    shard = write(tmp_path / "x.shards" / "rank-0001.h5", lambda: gym.make("CartPole-v1"), 200)
    view = merge_shards([shard], tmp_path / "x.h5")
    before = {p: p.read_bytes() for p in (a, shard, view)}
    refused = [
        (lambda: export_d4rl(a, a, overwrite=True), "a.h5 is .*a.h5, which the export reads"),
        (lambda: export_d4rl(a, a), "a.h5, which the export reads"),  # not "pass --overwrite"
        (lambda: export_d4rl(view, shard, overwrite=True), "rank-0001.h5, which the export"),
        (lambda: export_memmap(view, tmp_path / "x.shards", overwrite=True), "x.shards holds"),
        (lambda: export_d4rl(a, tmp_path / "d.h5.partial"), "the name a dataset has while"),
        (lambda: export_d4rl(a, tmp_path / "d.h5.partial.new"), r"name, --out \S*d\.h5\."),
    ]
    for export, message in refused:
        with pytest.raises(ArgumentValueError, match=message):
            export()
    assert {p: p.read_bytes() for p in before} == before
    old = export_d4rl(a, tmp_path / "d.h5")
    kept = old.read_bytes()

    def fails(*args, **kwargs):
        raise OSError("the disk filled up")

    monkeypatch.setattr(h5py.Group, "create_dataset", fails)
    with pytest.raises(OSError, match="the disk filled up"):
        export_d4rl(a, old, overwrite=True)
    assert old.read_bytes() == kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.h5", "d.h5", "x.h5", "x.shards"]
