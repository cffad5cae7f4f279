"""Merging shards: independent runs get clean, unique episode ids; shards of one run keep theirs;
bad inputs are refused in one line; every shard's metadata is kept. Real files throughout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import gymnasium as gym
import h5py
import numpy as np
import pytest
import torch

from hpccollect import SyncDataCollector
from hpccollect.errors import ArgumentValueError
from hpccollect.storage import HDF5Writer, merge_shards, open_dataset

pytestmark = pytest.mark.timeout(120)


def shard(path, make="CartPole-v1", frames=300, seed=0, writer_kw=None, **collector_kw):
    collector = SyncDataCollector(
        make, None, frames_per_batch=100, total_frames=frames, **collector_kw
    )
    collector.set_seed(seed)
    kw = {"env": make if isinstance(make, str) else make(), "seed": seed, **(writer_kw or {})}
    with HDF5Writer(path, **kw) as writer:
        for batch in collector:
            writer.extend(batch)
    collector.shutdown()
    return path


def episodes(path):
    with open_dataset(path) as ds:
        return list(ds.episodes())


def without_ids(td):
    td = td.clone()
    del td["collector", "traj_ids"]
    return td


def test_independent_runs_merge_into_a_clean_file_with_unique_ids(tmp_path):
    a = shard(tmp_path / "a.h5", seed=1)
    b = shard(tmp_path / "b.h5", seed=2, frames=500)
    first_ids = {int(e["collector", "traj_ids"][0]) for e in episodes(a)}
    assert first_ids & {int(e["collector", "traj_ids"][0]) for e in episodes(b)}  # both from 0
    merged = merge_shards([a, b], tmp_path / "m.h5")
    with open_dataset(merged) as ds:
        assert ds.check() == []
        got = list(ds.episodes())
        assert len(ds) == 800 and ds.committed_episodes == len(got)
        ids = [int(e["collector", "traj_ids"][0]) for e in got]
        assert len(set(ids)) == len(ids)
        assert (ds.episode_ids == ds.file["collector/traj_ids"][:]).all()
        assert ds.file["episode"].is_virtual is False and ds.file["observations"].is_virtual
    want = episodes(a) + episodes(b)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):  # the same episodes, in order; only ids moved
        assert (without_ids(g) == without_ids(w)).all()
    assert ids[: len(first_ids)] == [int(e["collector", "traj_ids"][0]) for e in episodes(a)]


def test_a_shard_that_committed_nothing_adds_no_rows(tmp_path):
    """A rank killed before its first episode ended leaves a shard without datasets."""
    a = shard(tmp_path / "a.h5", seed=1)
    HDF5Writer(tmp_path / "empty.h5", env="CartPole-v1").close()
    b = shard(tmp_path / "b.h5", seed=2, frames=200)
    merged = merge_shards([a, tmp_path / "empty.h5", b], tmp_path / "m.h5")
    with open_dataset(merged) as ds:
        assert ds.check() == [] and len(ds) == 500
        assert json.loads(ds.file.attrs["merged_from"]) == ["a.h5", "empty.h5", "b.h5"]
        got = [without_ids(e) for e in ds.episodes()]
    want = [without_ids(e) for e in episodes(a) + episodes(b)]
    assert len(got) == len(want) and all((g == w).all() for g, w in zip(got, want, strict=True))
    with open_dataset(merge_shards([tmp_path / "empty.h5"], tmp_path / "none.h5")) as ds:
        assert len(ds) == 0 and ds.check() == []


def test_shards_of_one_run_keep_their_ids_and_stay_virtual(tmp_path):
    paths = [
        shard(
            tmp_path / f"rank{i}.h5",
            seed=i,
            traj_id_offset=i,
            traj_id_stride=3,
            writer_kw={"run_id": "job-42", "shard": i},
        )
        for i in range(3)
    ]
    merged = merge_shards(paths, tmp_path / "m.h5")
    with open_dataset(merged) as ds:
        assert ds.check() == []
        parts = [open_dataset(p).to_tensordict() for p in paths]
        assert (ds.to_tensordict() == torch.cat(parts)).all()  # ids untouched
        assert ds.file["episode"].is_virtual and ds.file["collector/traj_ids"].is_virtual
        entries = json.loads(ds.file.attrs["shards"])
    assert [(e["run_id"], e["shard"], e["id_offset"]) for e in entries] == [
        ("job-42", i, 0) for i in range(3)
    ]


def test_one_run_id_with_colliding_ids_is_still_renumbered(tmp_path):
    paths = [
        shard(tmp_path / f"s{i}.h5", seed=i, writer_kw={"run_id": "same", "shard": i})
        for i in range(2)
    ]
    with open_dataset(merge_shards(paths, tmp_path / "m.h5")) as ds:
        assert ds.check() == []


def test_every_shards_metadata_is_recorded(tmp_path):
    a = shard(tmp_path / "a.h5", seed=3)
    b = shard(tmp_path / "sub" / "b.h5", seed=4, frames=200)
    with open_dataset(merge_shards([a, b], tmp_path / "m.h5")) as ds:
        meta = ds.metadata
    entries = meta["shards"]
    assert [e["path"] for e in entries] == ["a.h5", "sub/b.h5"] == meta["merged_from"]
    assert [e["seed"] for e in entries] == [3, 4]
    assert [e["committed_steps"] for e in entries] == [300, 200]
    for entry, path in zip(entries, (a, b), strict=True):
        with h5py.File(path) as f:
            assert entry["run_id"] == f.attrs["run_id"] and entry["created"] == f.attrs["created"]
            assert entry["committed_episodes"] == f.attrs["committed_episodes"]
        assert entry["env_id"] == "CartPole-v1" and entry["complete"] is True
    assert entries[0]["id_offset"] == 0 and entries[1]["id_offset"] > 0
    assert "seed" not in meta and "run_id" not in meta  # they differ: per shard only
    assert meta["env_id"] == "CartPole-v1" and meta["committed_steps"] == 500
    assert meta["complete"] is True


def test_the_same_file_twice_is_refused_by_any_path(tmp_path):
    a = shard(tmp_path / "a.h5")
    (tmp_path / "d").mkdir()
    os.symlink(a, tmp_path / "d" / "link.h5")
    os.link(a, tmp_path / "hard.h5")
    for again in (
        a,
        tmp_path / "d" / ".." / "a.h5",
        tmp_path / "d" / "link.h5",
        tmp_path / "hard.h5",
    ):
        with pytest.raises(ArgumentValueError, match="same file as") as info:
            merge_shards([a, again], tmp_path / "m.h5")
        assert "\n" not in str(info.value)
    # the output is one of the shards: said so whether or not --overwrite is given (the
    # "already exists; pass --overwrite" of an output that is not read would lead nowhere)
    for overwrite in (False, True):
        for out in (a, tmp_path / "hard.h5"):
            with pytest.raises(ArgumentValueError, match=r"a\.h5, which the merge reads; write"):
                merge_shards([a], out, overwrite=overwrite)
    for name in ("m.h5.partial", "m.h5.partial.new"):
        with pytest.raises(ArgumentValueError, match=r"that is the name .*, --out \S*m\.h5\.$"):
            merge_shards([a], tmp_path / name)
    with pytest.raises(ArgumentValueError, match="is a directory; give a file path"):
        merge_shards([a], tmp_path)  # the folder of the shards: not "holds a.h5"
    assert not (tmp_path / "m.h5").exists() and not (tmp_path / "m.h5.partial").exists()


PARTIAL = textwrap.dedent("""
    import os
    from hpccollect import SyncDataCollector
    from hpccollect.storage import HDF5Writer
    collector = SyncDataCollector("CartPole-v1", None, frames_per_batch=100, total_frames=300)
    writer = HDF5Writer({path!r}, env="CartPole-v1", fsync_every=1)
    for batch in collector:
        writer.extend(batch)
    os._exit(0)  # the writer never closes: a .partial file is left, as after a kill
