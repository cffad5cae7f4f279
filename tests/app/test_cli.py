"""``python -m hpccollect`` end to end, through subprocess, as a user runs it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import h5py
import pytest
import torch
from test_job_signals import committed, wait_for

from hpccollect.app.cli import main
from hpccollect.storage import open_dataset

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def run(*args, cwd, timeout=150, env=None):
    env = {k: v for k, v in (env or os.environ).items() if k != "HPCCOLLECT_DATA_DIR"}
    command = [sys.executable, "-m", "hpccollect", *map(str, args)]
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def on_path(folder):
    """The environment with ``folder`` first on PYTHONPATH (for modules a test writes)."""
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def small(*extra):
    return [
        "--collector",
        "single",
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
    # both rates are labelled, and the progress line's last rate is the summary's "while
    # collecting" rate (same clock); the mean returns say over which episodes
    last = [line for line in done.stderr.splitlines() if "20000/20000 frames" in line][-1]
    assert "frames/s while collecting" in last and "mean return" in last
    assert "(last 100 episodes)" in last
    progress_rate = float(
        re.search(r"([\d,]+) frames/s while collecting", last)[1].replace(",", "")
    )
    summary_rate = float(
        re.search(r"([\d,]+) frames/s while collecting", done.stdout)[1].replace(",", "")
    )
    assert abs(progress_rate - summary_rate) <= 0.05 * summary_rate, (last, done.stdout)
    assert "frames/s incl. start-up and shutdown" in done.stdout
    assert re.search(r"\(all \d+ kept episodes\)", done.stdout), done.stdout
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
        (
            ["--total-frames", "450"],
            "must be a multiple of --frames-per-batch (200), e.g. 400 or 600",
        ),
        (
            [
                "--collector",
                "multi-sync",
                "--num-envs",
                3,
                "--num-workers",
                2,
                "--total-frames",
                6000,
                "--frames-per-batch",
                1000,
            ],
            "cannot be split evenly over 2 workers x 3 env(s) (multi-sync gives each of the 6 "
            "envs the same share): use a multiple of 6 that divides --total-frames 6000, e.g. "
            "750 or 1200",
        ),
        (["--num-envs", 3], "--frames-per-batch 200 cannot be split evenly over 3 env(s)"),
        (["--worker-timeout", "0"], "--worker-timeout must be a number of seconds > 0"),
        (["--import", "no_such_module_xyz"], "--import no_such_module_xyz: cannot import module"),
        (["--env", "no_such_module_xyz:Env-v0"], "--env no_such_module_xyz:Env-v0: cannot import"),
        (["--env", "json:Env-v0"], "unknown gymnasium env 'Env-v0' (module 'json' was imported"),
        (["--out", "/proc/hpccollect-test.h5"], "--out /proc/hpccollect-test.h5: cannot write in"),
        (["--out", "afile/x.h5"], "--out afile/x.h5: cannot write in afile"),
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
        (["--seed", "-5"], "--seed must be an integer from 0 to 9223372036854775807"),
        (["--seed", str(2**64)], "--seed must be an integer from 0 to"),
        (["--out", "adir"], "--out adir is a directory; give a file path, e.g. --out adir/"),
        (["--out", "adir", "--overwrite"], "--out adir is a directory"),
        (["--out", "x.h5.partial"], "give the finished name, --out x.h5."),
        (["--out", ""], "--out must be a non-empty string, got ''"),
        (["--policy", ":x"], "--policy :x: a factory is module:function, both named"),
        (["--config", "adir"], "--config: cannot read adir (Is a directory)"),
        (["--config", "env.toml"], "--env must be a non-empty string, got 5"),
        (["--config", "seed.toml"], "--seed must be an integer from 0 to"),
        (["--config", "overwrite.toml"], "--overwrite is true or false, got 'no'"),
        (["--config", "table.toml"], "'collect' must be a table ([collect]) of options, got 3"),
        (["inspect", ""], "argument file: must be a path, got an empty string"),
        (["repair", "junk.h5"], "junk.h5 is not an HDF5 file (no HDF5 signature in it)"),
        (["repair", "unborn.h5"], "unborn.h5.partial.new, left by a writer killed before"),
        (["merge", "junk.h5", "--out", "adir", "--overwrite"], "--out adir is a directory"),
        (["merge", "junk.h5", "--out", "/proc/m.h5"], "--out /proc/m.h5: cannot write in /proc"),
        (["export", "junk.h5", "--format", "d4rl", "--out", "/proc/e.hdf5"], "cannot write in"),
        (["export", "junk.h5", "--format", "memmap", "--out", "afile"], "afile is a file"),
        (
            ["export", "junk.h5", "--format", "d4rl", "--dataset-id", "a/b-v0", "--out", "e"],
            "--dataset-id names a Minari dataset; --format d4rl takes none",
        ),
    ],
)
def test_user_mistakes_get_one_line_and_exit_code_2(tmp_path, monkeypatch, capsys, args, message):
    (tmp_path / "junk.h5").write_text("not an hdf5 file")
    (tmp_path / "unborn.h5.partial.new").write_bytes(b"\x89HDF\r\n\x1a\n")  # a kill's leftover
    (tmp_path / "afile").write_text("a regular file")
    (tmp_path / "adir").mkdir()
    for name, text in TOML_MISTAKES.items():
        (tmp_path / name).write_text(text)
    commands = ("inspect", "export", "merge", "repair")
    argv = list(map(str, args if args[0] in commands else small(*args)))
    if message in IN_A_FRESH_PROCESS:
        done = run(*argv, cwd=tmp_path)
        code, err = done.returncode, done.stderr
    else:
        code, err = in_process(tmp_path, monkeypatch, capsys, argv)
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("hpccollect")]
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err
    assert "collecting" not in err  # what the run would do is said once it starts, not before


#: a --config file of each kind of wrong value
TOML_MISTAKES = {
    "env.toml": "env = 5\n",
    "seed.toml": 'seed = "abc"\n',
    "overwrite.toml": 'overwrite = "no"\n',
    "table.toml": "collect = 3\n",
}

#: mistakes also checked through a new ``python -m hpccollect`` process (its exit status, and
#: nothing else on stderr from imports); the others run in this process, which is quicker
IN_A_FRESH_PROCESS = {
    "unknown gymnasium env 'NoSuchEnv-v9'",
    "invalid int value",
    "--import no_such_module_xyz: cannot import module",
    "not a readable HDF5 file",
    "needs --dataset-id",
    "--seed must be an integer from 0 to 9223372036854775807",
}


def in_process(tmp_path, monkeypatch, capsys, argv) -> tuple[int, str]:
    """``main(argv)`` in this process, as ``run`` would start it: (exit code, stderr)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HPCCOLLECT_DATA_DIR", raising=False)
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as done:
        code = done.code
    return code, capsys.readouterr().err


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
        env=on_path(tmp_path),
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


