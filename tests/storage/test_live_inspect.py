"""Reading and inspecting a file while another process writes it; what inspect shows."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gymnasium as gym
import pytest
import torch

from hpccollect import SyncDataCollector
from hpccollect.storage import HDF5Writer, open_dataset

TESTS = str(Path(__file__).resolve().parent.parent)

WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from conftest import CounterEnv
    from hpccollect import SyncDataCollector
    from hpccollect.storage import HDF5Writer

    collector = SyncDataCollector(lambda: CounterEnv(7), None, frames_per_batch=70)
    writer = HDF5Writer(
        {path!r},
        env="hpccollect-test/Counter-v0",
        env_kwargs={{"length": 7}},
        seed=11,
        config={{"frames_per_batch": 70, "collector": "sync"}},
    )
    for batch in collector:
        writer.extend(batch)
        print(writer.committed_steps, flush=True)
        time.sleep(0.02)
""")


def assert_counter_rows(ds) -> None:
    """Every committed row is CounterEnv(7)'s: episodes of steps 0..6, reward = step + 1."""
    data = ds.to_tensordict()
    obs = data["observation"].reshape(-1, 7)
    assert torch.equal(obs, torch.arange(7.0).expand_as(obs))
    assert torch.equal(data["next", "reward"].reshape(-1, 7), obs + 1)


def inspect(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpccollect", "inspect", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_inspect_and_read_a_file_while_another_process_writes_it(tmp_path):
    path = tmp_path / "live.h5"
    partial = tmp_path / "live.h5.partial"
    script = WRITER.format(tests=TESTS, path=str(path))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert int(proc.stdout.readline()) > 0  # it has committed, and goes on writing
        seen, deadline = [], time.monotonic() + 60
        while len(seen) < 6 or (seen[-1] == seen[0] and time.monotonic() < deadline):
            with open_dataset(partial) as ds:
                assert not ds.complete and ds.check() == []
                assert len(ds) == 7 * ds.committed_episodes
                assert_counter_rows(ds)
                seen.append(len(ds))
            time.sleep(0.3)
        assert seen == sorted(seen) and seen[-1] > seen[0]  # rows kept coming in meanwhile
        done = inspect(partial)
        assert proc.poll() is None  # still writing while inspect read it
        assert done.returncode == 0, done.stderr
        out = done.stdout
        assert "unfinished" in out and f"python -m hpccollect repair {partial}" in out
        assert "integrity         ok" in out
        assert "episode length    mean 7.00  min 7  max 7" in out
        assert "truncated)" in out and " 0 truncated" in out
        assert "seed              11" in out
        assert 'env kwargs        {"length": 7}' in out
        config = next(line for line in out.splitlines() if line.startswith("collector "))
        assert "frames_per_batch=70" in config and 'collector="sync"' in config
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    done = inspect(partial)  # a killed run's file: same answer
    assert done.returncode == 0 and "integrity         ok" in done.stdout, done.stdout


@pytest.mark.timeout(60)
def test_episode_ends_count_terminated_and_truncated(tmp_path):
    collector = SyncDataCollector(
        lambda: gym.make("hpccollect-test/Counter-v0", length=7),
        None,
        frames_per_batch=30,
        total_frames=60,
    )
    with HDF5Writer(tmp_path / "e.h5") as writer:
        for batch in collector:
            writer.extend(batch)
    collector.shutdown()
    with open_dataset(tmp_path / "e.h5") as ds:
        # 60 steps: 8 whole episodes of 7, then 4 steps written as truncated at close
        assert ds.episode_ends() == {"terminated": 8, "truncated": 1}
        assert ds.episode_lengths().tolist() == [7] * 8 + [4]
        assert ds.complete


@pytest.mark.timeout(60)
def test_a_file_whose_writer_has_committed_nothing_yet_reads_as_empty(tmp_path):
    path = tmp_path / "fresh.h5"
    script = (
        "import time\nfrom hpccollect.storage import HDF5Writer\n"
        f"writer = HDF5Writer({str(path)!r}, env='CartPole-v1')\nprint(1, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "1"
        with open_dataset(tmp_path / "fresh.h5.partial") as ds:
            assert len(ds) == 0 and not ds.complete and ds.check() == []
            assert ds.metadata["env_id"] == "CartPole-v1"
            assert ds.episode_ends() == {"terminated": 0, "truncated": 0}
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
