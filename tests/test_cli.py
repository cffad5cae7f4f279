"""``python -m hpccollect`` end to end, through subprocess, as a user runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import h5py
import pytest
import torch

from hpccollect.storage import open_dataset

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def run(*args, cwd, timeout=150, env=None):
    env = {k: v for k, v in (env or os.environ).items() if k != "HPCCOLLECT_DATA_DIR"}
    command = [sys.executable, "-m", "hpccollect", *map(str, args)]
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def small(*extra):
    return [
        "--collector",
        "sync",
        "--total-frames",
        400,
        "--frames-per-batch",
        200,
        "--quiet",
        *extra,
    ]


def test_default_run_then_inspect_merge_export(tmp_path):
    done = run(cwd=tmp_path)  # no arguments: the embedded default job
    assert done.returncode == 0, done.stderr
    path = tmp_path / "data" / "CartPole-v1-seed0.h5"
    assert (
        "frames collected  20000" in done.stdout and str(path.relative_to(tmp_path)) in done.stdout
    )
    assert "episode return" in done.stdout and "mean return" in done.stderr  # summary and progress
    with open_dataset(path) as ds:
        assert len(ds) == 20000 and ds.check() == [] and ds.metadata["env_id"] == "CartPole-v1"

    inspect = run("inspect", path, cwd=tmp_path)
    assert inspect.returncode == 0, inspect.stderr
    for text in (
        "(complete)",
        "20000 committed, 20000 written",
        "observation",
        "next/reward",
        "integrity         ok",
    ):
        assert text in inspect.stdout

    second = run(*small("--seed", 1, "--out", "data/second.h5"), cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    merged = run("merge", path, "data/second.h5", "--out", "merged/all.h5", cwd=tmp_path)
    assert merged.returncode == 0 and "20400 frames" in merged.stdout, merged.stderr

    d4rl = run("export", "merged/all.h5", "--format", "d4rl", "--out", "d4rl.hdf5", cwd=tmp_path)
    assert d4rl.returncode == 0, d4rl.stderr
    with h5py.File(tmp_path / "d4rl.hdf5") as f:
        assert f["observations"].shape == (20400, 4) and f["terminals"].shape == (20400,)
    mm = run("export", "data/second.h5", "--format", "memmap", "--out", "mm", cwd=tmp_path)
    assert mm.returncode == 0, mm.stderr
    from tensordict import TensorDict

    assert TensorDict.load_memmap(tmp_path / "mm").shape == (400,)
    minari = run(
        "export",
        "data/second.h5",
        "--format",
        "minari",
        "--out",
        "minari",
        "--dataset-id",
        "hpccollect/cartpole-v0",
        cwd=tmp_path,
    )
    assert minari.returncode == 0, minari.stderr
    assert (tmp_path / "minari/hpccollect/cartpole-v0/data/main_data.hdf5").exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--env", "NoSuchEnv-v9"], "unknown gymnasium env 'NoSuchEnv-v9'"),
        (["--frames-per-batch", "abc"], "invalid int value"),
        (["--collector", "fast"], "invalid choice"),
        (["--total-frames", "450"], "must be a multiple of --frames-per-batch"),
        (["--num-workers", "0"], "--num-workers must be a positive integer"),
        (["--env-kwargs", "{oops"], "not JSON"),
        (["--env-kwargs", '{"no_such_kwarg": 1}'], "--env CartPole-v1 with --env-kwargs"),
        (["--policy", "missing.pt"], "--policy 'missing.pt' is not"),
        (["--policy", "json:nothing_here"], "cannot import nothing_here"),
        (["--config", "missing.toml"], "--config: missing.toml does not exist"),
        (["inspect", "missing.h5"], "missing.h5 does not exist"),
        (["inspect", "junk.h5"], "not a readable HDF5 file"),
        (["export", "junk.h5", "--format", "csv", "--out", "x"], "invalid choice"),
        (["export", "junk.h5", "--format", "minari", "--out", "x"], "needs --dataset-id"),
    ],
)
def test_user_mistakes_get_one_line_and_exit_code_2(tmp_path, args, message):
    (tmp_path / "junk.h5").write_text("not an hdf5 file")
    if args[0] in ("inspect", "export"):
        done = run(*args, cwd=tmp_path)
    else:
        done = run(*small(*args), cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.startswith("hpccollect")]
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_existing_output_needs_overwrite(tmp_path):
    assert run(*small("--out", "a.h5"), cwd=tmp_path).returncode == 0
    again = run(*small("--out", "a.h5"), cwd=tmp_path)
    assert again.returncode == 2 and "already exists; pass --overwrite" in again.stderr
    assert run(*small("--out", "a.h5", "--overwrite"), cwd=tmp_path).returncode == 0


def test_toml_config_and_policies(tmp_path):
    (tmp_path / "run.toml").write_text(
        'env = "Pendulum-v1"\ntotal-frames = 600\nframes_per_batch = 200\ncollector = "multi-async"\n'
        'num_workers = 2\nmax_steps = 50\ncompression = "gzip"\nout = "pendulum.h5"\n'
        "[env_kwargs]\ng = 9.0\n"
    )
    done = run("--config", "run.toml", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with open_dataset(tmp_path / "pendulum.h5") as ds:
        assert len(ds) == 600 and ds.metadata["env_id"] == "Pendulum-v1"
        assert ds.metadata["collector_config"]["env_kwargs"] == {"g": 9.0}
        assert int(ds.to_tensordict()["next", "step_count"].max()) <= 50
        assert ds.file["observations"].compression == "gzip"
    override = run(
        "--config", "run.toml", "--total-frames", 200, "--out", "p2.h5", "--quiet", cwd=tmp_path
    )
    assert override.returncode == 0 and open_dataset(tmp_path / "p2.h5").committed_steps == 200

    from hpccollect.envs import GymEnv
    from hpccollect.policy import MLPActor

    env = GymEnv("CartPole-v1")
    actor = MLPActor([(4,)], env.action_codec.spec)
    torch.save(actor.state_dict(), tmp_path / "actor.pt")
    ckpt = run(*small("--policy", "actor.pt", "--out", "c.h5"), cwd=tmp_path)
    assert ckpt.returncode == 0, ckpt.stderr
    (tmp_path / "mypolicies.py").write_text(
        "import torch\n"
        "def always_left(observation_space, action_space):\n"
        "    return lambda observation: torch.tensor([1, 0])\n"
    )
    factory = run(
        *small("--policy", "mypolicies:always_left", "--out", "f.h5"),
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert factory.returncode == 0, factory.stderr
    with open_dataset(tmp_path / "f.h5") as ds:
        assert (ds.to_tensordict()["action"].argmax(-1) == 0).all()
    random = run(*small("--policy", "random", "--out", "r.h5"), cwd=tmp_path)
    assert random.returncode == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_mid_run_keeps_committed_data(tmp_path, sig):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpccollect",
            "--collector",
            "multi-sync",
            "--total-frames",
            "10000000",
            "--frames-per-batch",
            "500",
            "--out",
            "long.h5",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the progress line shows frames are flowing
            line = proc.stderr.readline()
            if "frames/s" in line and "/10000000 frames" in line:
                break
        time.sleep(1)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert f"stopped early by {sig.name}" in out
    with open_dataset(tmp_path / "long.h5") as ds:
        assert len(ds) > 0 and ds.check() == [] and ds.metadata["complete"]
        assert f"episodes kept     {ds.committed_episodes}" in out
