"""HDF5 datasets: write, read back, crash, repair, merge, export; real files throughout."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time

import gymnasium as gym
import h5py
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from hpccollect import SyncDataCollector
from hpccollect.errors import ArgumentTypeError, ArgumentValueError, StorageError
from hpccollect.storage import (
    HDF5Writer,
    ReplayBuffer,
    TransitionDataset,
    dataset_format,
    export_d4rl,
    export_memmap,
    export_minari,
    merge_shards,
    open_dataset,
    repair,
)
from hpccollect.storage.hdf5_writer import chunk_rows
from hpccollect.storage.spaces_json import space_from_json

pytestmark = pytest.mark.timeout(120)


def collect(make, frames_per_batch, total, seed=0, **kw):
    collector = SyncDataCollector(
        make, None, frames_per_batch=frames_per_batch, total_frames=total, **kw
    )
    collector.set_seed(seed)
    batches = [b.clone() for b in collector]
    collector.shutdown()
    return batches


def episodes_by_id(batches):
    """What the collector produced, regrouped: traj id -> TensorDict [T] in time order."""
    parts: dict[int, list] = {}
    for batch in batches:
        rows = batch.reshape(-1, batch.shape[-1]) if batch.ndim > 1 else batch.unsqueeze(0)
        for row in rows.unbind(0):
            ids = row["collector", "traj_ids"]
            for tid in ids.unique(sorted=False).tolist():
                parts.setdefault(tid, []).append(row[ids == tid])
    return {tid: torch.cat(p) for tid, p in parts.items()}


def write(path, batches, **kw):
    with HDF5Writer(path, **kw) as writer:
        assert writer.partial.exists() and not path.exists()  # *.partial while open
        for b in batches:
            writer.extend(b)
    assert path.exists() and not writer.partial.exists()
    return path


ENVS = {
    "box": (lambda: gym.make("Pendulum-v1", max_episode_steps=37), "Pendulum-v1"),
    "discrete": (lambda: gym.make("CartPole-v1"), "CartPole-v1"),
    "dict": (lambda: gym.make("hpccollect-test/DictObs-v0"), "hpccollect-test/DictObs-v0"),
    "vector": (
        lambda: gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3),
        "CartPole-v1",
    ),
}


@pytest.mark.parametrize("kind", list(ENVS))
def test_write_then_read_equals_what_the_collector_produced(tmp_path, kind):
    make, env_id = ENVS[kind]
    batches = collect(make, 150, 900)
    path = write(tmp_path / f"{kind}.h5", batches, env=env_id, seed=0)
    expected = episodes_by_id(batches)
    with open_dataset(path) as ds:
        assert ds.check() == []
        assert len(ds) == sum(e.numel() for e in expected.values()) == 900
        assert ds.committed_episodes == len(expected)
        for episode in ds.episodes():
            tid = int(episode["collector", "traj_ids"][0])
            want = expected[tid].clone()
            want.names = None
            if not want["next", "done"][-1]:  # open at the end of the run: closed as truncated
                want["next", "truncated"][-1] = True
                want["next", "done"][-1] = True
            assert set(episode.keys(True, True)) == set(want.keys(True, True))
            for key in want.keys(True, True):
                got, ref = episode.get(key), want.get(key)
                assert got.dtype == ref.dtype and got.shape == ref.shape, key
                assert torch.equal(got, ref), key


def test_episodes_are_contiguous_and_only_whole_ones_are_committed(tmp_path):
    batches = collect(
        lambda: gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4), 40, 400
    )
    writer = HDF5Writer(tmp_path / "d.h5", env="CartPole-v1")
    writer.extend(batches[0])
    ends = batches[0]["next", "done"].sum().item()
    assert writer.committed_episodes == ends  # whole episodes only
    assert writer.open_episodes == int((~batches[0]["next", "done"][:, -1, 0]).sum())
    for b in batches[1:]:
        writer.extend(b)
    writer.close()
    with open_dataset(tmp_path / "d.h5") as ds:
        ids = ds.episode_ids
        runs = [int(ids[s]) for s, _ in ds.episode_bounds()]
        assert len(runs) == len(set(runs)) == ds.committed_episodes
        assert ds.check() == []


def test_metadata_attributes_and_keymap(tmp_path):
    batches = collect(lambda: gym.make("CartPole-v1"), 100, 200)
    path = write(
        tmp_path / "m.h5", batches, env="CartPole-v1", seed=7, config={"frames_per_batch": 100}
    )
    with h5py.File(path) as f:
        attrs = dict(f.attrs)
        assert attrs["format_version"] == 1 and attrs["env_id"] == "CartPole-v1"
        assert attrs["seed"] == 7 and json.loads(attrs["collector_config"]) == {
            "frames_per_batch": 100
        }
        assert (
            space_from_json(attrs["observation_space"]) == gym.make("CartPole-v1").observation_space
        )
        assert json.loads(attrs["action_space"])["type"] == "Discrete"
        assert "hpccollect_version" in attrs and "created" in attrs
        keymap = json.loads(attrs["keymap"])
        assert keymap["rewards"] == ["next", "reward"] and keymap["next_done"] == ["next", "done"]
        assert keymap["collector/traj_ids"] == ["collector", "traj_ids"]
        assert "next" not in f and "metadata" not in f  # no root next/metadata group
        assert f["rewards"].shape == (200,) and f["observations"].shape == (200, 4)
        assert f["observations"].compression is None
        assert f["observations"].chunks == (chunk_rows(16, None), 4)
        assert all(
            isinstance(f[name], h5py.Dataset) and f[name].ndim >= 1
            for name in ("observations", "episode")
        )


def test_writer_as_replay_buffer_with_start(tmp_path):
    writer = HDF5Writer(tmp_path / "bg.h5", env="CartPole-v1", compression="gzip")
    collector = SyncDataCollector(
        "CartPole-v1", None, frames_per_batch=100, total_frames=1000, replay_buffer=writer
    )
    collector.start()
    for _ in range(200):
        if not collector._background.alive:
            break
        time.sleep(0.05)
    collector.async_shutdown(timeout=10)
    writer.close()
    with open_dataset(tmp_path / "bg.h5") as ds:
        assert len(ds) == 1000 and ds.check() == []
        assert ds.file["observations"].compression == "gzip"


def test_writer_errors(tmp_path):
    path = write(tmp_path / "e.h5", collect("CartPole-v1", 10, 10))
    with pytest.raises(ArgumentValueError, match="already exists; pass overwrite=True"):
        HDF5Writer(path)
    with pytest.raises(ArgumentValueError, match="compression='zstd'"):
        HDF5Writer(tmp_path / "x.h5", compression="zstd")
    writer = HDF5Writer(tmp_path / "y.h5")
    with pytest.raises(ArgumentValueError, match="traj_ids"):
        writer.extend(TensorDict({"x": torch.zeros(3)}, [3]))
    with pytest.raises(ArgumentTypeError):
        writer.extend({"x": 1})
    writer.close()
    with pytest.raises(ArgumentValueError, match="closed"):
        writer.extend(collect("CartPole-v1", 10, 10)[0])
    batch = collect("CartPole-v1", 10, 10)[0]
    with HDF5Writer(tmp_path / "z.h5") as empty:  # an empty batch is taken, and adds nothing
        empty.extend(batch[:0])
        empty.extend(batch)
        empty.extend(batch[:0])
    with open_dataset(tmp_path / "z.h5") as ds:
        assert len(ds) == 10 and ds.check() == []
    with pytest.raises(ArgumentValueError, match="does not exist"):
        open_dataset(tmp_path / "nope.h5")
    (tmp_path / "junk.h5").write_text("not hdf5")
    with pytest.raises(ArgumentValueError, match="not a readable HDF5"):
        open_dataset(tmp_path / "junk.h5")


def test_overwrite_never_replaces_a_file_another_writer_writes(tmp_path):
    """The file's HDF5 lock says a writer has it (one of this process here: the lock is the
    open file's, whoever opened it)."""
    path = tmp_path / "live.h5"
    batches = collect("CartPole-v1", 20, 20)
    live = HDF5Writer(path)
    live.extend(batches[0])
    with pytest.raises(StorageError, match="another process is writing it"):
        HDF5Writer(path, overwrite=True)
    assert live.close() == path
    with open_dataset(path) as ds:
        assert ds.complete and ds.check() == []
    with HDF5Writer(path, overwrite=True) as again:  # no writer now: replaced
        again.extend(batches[0])