def test_unwritable_output_is_refused_before_any_worker_starts(tmp_path):
    """A read-only file system (a tmpfs mounted ro; root ignores permissions), with an env
    whose workers would take a minute to start: the refusal comes first."""
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)])
    if mounted.returncode != 0:  # CI runs as root: there it must run
        (pytest.fail if os.environ.get("CI") else pytest.skip)("cannot mount a tmpfs here")
    try:
        (tmp_path / "slowstart.py").write_text(
            "import multiprocessing, time, gymnasium as gym\n"
            "from gymnasium.envs.classic_control.cartpole import CartPoleEnv\n"
            "class SlowStart(CartPoleEnv):\n"
            "    def __init__(self, **kw):\n"
            "        if multiprocessing.parent_process() is not None:\n"
            "            time.sleep(120)\n"
            "        super().__init__(**kw)\n"
            "gym.register('SlowStart-v0', entry_point=SlowStart)\n"
        )
        args = ["--collector", "multi-sync", "--import", "slowstart", "--env", "SlowStart-v0"]
        done = run(
            *small(*args, "--out", "ro/sub/x.h5"),
            cwd=tmp_path,
            env=on_path(tmp_path),
            timeout=60,
        )
    finally:
        subprocess.run(["umount", str(ro)])
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("hpccollect")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "--out ro/sub/x.h5: cannot write in ro/sub (Read-only file system)" in done.stderr