""")


def test_partial_shards_are_refused_unless_allowed(tmp_path):
    a = shard(tmp_path / "a.h5")
    script = PARTIAL.format(path=str(tmp_path / "b.h5"))
    subprocess.run([sys.executable, "-c", script], check=True, timeout=100)
    partial = tmp_path / "b.h5.partial"
    assert partial.exists()
    with pytest.raises(ArgumentValueError, match=r"unfinished.*repair.*--allow-partial"):
        merge_shards([a, partial], tmp_path / "m.h5")
    with open_dataset(partial) as p:
        committed = len(p)
    with open_dataset(merge_shards([a, partial], tmp_path / "m.h5", allow_partial=True)) as ds:
        assert ds.check() == [] and len(ds) == 300 + committed
    os.rename(partial, tmp_path / "renamed.h5")  # renamed by hand: still unfinished inside
    with pytest.raises(ArgumentValueError, match="unfinished"):
        merge_shards([a, tmp_path / "renamed.h5"], tmp_path / "m2.h5")


def test_shards_of_different_envs_are_refused(tmp_path):
    cart = shard(tmp_path / "cart.h5")
    pend = shard(tmp_path / "pend.h5", "Pendulum-v1")
    with pytest.raises(ArgumentValueError, match="different env_id: 'CartPole-v1' vs 'Pendulum"):
        merge_shards([cart, pend], tmp_path / "m.h5")
    small = shard(tmp_path / "4.h5", lambda: gym.make("FrozenLake-v1"))
    big = shard(tmp_path / "8.h5", lambda: gym.make("FrozenLake-v1", map_name="8x8"))
    with pytest.raises(ArgumentValueError, match=r"observation_space: Discrete\(16\) vs Dis"):
        merge_shards([small, big], tmp_path / "m.h5")
    still = shard(tmp_path / "still.h5", lambda: gym.make("FrozenLake-v1", is_slippery=False))
    with pytest.raises(ArgumentValueError, match="different env_kwargs") as info:
        merge_shards([small, still], tmp_path / "m.h5")
    assert "is_slippery" in str(info.value) and "\n" not in str(info.value)
    short = shard(tmp_path / "short.h5", lambda: gym.make("CartPole-v1", max_episode_steps=20))
    with pytest.raises(ArgumentValueError, match="env spec max_episode_steps: 500 vs 20"):
        merge_shards([cart, short], tmp_path / "m.h5")
    merged = merge_shards([cart, shard(tmp_path / "cart2.h5")], tmp_path / "m.h5")
    with pytest.raises(ArgumentValueError, match="itself a merged file"):
        merge_shards([merged, cart], tmp_path / "m3.h5")
    assert not (tmp_path / "m3.h5").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cli_merge_of_two_runs_then_inspect_is_clean(tmp_path):
    def cli(*args, code=0):
        done = subprocess.run(
            [sys.executable, "-m", "hpccollect", *map(str, args)],
            capture_output=True, text=True, timeout=200, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == code, done.stderr
        return done

    run = ("--collector", "single", "--total-frames", 400, "--frames-per-batch", 200, "--quiet")
    cli("collect", *run, "--seed", 1, "--out", "a.h5")
    cli("collect", *run, "--seed", 2, "--out", "b.h5")
    cli("merge", "a.h5", "b.h5", "--out", "all.h5")
    inspect = cli("inspect", "all.h5")
    assert "integrity         ok" in inspect.stdout
    with open_dataset(tmp_path / "all.h5") as ds:
        assert len(ds) == 800 and ds.check() == []
        assert np.array_equal(
            ds.returns(),
            np.concatenate([open_dataset(tmp_path / p).returns() for p in ("a.h5", "b.h5")]),
        )
    same = cli("merge", "a.h5", "./a.h5", "--out", "x.h5", code=2)
    assert same.stderr.count("\n") == 1 and "same file as" in same.stderr
    os.rename(tmp_path / "b.h5", tmp_path / "b.h5.partial")
    refused = cli("merge", "a.h5", "b.h5.partial", "--out", "y.h5", code=2)
    assert "--allow-partial" in refused.stderr and refused.stderr.count("\n") == 1
    cli("merge", "a.h5", "b.h5.partial", "--out", "y.h5", "--allow-partial")