def test_reader_indexing_and_torch_dataset(tmp_path):
    path = write(tmp_path / "r.h5", collect("CartPole-v1", 100, 300), env="CartPole-v1")
    with open_dataset(path) as ds:
        whole = ds.to_tensordict()
        assert ds[5]["observation"].shape == (4,) and ds[5]["next", "reward"].shape == (1,)
        assert torch.equal(ds[[7, 2, 2]]["observation"], whole["observation"][[7, 2, 2]])
        assert torch.equal(ds[10:20:3]["action"], whole["action"][10:20:3])
        assert torch.equal(ds[-1]["observation"], whole["observation"][-1])
        for one in (torch.tensor(5), np.int64(5), np.array(5)):  # a 0-d index: one row
            assert ds[one].batch_size == () and torch.equal(
                ds[one]["observation"], ds[5]["observation"]
            )
        with pytest.raises(IndexError):
            ds[300]
        assert len(ds.returns()) == ds.committed_episodes
    data = TransitionDataset(path)
    loader = torch.utils.data.DataLoader(data, batch_size=32, collate_fn=torch.stack, num_workers=1)
    first = next(iter(loader))
    assert first.batch_size == (32,) and torch.equal(
        first["observation"], whole["observation"][:32]
    )


def test_the_registered_format_pickles_and_loads_its_parts_when_called(tmp_path):
    """The HDF5 format's parts are named, not imported, until called (inspect needs no
    torch); the format still pickles, by those names."""
    fmt = pickle.loads(pickle.dumps(dataset_format(name="hdf5")))
    assert repr(fmt.writer) == "called_on_use('hpccollect.storage.hdf5_writer:HDF5Writer')"
    with fmt.writer(tmp_path / "w.h5", env="CartPole-v1") as writer:
        for batch in collect("CartPole-v1", 100, 100):
            writer.extend(batch)
    with fmt.open(tmp_path / "w.h5") as ds:
        assert len(ds) == 100 and ds.check() == []