def _state_dict_files(tmp_path):
    from hpccollect.envs import GymEnv
    from hpccollect.policy import MLPActor

    pendulum = GymEnv("Pendulum-v1")
    torch.save(MLPActor([(3,)], pendulum.action_codec.spec).state_dict(), tmp_path / "shape.pt")
    torch.save({"weight": torch.zeros(2)}, tmp_path / "keys.pt")
    torch.save([torch.zeros(2)], tmp_path / "list.pt")
    torch.save({"model": object.__new__(torch.nn.Linear)}, tmp_path / "objects.pt")
    (tmp_path / "corrupt.pt").write_bytes(b"PK\x03\x04 this is not a whole zip archive")
    (tmp_path / "factories.py").write_text(
        "def raises(observation_space, action_space):\n"
        "    raise RuntimeError('no GPU here')\n"
        "def returns_none(observation_space, action_space):\n"
        "    return None\n"
        "def returns_number(observation_space, action_space):\n"
        "    return 3\n"
    )
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom at import')\n")


@pytest.mark.parametrize(
    "policy,message",
    [
        (
            "factories:raises",
            "factories:raises: raises(observation_space, action_space) raised "
            "RuntimeError: no GPU here",
        ),
        (
            "factories:returns_none",
            "returns_none() returned NoneType, not a policy; return an nn.Module or a callable",
        ),
        ("factories:returns_number", "returns_number() returned int, not a policy"),
        ("broken:make", "cannot import make from broken (RuntimeError: boom at import)"),
        (
            "shape.pt",
            "shape.pt: shapes do not match the default MLP for this env (was it trained on "
            "another env?): net.0.weight (64, 3) (needs (64, 4))",
        ),
        ("keys.pt", "unexpected ['weight']; expected a state_dict of the default MLP for this env"),
        ("list.pt", "holds a list, not a state_dict; expected a state_dict of the default MLP"),
        ("objects.pt", "holds Python objects, not only tensors"),
        ("corrupt.pt", "corrupt.pt: is not a readable torch checkpoint"),
    ],
)
def test_bad_policies_get_one_line_and_exit_code_2(tmp_path, policy, message):
    _state_dict_files(tmp_path)
    done = run(*small("--policy", policy), cwd=tmp_path, env=on_path(tmp_path))
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.startswith("hpccollect")]
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_envs_registered_by_a_module(tmp_path):
    (tmp_path / "myenvs.py").write_text(
        "import gymnasium as gym\n"
        "from gymnasium.envs.classic_control.cartpole import CartPoleEnv\n"
        "class Short(CartPoleEnv):\n"
        "    pass\n"
        "gym.register('MyShort-v0', entry_point=Short, max_episode_steps=7)\n"
    )
    env = on_path(tmp_path)
    # gymnasium's own syntax, with worker processes (which must import the module themselves)
    done = run(
        *small("--env", "myenvs:MyShort-v0", "--collector", "multi-sync", "--out", "a.h5"),
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    # --import, with the bare id
    again = run(
        *small("--import", "myenvs", "--env", "MyShort-v0", "--out", "b.h5"), cwd=tmp_path, env=env
    )
    assert again.returncode == 0, again.stderr
    for name in ("a.h5", "b.h5"):
        with open_dataset(tmp_path / name) as ds:
            assert len(ds) == 400 and ds.check() == []
            assert max(ep.shape[0] for ep in ds.episodes()) <= 7  # MyShort's step limit


def test_exact_frames_and_no_raw_warning(tmp_path):
    """3 envs x 2 workers share each batch evenly: exactly the frames asked for. Warnings (here
    gymnasium's, for an old env version, in the main process and in each worker) are one line
    each, like errors."""
    done = run(
        *small("--collector", "multi-sync", "--num-workers", 2, "--num-envs", 3),
        *("--total-frames", 1200, "--frames-per-batch", 600, "--out", "x.h5"),
        *("--env", "CartPole-v0"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "frames collected  1200" in done.stdout
    warned = [line for line in done.stderr.splitlines() if "out of date" in line]
    assert len(warned) >= 1 and all(
        line.startswith("hpccollect: warning: ") and "\x1b" not in line for line in warned
    ), done.stderr
    assert "Warning" not in done.stderr and "warnings.warn" not in done.stderr, done.stderr
    with open_dataset(tmp_path / "x.h5") as ds:
        assert ds.written_steps == 1200 and ds.check() == []


def _arrays(path):
    with open_dataset(path) as ds:
        return {"/".join(key): ds.file[name][...] for name, key in ds.keymap.items()}


@pytest.mark.timeout(400)
@pytest.mark.parametrize("collector", ["single", "multi-sync"])
def test_same_seed_same_dataset(tmp_path, collector):
    """The default MLP policy (weights and sampling) is seeded: same --seed, same data."""
    common = ["--collector", collector, "--num-workers", 2, "--total-frames", 1000]
    common += ["--frames-per-batch", 500, "--quiet"]
    for name, seed in (("a", 11), ("b", 11), ("c", 12)):
        done = run(*common, "--seed", seed, "--out", f"{name}.h5", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    a, b, c = (_arrays(tmp_path / f"{name}.h5") for name in "abc")
    assert a.keys() == b.keys()
    for key in a:
        assert (a[key] == b[key]).all(), key
    assert not (a["action"] == c["action"]).all()  # another seed: other actions


def test_repair_command_and_inspect_of_an_unfinished_file(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpccollect",
            "--collector",
            "multi-sync",
            "--quiet",
            "--total-frames",
            "10000000",
            "--frames-per-batch",
            "500",
            "--out",
            "run.h5",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(proc, committed(tmp_path / "run.h5.partial", 1500), 120, "a few batches")
        os.killpg(proc.pid, signal.SIGKILL)  # a crash: nothing is closed
    finally:
        proc.wait(30)
    partial = tmp_path / "run.h5.partial"
    final_name = run("inspect", "run.h5", cwd=tmp_path)
    assert final_name.returncode == 2
    assert "run.h5.partial does: its run is still writing it, or was killed" in final_name.stderr
    inspect = run("inspect", partial, cwd=tmp_path)
    assert "unfinished" in inspect.stdout, (inspect.stdout, inspect.stderr)
    assert f"python -m hpccollect repair {partial}" in inspect.stdout
    repaired = run("repair", "run.h5.partial", cwd=tmp_path)
    assert repaired.returncode == 0, repaired.stderr
    assert repaired.stdout.startswith("repaired run.h5: ")
    assert not partial.exists()
    again = run("inspect", "run.h5", cwd=tmp_path)
    assert again.returncode == 0 and "integrity         ok" in again.stdout, again.stdout
    missing = run("repair", "nothing.h5", cwd=tmp_path)
    assert missing.returncode == 2 and "nothing.h5 does not exist" in missing.stderr


def test_an_env_failing_in_a_worker_gets_one_line_and_exit_code_2(tmp_path):
    """A worker's EnvError comes back as an EnvError, so the CLI treats it as in one process."""
    (tmp_path / "workerfail.py").write_text(
        "import multiprocessing\n"
        "import gymnasium as gym\n"
        "from gymnasium.envs.classic_control.cartpole import CartPoleEnv\n"
        "class FailsInWorker(CartPoleEnv):\n"
        "    def step(self, action):\n"
        "        if multiprocessing.parent_process() is not None:\n"
        "            raise RuntimeError('the simulator lost its licence')\n"
        "        return super().step(action)\n"
        "gym.register('FailsInWorker-v0', entry_point=FailsInWorker, max_episode_steps=50)\n"
    )
    args = small("--env", "workerfail:FailsInWorker-v0", "--out", "a.h5")
    args[args.index("single")] = "multi-sync"
    done = run(*args, "--num-workers", 1, cwd=tmp_path, env=on_path(tmp_path))
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.startswith("hpccollect:")]
    assert len(lines) == 1 and "the simulator lost its licence" in lines[0], done.stderr
    assert "Worker 0 on " in lines[0] and "Traceback" not in done.stderr, done.stderr


def test_repair_of_a_finished_dataset_says_so_and_changes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["--collector", "single", "--policy", "random", "--total-frames", "200"]
    assert main(["collect", "--quiet", *args, "--frames-per-batch", "100", "--out", "d.h5"]) == 0
    kept = (tmp_path / "d.h5").read_bytes()
    capsys.readouterr()
    assert main(["repair", "d.h5"]) == 0
    said = capsys.readouterr().out.strip()
    assert said.startswith("d.h5 is complete: 200 committed frames, ") and said.endswith(
        " episodes; nothing to repair"
    ), said
    assert (tmp_path / "d.h5").read_bytes() == kept
    # what a writer killed while it made a file left beside it is still repair's to delete
    (tmp_path / "d.h5.partial.new").write_bytes(b"\x89HDF\r\n\x1a\n")
    assert main(["repair", "d.h5"]) == 0
    assert not (tmp_path / "d.h5.partial.new").exists()
