"""The fast minibatch path (read_rows, __getitems__, sample, in_memory) returns exactly ds[index]."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from hpccollect import SyncDataCollector
from hpccollect.storage import HDF5Writer, TransitionDataset, open_dataset

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def dict_file(tmp_path_factory):
    """A file with nested keys (a Dict observation with a nested Dict) and squeezed columns."""
    path = tmp_path_factory.mktemp("reads") / "dict.h5"
    collector = SyncDataCollector(
        lambda: gym.make("hpccollect-test/DictObs-v0"), None, frames_per_batch=200, total_frames=600
    )
    collector.set_seed(3)
    with HDF5Writer(path, env="hpccollect-test/DictObs-v0") as writer:
        for batch in collector:
            writer.extend(batch)
    collector.shutdown()
    return path


class ImageEnv(gym.Env):
    """A 20x20 uint8 observation: 400 values per row (read with h5py's fancy indexing)."""

    observation_space = gym.spaces.Box(0, 255, (20, 20), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.integers(0, 255, (20, 20), dtype=np.uint8), {}

    def step(self, action):
        self.t += 1
        obs = self.np_random.integers(0, 255, (20, 20), dtype=np.uint8)
        return obs, float(self.t), self.t >= 9, False, {}


@pytest.fixture(scope="module")
def image_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("reads") / "image.h5"
    collector = SyncDataCollector(ImageEnv, None, frames_per_batch=100, total_frames=200)
    collector.set_seed(4)
    with HDF5Writer(path) as writer:
        for batch in collector:
            writer.extend(batch)
    collector.shutdown()
    return path


def assert_same(got, want):
    assert got.batch_size == want.batch_size
    assert set(got.keys(True, True)) == set(want.keys(True, True))
    for key in want.keys(True, True):
        a, b = got.get(key), want.get(key)
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), key


def minibatches():
    rng = np.random.default_rng(0)
    yield rng.integers(0, 600, 64)  # unsorted, with repeats
    yield np.sort(rng.choice(600, 50, replace=False))  # sorted unique
    yield np.array([599, -1, 0, -600, 5, 5])  # negative rows and repeats
    yield np.array([], dtype=np.int64)


def test_read_rows_and_getitems_give_exactly_the_rows_of_ds_index(dict_file):
    data = TransitionDataset(dict_file)
    cached = TransitionDataset(dict_file, in_memory=True)
    with open_dataset(dict_file) as ds:
        whole = ds.to_tensordict()
        for rows in minibatches():
            want = whole[torch.as_tensor(rows % 600, dtype=torch.long)]
            if len(rows):
                assert_same(ds[torch.as_tensor(rows)], want)
            assert_same(ds.read_rows(rows), want)
            assert_same(data.__getitems__(rows.tolist()), want)
            assert_same(cached.__getitems__(rows.tolist()), want)
        with pytest.raises(IndexError, match="out of range"):
            ds.read_rows([600])
        with pytest.raises(IndexError, match="1-d"):
            ds.read_rows([[1, 2]])


def test_read_rows_of_large_rows(image_file):
    with open_dataset(image_file) as ds:
        rows = np.array([150, 3, 3, 199, 0])
        assert_same(ds.read_rows(rows), ds.to_tensordict()[torch.as_tensor(rows)])


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_recipe_batches_are_the_rows_it_sampled(dict_file, workers):
    """The README recipe: one __getitems__ call per minibatch, default collate, workers too."""
    order = torch.randperm(600, generator=torch.Generator().manual_seed(1)).tolist()
    loader = torch.utils.data.DataLoader(
        TransitionDataset(dict_file), batch_size=64, sampler=order, num_workers=workers
    )
    with open_dataset(dict_file) as ds:
        whole = ds.to_tensordict()
    seen = 0
    for i, batch in enumerate(loader):
        rows = torch.tensor(order[i * 64 : (i + 1) * 64])
        assert_same(batch, whole[rows])
        seen += len(rows)
    assert seen == 600


def test_sample_is_reproducible_with_a_generator(dict_file):
    with open_dataset(dict_file) as ds:
        a = ds.sample(128, torch.Generator().manual_seed(5))
        b = ds.sample(128, torch.Generator().manual_seed(5))
        rows = torch.randint(len(ds), (128,), generator=torch.Generator().manual_seed(5))
        assert_same(a, b)
        assert_same(a, ds.to_tensordict()[rows])
