"""A dataset file describes the env it came from (id, kwargs, TimeLimit, wrappers, the spaces of
the env actually made), and a Minari export rebuilds that same env."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import h5py
import pytest
from gymnasium.envs.registration import EnvSpec

from hpccollect import SyncDataCollector
from hpccollect.envs.gym import GymEnv
from hpccollect.errors import ArgumentValueError
from hpccollect.storage import HDF5Writer, export_minari, open_dataset

pytestmark = pytest.mark.timeout(120)

LAKE = {"map_name": "8x8", "max_episode_steps": 50}


def collect_into(path, make, frames=200, **writer_kw):
    collector = SyncDataCollector(make, None, frames_per_batch=100, total_frames=frames)
    collector.set_seed(0)
    with HDF5Writer(path, **writer_kw) as writer:
        for batch in collector:
            writer.extend(batch)
    collector.shutdown()
    return path


def test_env_id_with_kwargs_records_the_spec_and_the_spaces_of_the_env_made(tmp_path):
    path = tmp_path / "lake.h5"
    collect_into(
        path, lambda: gym.make("FrozenLake-v1", **LAKE), env="FrozenLake-v1", env_kwargs=LAKE
    )
    with open_dataset(path) as ds:
        assert ds.observation_space == gym.spaces.Discrete(64)  # not the default map's 16
        meta = ds.metadata
        assert meta["env_id"] == "FrozenLake-v1" and meta["env_kwargs"] == LAKE
        spec = EnvSpec.from_json(ds.file.attrs["env_spec"])
        assert spec.kwargs == {"map_name": "8x8"} and spec.max_episode_steps == 50
        assert gym.make(spec).observation_space == gym.spaces.Discrete(64)
        # the data agrees: one-hot observations of width 64, episodes cut at 50 steps
        assert ds.file["observations"].shape[1:] == (64,)
        assert max(stop - start for start, stop in ds.episode_bounds()) <= 50


def test_made_envs_record_their_wrappers_and_single_spaces(tmp_path):
    wrapped = gym.wrappers.TimeAwareObservation(gym.make("CartPole-v1", max_episode_steps=40))
    path = collect_into(tmp_path / "w.h5", lambda: gym.make("CartPole-v1"), env=wrapped)
    with h5py.File(path) as f:
        spec = EnvSpec.from_json(f.attrs["env_spec"])
    assert spec.max_episode_steps == 40
    assert [w.name for w in spec.additional_wrappers] == ["TimeAwareObservation"]
    assert gym.make(spec).observation_space.shape == (5,)  # the time feature included

    vector = GymEnv(
        gym.vector.SyncVectorEnv([lambda: gym.make("FrozenLake-v1", map_name="8x8")] * 2)
    )
    path = collect_into(tmp_path / "v.h5", lambda: gym.make("CartPole-v1"), env=vector)
    with open_dataset(path) as ds:
        assert ds.observation_space == gym.spaces.Discrete(64)
        assert ds.metadata["env_kwargs"] == {"map_name": "8x8"}


def test_bad_env_arguments_fail_early_and_leave_no_file(tmp_path):
    with pytest.raises(ArgumentValueError, match="map_name='9x9'|9x9"):
        HDF5Writer(tmp_path / "a.h5", env="FrozenLake-v1", env_kwargs={"map_name": "9x9"})
    with pytest.raises(ArgumentValueError, match="env_kwargs only goes with an env id"):
        HDF5Writer(tmp_path / "a.h5", env=gym.make("CartPole-v1"), env_kwargs={"x": 1})
    assert list(tmp_path.iterdir()) == []


def test_minari_recover_environment_rebuilds_the_env_used(tmp_path, monkeypatch):
    minari = pytest.importorskip("minari")
    path = collect_into(
        tmp_path / "lake.h5",
        lambda: gym.make("FrozenLake-v1", **LAKE),
        env="FrozenLake-v1",
        env_kwargs=LAKE,
    )
    export_minari(path, tmp_path / "datasets", "hpc/lake8-v0")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    dataset = minari.load_dataset("hpc/lake8-v0")
    for eval_env in (False, True):
        env = dataset.recover_environment(eval_env=eval_env)
        assert env.observation_space == gym.spaces.Discrete(64)
        assert env.spec.max_episode_steps == 50 and env.spec.kwargs["map_name"] == "8x8"
    assert dataset.spec.observation_space == gym.spaces.Discrete(64)

    # a file without env_spec (an env whose spec JSON cannot hold): env_id + env_kwargs suffice
    with h5py.File(path, "r+") as f:
        del f.attrs["env_spec"]
    export_minari(path, tmp_path / "datasets", "hpc/lake8-v1")
    env = minari.load_dataset("hpc/lake8-v1").recover_environment()
    assert env.observation_space == gym.spaces.Discrete(64) and env.spec.max_episode_steps == 50


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_env_kwargs_on_the_command_line_reach_the_minari_export(tmp_path, monkeypatch):
    minari = pytest.importorskip("minari")
    out = tmp_path / "lake.h5"

    def cli(*args):
        done = subprocess.run(
            [sys.executable, "-m", "hpccollect", *map(str, args)],
            capture_output=True,
            text=True,
            timeout=200,
        )
        assert done.returncode == 0, done.stderr
        return done

    cli(
        "collect", "--env", "FrozenLake-v1", "--env-kwargs", json.dumps(LAKE),
        "--collector", "single", "--policy", "random", "--total-frames", 400,
        "--frames-per-batch", 200, "--quiet", "--out", out,
    )  # fmt: skip
    with open_dataset(out) as ds:
        assert ds.observation_space == gym.spaces.Discrete(64)
        assert ds.metadata["env_kwargs"] == LAKE
    cli(
        "export", out, "--format", "minari", "--out", tmp_path / "datasets",
        "--dataset-id", "hpc/frozenlake/eight-v0",
    )  # fmt: skip
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    env = minari.load_dataset("hpc/frozenlake/eight-v0").recover_environment()
    assert env.observation_space == gym.spaces.Discrete(64)
    assert env.spec.max_episode_steps == 50
