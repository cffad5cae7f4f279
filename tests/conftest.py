"""Small deterministic gymnasium envs used across the tests, registered under ``hpccollect-test/``."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict
from torch import nn

# test modules take ``alive`` from here, beside this module's own /proc helpers
from hpccollect._launchers import alive, descendants, process  # noqa: F401

# The SLURM clusters are session fixtures shared by every module that takes them (a module that
# imported them would get a cluster of its own); they live in tests/slurm/slurm_cluster.py,
# since a conftest.py there would shadow this one, which test modules import as ``conftest``.
sys.path.insert(0, str(Path(__file__).parent / "slurm"))
pytest_plugins = ["scheduling", "slurm_cluster", "leftovers"]


def pytest_configure(config: pytest.Config) -> None:
    """A shell that starts pytest in the background (``cmd &`` without job control) makes it
    ignore SIGINT, and every script a test starts would inherit that: their Ctrl-C tests would
    then wait forever. Give the test processes the SIGINT a terminal has."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class CounterEnv(gym.Env):
    """Observation is ``[episode_step]``; the episode terminates after ``length`` steps.

    ``reward`` equals the new step index, so every transition can be checked exactly.
    ``fail_at`` makes ``step`` raise at that global step.
    """

    metadata = {"render_modes": []}

    def __init__(self, length: int = 5, fail_at: int | None = None) -> None:
        self.observation_space = spaces.Box(-1e6, 1e6, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.length, self.fail_at = length, fail_at
        self.t = 0
        self.total = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.total += 1
        if self.fail_at is not None and self.total >= self.fail_at:
            raise RuntimeError("CounterEnv failed on purpose")
        self.t += 1
        obs = np.array([float(self.t)], np.float32)
        return obs, float(self.t), self.t >= self.length, False, {}


class WideCounter(CounterEnv):
    """``width`` floats an observation, each the env's step count since it was made; the reward
    is the episode length, which tells the ranks' frames apart. A batch of 24 frames is 786 KB
    at the default width, large enough to keep the buffer it arrived in; at a width of 4 it is
    2 KB, and rank 0 copies it out (``rank_batches``)."""

    def __init__(self, length: int = 5, width: int = 4096) -> None:
        super().__init__(length)
        self.width = width
        self.observation_space = spaces.Box(-1e9, 1e9, (width,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.full(self.width, self.total, np.float32), {}

    def step(self, action):
        _, _, done, _, info = super().step(action)
        obs = np.full(self.width, self.total, np.float32)
        return obs, float(self.length), done, False, info


class SlowCounter(CounterEnv):
    """A ``CounterEnv`` whose every step takes ``delay`` seconds: a batch that takes long."""

    def __init__(self, length: int = 5, delay: float = 1.0) -> None:
        super().__init__(length)
        self.delay = delay

    def step(self, action):
        time.sleep(self.delay)
        return super().step(action)


def assert_each_holds_its_own(batches: list, frames: int) -> None:
    """``batches`` of ``WideCounter`` ranks, kept as yielded (no ``clone()``), each still hold
    their own ``frames`` frames, laid out and valued as collected: each rank's batches start
    at its steps 0, ``frames``, ``2 * frames``..."""
    starts: dict[float, list[float]] = {}
    for batch in batches:
        obs, nxt = batch["observation"], batch["next", "observation"]
        assert obs.shape[0] == frames and (obs == obs[:, :1]).all()
        assert (nxt == obs + 1).all() and (obs[1:, 0] - obs[:-1, 0] == 1).all()
        length = float(batch["next", "reward"][0])
        assert (batch["next", "reward"] == length).all()
        starts.setdefault(length, []).append(float(obs[0, 0]))
    assert len(starts) > 1
    for mine in starts.values():
        assert sorted(mine) == [float(frames * k) for k in range(len(mine))]


class DictObsEnv(gym.Env):
    """A Dict observation (with a nested Dict) and a continuous action; random episode ends."""

    def __init__(self) -> None:
        self.observation_space = spaces.Dict(
            {
                "position": spaces.Box(-10, 10, (2,), np.float32),
                "velocity": spaces.Box(-1, 1, (1,), np.float32),
                "sensors": spaces.Dict({"lidar": spaces.Box(0, 1, (3,), np.float32)}),
            }
        )
        self.action_space = spaces.Box(-1, 1, (2,), np.float32)
        self.t = 0

    def _obs(self):
        return {
            "position": self.np_random.uniform(-1, 1, 2).astype(np.float32),
            "velocity": np.array([self.t / 100], np.float32),
            "sensors": {"lidar": self.np_random.uniform(0, 1, 3).astype(np.float32)},
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.t += 1
        done = bool(self.np_random.uniform() < 0.1)
        return self._obs(), float(np.sum(action)), done, self.t >= 30, {}


def descriptors(kind: str, pid: int | str = "self") -> int:
    """How many descriptors of ``kind`` ("socket", "pipe") process ``pid`` holds, from /proc."""
    held = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            held += os.readlink(f"/proc/{pid}/fd/{fd}").startswith(f"{kind}:")
    return held


def native_threads(name: str, settle: int | None = None) -> int:
    """How many threads of this process (torch's native ones too) are called ``name``: once
    there are ``settle`` of them, or after 5 s (a native thread names itself as it starts)."""
    deadline = time.monotonic() + 5
    while True:
        tasks = Path(f"/proc/{os.getpid()}/task").iterdir()
        count = sum((task / "comm").read_text().strip() == name for task in tasks)
        if settle is None or count == settle or time.monotonic() > deadline:
            return count
        time.sleep(0.02)


def parent(pid: int) -> int | None:
    """Process ``pid``'s parent, from /proc (None once it is gone)."""
    found = process(pid)
    return None if found is None else found.parent


def cmdline(pid: int) -> bytes:
    """Process ``pid``'s command line, NUL-separated (empty once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


gym.register("hpccollect-test/Counter-v0", entry_point=CounterEnv)
gym.register("hpccollect-test/DictObs-v0", entry_point=DictObsEnv)


@pytest.fixture(autouse=True)
def _no_thread_leak():
    """Every test must end with no thread of its own still running."""
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    for t in leaked:
        t.join(5)
    leaked = [t.name for t in leaked if t.is_alive()]
    assert not leaked, f"threads left running: {leaked}"


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def listening_addresses(pids: list[int], besides: int | None = None) -> set[str]:
    """The local addresses processes ``pids`` listen on for TCP (from /proc), leaving out the
    sockets they share with process ``besides`` (inherited from a launcher)."""
    inodes = set().union(*(_socket_inodes(pid) for pid in pids))
    if besides is not None:
        inodes -= _socket_inodes(besides)
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                    addr = fields[1].split(":")[0]
                    raw = bytes.fromhex(addr)
                    if len(raw) == 4:
                        found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
                    else:
                        words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                        found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


def mpich_segments() -> set[str]:
    """The shared-memory segments MPICH's ranks have in /dev/shm."""
    return {p.name for p in Path("/dev/shm").glob("mpich_shm_*")}


def mapped_mpich_segments() -> set[str]:
    """Those of MPICH's segments that a running process maps (its job still runs)."""
    found: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        with contextlib.suppress(OSError), maps.open("rb") as f:
            for line in f:
                if b"/dev/shm/mpich_shm_" in line:
                    found.add(line.split()[-1].decode(errors="replace").rsplit("/", 1)[-1])
    return found


@pytest.fixture
def no_mpich_segments_left():
    """The test's MPI jobs, ended by their shutdown or by an abort, leave none of MPICH's
    shared-memory segments behind (MPICH unlinks them only in MPI_Finalize)."""
    before = mpich_segments()
    yield
    # a job of a test running beside this one (pytest -n) has its segment until its ranks are
    # up (hpccollect unlinks it then): wait those out. One still mapped after that belongs to a
    # job that still runs (a slow start under load; this test's jobs have ended); one that no
    # process maps was left behind.
    deadline = time.monotonic() + 20.0
    while (left := mpich_segments() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    left -= mapped_mpich_segments()
    assert not left, f"an mpiexec job left a shared-memory segment: {sorted(left)}"


def started_here() -> set[int]:
    """Every process below this one but Python's resource tracker, which lives as long as this
    process does."""
    return {pid for pid in descendants(os.getpid()) if b"resource_tracker" not in cmdline(pid)}


def assert_none_started_left(before: set[int], timeout: float = 5.0) -> None:
    """A few seconds on (``timeout``), no process is below this one that was not in ``before``
    (``started_here``), not even unreaped: what a user sees after a ``shutdown()``."""
    deadline = time.monotonic() + timeout
    while started_here() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not started_here() - before


class BiasPolicy(nn.Module):
    """Takes the action with the larger bias: what the weights say is visible in every action."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.tensor([1.0, 0.0]))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        scores = self.bias + 0 * observation[..., :1]
        return nn.functional.one_hot(scores.argmax(-1), 2)


def until_each_gave(batches, sources, keys: tuple, n: int, cap: int = 200):
    """``(sources, batch)`` from an async collector's ``batches`` until each of ``keys`` has
    delivered ``n`` batches (``sources(batch)``: the keys a batch came from). Workers and ranks
    deliver as they are ready, and on a busy machine one may deliver many in a row, so a test
    that needs something of each takes batches until each gave it (at most ``cap``)."""
    counts = dict.fromkeys(keys, 0)
    for _, batch in zip(range(cap), batches, strict=False):
        came = sources(batch)
        for key in came:
            counts[key] += 1
        yield came, batch
        if min(counts.values()) >= n:
            return
    raise AssertionError(f"{cap} batches and not {n} from each of {list(keys)}: {counts}")


def assert_flips_with(collector: object, weights: TensorDict) -> None:
    """``collector`` (over ``BiasPolicy`` ranks, whose updater sends ``weights``) acts on
    ``weights``: action 0 first, action 1 once the bias in ``weights`` is flipped and sent."""
    try:
        it = iter(collector)
        assert (next(it)["action"][..., 0] == 1).all()
        weights["module", "bias"] = torch.tensor([0.0, 1.0])
        collector.update_policy_weights_()
        assert (next(it)["action"][..., 1] == 1).all()
    finally:
        collector.shutdown()
