"""``collect --resume``: a run stopped by SIGTERM or killed continues where it stopped, with the
frames on disk counted once, new files per attempt, new seeds, and ``run.h5`` a view over all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_job_signals import committed, start, wait_for

from hpccollect.app.cli import main
from hpccollect.app.resume import SEED_STRIDE
from hpccollect.storage import open_dataset

pytestmark = [pytest.mark.slow]


def resume(cwd: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpccollect", "collect", "--quiet", "--resume", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def stop_midway(tmp_path: Path, sig: signal.Signals, *args) -> subprocess.Popen:
    """A run into run/data.h5, signalled (the whole process group) once it has committed."""
    proc = start(tmp_path, *map(str, args), "--out", "run/data.h5")
    try:
        wait_for(proc, committed(tmp_path / "run" / "data.h5.partial", 1000), 150, "batches")
        os.killpg(proc.pid, sig)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return proc


def first_observations(path: Path) -> set[bytes]:
    """The first observation of every episode: the same episode twice would repeat one."""
    with open_dataset(path) as ds:
        ids = np.asarray(ds.episode_ids)
        starts = np.flatnonzero(np.concatenate([[True], ids[1:] != ids[:-1]]))
        obs = ds[torch.as_tensor(starts)]["observation"].numpy()
        return {row.tobytes() for row in obs}


def attempt_attrs(path: Path) -> tuple[int, dict | None, int]:
    with open_dataset(path) as ds:
        config = json.loads(ds.file.attrs["collector_config"])
        return int(ds.file.attrs["seed"]), config.get("resume"), ds.committed_steps


@pytest.mark.timeout(420)
def test_a_run_stopped_by_sigterm_resumes_to_exactly_its_total(tmp_path):
    total = 12_000
    proc = stop_midway(  # one process a run: the attempts' files are what is tested
        tmp_path, signal.SIGTERM, "--collector", "single", "--total-frames", total,
        "--frames-per-batch", 500, "--seed", 7,
    )  # fmt: skip
    assert proc.returncode == 0
    with open_dataset(tmp_path / "run" / "data.h5") as ds:
        before = len(ds)
    assert 0 < before < total

    done = resume(tmp_path, "run")  # the run directory, as jobs/collect.sh's requeue does
    assert done.returncode == 0, done.stderr
    assert f"{before} of {total} frames on disk, attempt 1 collects {total - before}" in done.stderr
    assert f"data.h5 holds {total} of {total} frames" in done.stdout
    folder = tmp_path / "run" / "data.shards"
    first, second = folder / "attempt-0.h5", folder / "attempt-1.h5"
    assert sorted(p.name for p in folder.iterdir()) == [first.name, second.name]
    with open_dataset(tmp_path / "run" / "data.h5") as ds:
        assert len(ds) == total and ds.check() == [] and ds.complete
        ids = np.asarray(ds.episode_ids)
        order = ids[np.concatenate([[True], ids[1:] != ids[:-1]])]
        assert len(order) == len(np.unique(order)) == ds.committed_episodes
    assert attempt_attrs(first) == (7, None, before)
    seed, record, frames = attempt_attrs(second)
    assert seed == 7 + SEED_STRIDE and frames == total - before
    assert record == {
        "attempt": 1,
        "run_seed": 7,
        "run_total_frames": total,
        "frames_before": before,
    }
    assert not first_observations(first) & first_observations(second)

    again = resume(tmp_path, "run/data.h5")  # complete: nothing to do, nothing changes
    assert again.returncode == 0 and "is complete" in again.stderr, again.stderr
    assert sorted(p.name for p in folder.iterdir()) == [first.name, second.name]
    more = resume(tmp_path, "run/data.h5", "--total-frames", total + 1000)
    assert more.returncode == 0, more.stderr
    with open_dataset(tmp_path / "run" / "data.h5") as ds:
        assert len(ds) == total + 1000 and ds.check() == []
    assert attempt_attrs(folder / "attempt-2.h5")[1]["frames_before"] == total


@pytest.mark.timeout(300)
def test_a_killed_run_is_repaired_and_resumed(tmp_path):
    total, batch = 30_000, 500
    proc = stop_midway(
        tmp_path, signal.SIGKILL, "--collector", "single", "--total-frames", total,
        "--frames-per-batch", batch,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / "run" / "data.h5.partial").exists()
    # as a writer killed while it made its file leaves it: a superblock and nothing more
    (tmp_path / "run" / "data.h5.partial.new").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(88))
    done = resume(tmp_path, "run/data.h5")
    assert done.returncode == 0, done.stderr
    assert not list((tmp_path / "run").rglob("*.partial*"))
    with open_dataset(tmp_path / "run" / "data.h5") as ds:
        # the killed attempt lost its unfinished episodes: whole batches make up for them
        assert total <= len(ds) < total + batch and ds.check() == []
    with open_dataset(tmp_path / "run" / "data.shards" / "attempt-0.h5") as ds:
        assert ds.complete and 0 < len(ds) < total


def small_run(tmp_path: Path, out: str, *extra: str) -> None:
    args = ["collect", "--quiet", "--collector", "single", "--policy", "random"]
    args += ["--total-frames", "400", "--frames-per-batch", "200", "--out", out, *extra]
    assert main(args) == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--resume", "nowhere.h5"], "--resume nowhere.h5: no run there"),
        (["--resume", "run/data.h5", "--overwrite"], "--overwrite cannot be combined"),
        (["--resume", "run/data.h5", "--out", "x.h5"], "--out cannot be combined with --resume"),
        (["--resume", "run/data.h5", "--env", "Pendulum-v1"], "--env 'Pendulum-v1' differs"),
        (["--resume", "run/data.h5", "--seed", "3"], "--seed 3 differs from the run's 0"),
        (["--resume", "two"], "must hold exactly one dataset (found: a.h5, b.h5)"),
    ],
)
def test_resume_mistakes_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, says):
    monkeypatch.chdir(tmp_path)
    small_run(tmp_path, "run/data.h5")
    small_run(tmp_path, "two/a.h5")
    small_run(tmp_path, "two/b.h5")
    capsys.readouterr()
    assert main(["collect", "--quiet", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["data.h5"]  # untouched


@pytest.mark.timeout(120)
def test_resuming_a_finished_run_changes_no_file(tmp_path, monkeypatch, capsys):
    """Nothing to collect: the run's file is not moved into a shards folder under a new view
    (it was, and an export of that view onto its shard then destroyed the data)."""
    monkeypatch.chdir(tmp_path)
    small_run(tmp_path, "run/data.h5")
    kept = (tmp_path / "run" / "data.h5").read_bytes()
    capsys.readouterr()
    assert main(["collect", "--quiet", "--resume", "run/data.h5"]) == 0
    assert "is complete: 400 of 400 frames are on disk" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["data.h5"]
    assert (tmp_path / "run" / "data.h5").read_bytes() == kept


@pytest.mark.timeout(120)
def test_a_fresh_run_does_not_take_in_an_earlier_runs_attempts(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    small_run(tmp_path, "run/data.h5")
    assert main(["collect", "--quiet", "--resume", "run", "--total-frames", "600"]) == 0
    folder = tmp_path / "run" / "data.shards"
    assert sorted(p.name for p in folder.iterdir()) == ["attempt-0.h5", "attempt-1.h5"]
    (tmp_path / "run" / "data.h5").unlink()  # the view gone, the attempts still there
    capsys.readouterr()
    assert main(["collect", "--quiet", "--out", "run/data.h5", "--policy", "random"]) == 2
    err = capsys.readouterr().err
    assert "attempt-0.h5 already exists" in err and "--resume run/data.h5" in err
    small_run(tmp_path, "run/data.h5", "--overwrite")
    assert not list(folder.iterdir())
    with open_dataset(tmp_path / "run" / "data.h5") as ds:
        assert len(ds) == 400 and "merged_from" not in ds.file.attrs


def test_a_run_stopped_before_any_file_held_a_row_says_to_start_it_again(
    tmp_path, monkeypatch, capsys
):
    """All a kill left is a collector rank's file being made: nothing to resume from."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "run" / "data.shards"
    folder.mkdir(parents=True)
    (folder / "rank-0001.h5.partial.new").write_bytes(b"\x89HDF\r\n\x1a\n")
    assert main(["collect", "--quiet", "--resume", "run/data.h5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "stopped before any of its files held a row" in err
