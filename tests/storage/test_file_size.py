"""Chunks sized from the row size and the expected rows: a small run makes a small file."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import h5py
import pytest

from hpccollect import SyncDataCollector
from hpccollect.errors import ArgumentValueError
from hpccollect.storage import HDF5Writer, open_dataset
from hpccollect.storage.hdf5_writer import chunk_rows

pytestmark = pytest.mark.timeout(120)


def data_bytes(path) -> int:
    with h5py.File(path) as f:
        sizes = []
        f.visititems(
            lambda _, obj: sizes.append(obj.nbytes) if isinstance(obj, h5py.Dataset) else None
        )
    return sum(sizes)


@pytest.fixture(scope="module")
def cartpole_4000():
    collector = SyncDataCollector(
        lambda: gym.make("CartPole-v1"), None, frames_per_batch=1000, total_frames=4000
    )
    collector.set_seed(0)
    batches = [b.clone() for b in collector]
    collector.shutdown()
    return batches


@pytest.mark.parametrize("expected_rows", [None, 4000])
def test_a_4000_frame_cartpole_file_is_about_its_data_size(tmp_path, cartpole_4000, expected_rows):
    path = tmp_path / "small.h5"
    with HDF5Writer(path, env="CartPole-v1", expected_rows=expected_rows) as writer:
        for batch in cartpole_4000:
            writer.extend(batch)
    size, data = path.stat().st_size, data_bytes(path)
    assert 250_000 < data < 400_000  # 4,000 rows of ~74 bytes
    # 1 MiB chunks made this 12.6 MB; now: the data, plus at most one small chunk per dataset
    assert size < 1_000_000 and size < data + 16 * (16 << 10), (size, data)
    with open_dataset(path) as ds:
        assert len(ds) == 4000 and ds.check() == []


def test_chunks_grow_with_the_expected_rows():
    assert chunk_rows(16, 4000) * 16 == 16 << 10  # the 16 KiB floor
    assert chunk_rows(16, 400_000) == 400_000 // 8  # an eighth of the data per chunk
    assert chunk_rows(16, 100_000_000) * 16 == 1 << 20  # capped at chunk_bytes
    assert chunk_rows(16, 100_000_000, max_bytes=1 << 16) * 16 == 1 << 16
    assert chunk_rows(1 << 22, 10) == 1  # a row bigger than a chunk: one row per chunk
    with pytest.raises(ArgumentValueError, match="expected_rows must be a positive integer"):
        HDF5Writer("never.h5", expected_rows=0)


@pytest.mark.slow
def test_cli_run_of_4000_frames_makes_a_small_file(tmp_path):
    out = tmp_path / "cli.h5"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "hpccollect", "--env", "CartPole-v1", "--collector", "single"),
            *("--frames-per-batch", "1000", "--total-frames", "4000", "--out", str(out), "--quiet"),
        ],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size < 1_000_000
    assert out.stat().st_size < 2 * data_bytes(out)