WRITER_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from conftest import CounterEnv
    from hpccollect import SyncDataCollector
    from hpccollect.storage import HDF5Writer
    collector = SyncDataCollector(lambda: CounterEnv(7), None, frames_per_batch=50)
    writer = HDF5Writer({path!r}, fsync_every=1)
    for batch in collector:
        writer.extend(batch)
        print(writer.committed_steps, flush=True)
""")


@pytest.mark.slow
@pytest.mark.parametrize("wait", [1.5, 2.5, 3.5])
def test_sigkill_keeps_every_committed_row_and_nothing_else(tmp_path, wait):
    path = tmp_path / "crash.h5"
    script = WRITER_SCRIPT.format(tests=os.path.dirname(__file__) + "/..", path=str(path))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    printed = []
    deadline = time.monotonic() + wait + 30
    while len(printed) < 3 and time.monotonic() < deadline:
        printed.append(int(proc.stdout.readline()))
    time.sleep(wait - 1)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    partial = tmp_path / "crash.h5.partial"
    assert partial.exists() and not path.exists()
    with open_dataset(partial) as ds:
        assert len(ds) >= printed[-1] > 0 and not ds.complete
        assert ds.check() == []
        data = ds.to_tensordict()
        for episode in ds.episodes():  # CounterEnv(7): every committed episode is 0..6, whole
            assert episode["observation"].squeeze(-1).tolist() == list(range(7))
            assert episode["next", "terminated"].squeeze(-1).tolist() == [False] * 6 + [True]
        assert data.shape[0] == ds.committed_steps == 7 * ds.committed_episodes
    fixed = repair(partial)
    assert fixed == path and not partial.exists()
    with open_dataset(path) as ds:
        assert ds.written_steps == len(ds) and ds.check() == [] and ds.complete
        assert ds.metadata["repaired"].startswith(f"kept {len(ds)} committed rows")


def test_repair_waits_for_a_writer_that_lets_go_and_names_one_that_does_not(tmp_path):
    """A killed writer holds HDF5's lock until its last thread has exited, a moment after it is
    reported gone: repair waits for the lock, and says so in one line if it never comes."""
    path = write(tmp_path / "held.h5", collect("CartPole-v1", 50, 100), env="CartPole-v1")
    partial = path.with_name("held.h5.partial")
    os.replace(path, partial)
    holder = os.open(partial, os.O_RDONLY)  # the lock HDF5 takes: flock on the whole file
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(
            StorageError,
            match=r"^cannot repair .*held.h5.partial: another "
            r"process still has it open for writing after 0.3 s",
        ) as err:
            repair(partial, lock_timeout=0.3)
        assert "\n" not in str(err.value) and partial.exists()
        threading.Timer(0.5, os.close, (holder,)).start()
        assert repair(partial) == path
    finally:
        with contextlib.suppress(OSError):
            os.close(holder)
    with open_dataset(path) as ds:
        assert len(ds) == 100 and ds.complete and ds.check() == []


def test_merge_three_shards(tmp_path):
    shards = []
    for i in range(3):
        batches = collect(
            "CartPole-v1", 100, 200 + 100 * i, seed=i, traj_id_offset=i, traj_id_stride=3
        )
        shards.append(write(tmp_path / "shards" / f"s{i}.h5", batches, env="CartPole-v1"))
    merged = merge_shards(shards, tmp_path / "dataset.h5")
    with open_dataset(merged) as ds:
        assert len(ds) == 900 and ds.check() == []
        parts = []
        for s in shards:
            with open_dataset(s) as shard:
                parts.append(shard.to_tensordict())
        assert (ds.to_tensordict() == torch.cat(parts)).all()
        assert ds.committed_episodes == sum(open_dataset(s).committed_episodes for s in shards)
    with pytest.raises(ArgumentValueError, match="already exists"):
        merge_shards(shards, merged)
    os.remove(shards[1])
    with pytest.raises(ArgumentValueError, match="shard.*s1.h5.*missing"):
        open_dataset(merged)


def d4rl_get_dataset(path):
    """A loader written to d4rl's documented rules for get_dataset."""
    with h5py.File(path, "r") as f:
        data = {k: f[k][:] for k in f.keys()}
    n = data["observations"].shape[0]
    for key in ("actions", "rewards", "terminals", "timeouts"):
        assert data[key].shape[0] == n, key
    assert data["rewards"].shape in ((n,), (n, 1)) and data["terminals"].shape in ((n,), (n, 1))
    return data


def d4rl_qlearning_dataset(data):
    """d4rl's qlearning_dataset rule: next obs is row i+1; steps that time out are dropped."""
    out = {k: [] for k in ("observations", "actions", "next_observations", "rewards", "terminals")}
    kept = []
    for i in range(data["rewards"].shape[0] - 1):
        if data["timeouts"][i]:
            continue
        out["observations"].append(data["observations"][i])
        out["actions"].append(data["actions"][i])
        out["next_observations"].append(data["observations"][i + 1])
        out["rewards"].append(data["rewards"][i])
        out["terminals"].append(bool(data["terminals"][i]))
        kept.append(i)
    return {k: np.array(v) for k, v in out.items()}, kept


@pytest.mark.parametrize("kind", ["box", "dict"])
def test_d4rl_export(tmp_path, kind):
    make, env_id = ENVS[kind]
    src = write(tmp_path / "src.h5", collect(make, 100, 400), env=env_id)
    out = export_d4rl(src, tmp_path / "d4rl.hdf5")
    with h5py.File(out) as f:
        assert f["observations"].compression == "gzip" and f["observations"].shuffle
    data = d4rl_get_dataset(out)
    q, kept = d4rl_qlearning_dataset(data)
    with open_dataset(src) as ds:
        assert data["observations"].shape[0] == len(ds)
        assert data["terminals"].sum() == ds.file["terminals"][:].sum()
    live = ~q["terminals"]
    # within an episode, d4rl's "next row" rule gives exactly the recorded next observation
    np.testing.assert_array_equal(
        q["next_observations"][live], data["next_observations"][kept][live]
    )


def test_minari_export_loads_with_minari(tmp_path, monkeypatch):
    minari = pytest.importorskip("minari")
    src = write(tmp_path / "src.h5", collect("CartPole-v1", 200, 600), env="CartPole-v1")
    target = export_minari(src, tmp_path / "datasets", "hpccollect/cartpole-v0")
    assert (target / "data" / "main_data.hdf5").exists() and (
        target / "data" / "metadata.json"
    ).exists()
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    dataset = minari.load_dataset("hpccollect/cartpole-v0")
    with open_dataset(src) as ds:
        assert dataset.total_episodes == ds.committed_episodes and dataset.total_steps == len(ds)
        for ours, theirs in zip(ds.episodes(), dataset.iterate_episodes(), strict=True):
            np.testing.assert_allclose(theirs.observations[:-1], ours["observation"].numpy())
            np.testing.assert_allclose(theirs.observations[1:], ours["next", "observation"].numpy())
            np.testing.assert_array_equal(theirs.actions, ours["action"].argmax(-1).numpy())
            np.testing.assert_allclose(theirs.rewards, ours["next", "reward"].squeeze(-1).numpy())
            np.testing.assert_array_equal(
                theirs.terminations, ours["next", "terminated"].squeeze(-1)
            )
            np.testing.assert_array_equal(theirs.truncations, ours["next", "truncated"].squeeze(-1))
    assert dataset.spec.observation_space == gym.make("CartPole-v1").observation_space
    with pytest.raises(ArgumentValueError, match="NAMESPACE/NAME-vN"):
        export_minari(src, tmp_path / "datasets", "bad id")


def test_memmap_export(tmp_path):
    src = write(
        tmp_path / "src.h5",
        collect("hpccollect-test/DictObs-v0", 100, 200),
        env="hpccollect-test/DictObs-v0",
    )
    out = export_memmap(src, tmp_path / "mm")
    loaded = TensorDict.load_memmap(out)
    with open_dataset(src) as ds:
        assert (loaded == ds.to_tensordict()).all()
        assert loaded["sensors", "lidar"].shape == (200, 3)


def test_replay_buffer_is_not_silently_copied_across_processes():
    import pickle

    with pytest.raises(TypeError, match="share_memory_"):
        pickle.dumps(ReplayBuffer(4))
