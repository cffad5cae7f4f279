"""The worker loop over a channel, any collector class in it, and a worker's exceptions raised in
the collector with their own type, the worker's host and its traceback (issue 8, part 1)."""

from __future__ import annotations

import os
import socket
import time

import pytest
from conftest import CounterEnv, alive

from hpccollect import MultiSyncDataCollector
from hpccollect.collectors.workers.pool import WorkerPool, remote_exception
from hpccollect.collectors.workers.processes import start_local_workers
from hpccollect.collectors.workers.worker import WorkerSpec, worker_main
from hpccollect.errors import (
    ArgumentTypeError,
    ArgumentValueError,
    EnvError,
    PolicyError,
    WorkerError,
    with_builtin,
)
from hpccollect.protocol import Command, RemoteError, Reply, Seed, message

TRAJ = ("collector", "traj_ids")


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(p) for p in f.read().split()]
    return out


def raised(exc: BaseException) -> RemoteError:
    """``exc`` described as a worker describes what it raised."""
    try:
        raise exc
    except BaseException as err:
        return RemoteError.from_exception(err)


# ---------------------------------------------------------------------- protocol and errors
def test_every_payload_is_checked_and_filling_is_local_only():
    assert message(Command.SEED, Seed(1, False)) == (Command.SEED, Seed(1, False))
    with pytest.raises(ArgumentTypeError, match="SEED carries a Seed, got tuple"):
        message(Command.SEED, (1, False))
    with pytest.raises(ArgumentTypeError, match="BATCH carries a int, got bool"):
        message(Reply.BATCH, True)
    assert {c for c in Command if c.local_only} == {Command.FILL_BUFFER, Command.STOP_FILLING}
    assert all(c.reply in Reply for c in Command if c is not Command.SHUTDOWN)


@pytest.mark.parametrize(
    ("exc", "types"),
    [
        (ValueError("bad value"), (ValueError,)),
        (KeyError("key"), (KeyError, LookupError)),
        (EnvError("env broke", env_name="Counter", step=7), (EnvError, RuntimeError)),
        (with_builtin(PolicyError, ValueError)("policy broke"), (PolicyError, ValueError)),
        (OSError(28, "no space"), (OSError,)),
    ],
    ids=["ValueError", "KeyError", "EnvError", "PolicyValueError", "OSError"],
)
def test_a_remote_exception_keeps_its_type(exc, types):
    err = remote_exception(raised(exc), 1, 3)
    assert isinstance(err, WorkerError) and isinstance(err, types), type(err).__mro__
    assert err.worker == 1 and err.num_workers == 3 and err.host == socket.gethostname()
    assert "Traceback" in err.remote_traceback and "in raised" in err.remote_traceback
    assert str(err).startswith(f"Worker 1 on {err.host}: {type(exc).__name__}: ")
    assert f"traceback in worker 1 of 3 on {err.host}" in str(err)
    if isinstance(exc, EnvError):
        assert (err.env_name, err.step) == ("Counter", 7)


def test_a_foreign_exception_comes_back_as_a_worker_error():
    class Custom(Exception):
        pass

    err = remote_exception(raised(Custom("odd")), 0, 1)
    assert type(err) is WorkerError and "Custom: odd" in str(err)


# ---------------------------------------------------------------------- real worker processes
class OtherHostEnv(CounterEnv):
    """Raises ``ValueError`` on its 4th step, in a process that calls its host "worker-host"."""

    def __init__(self) -> None:
        super().__init__(length=100)
        socket.gethostname = lambda: "worker-host"

    def step(self, action):
        if self.total >= 3:
            raise ValueError("bad action on purpose")
        return super().step(action)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_value_error_is_a_value_error_with_the_workers_host_and_traceback():
    collector = MultiSyncDataCollector([CounterEnv, OtherHostEnv], None, frames_per_batch=20)
    try:
        with pytest.raises(ValueError, match="bad action on purpose") as info:
            next(iter(collector))
    finally:
        collector.shutdown()
    err = info.value
    assert isinstance(err, WorkerError) and isinstance(err, EnvError)  # the env step's wrapper
    assert err.worker == 1 and err.host == "worker-host" and err.num_workers == 2
    assert "in step" in err.remote_traceback and "worker 1 of 2 on worker-host" in str(err)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_env_error_in_a_worker_is_an_env_error():
    def missing_map():
        raise FileNotFoundError("maps/level1.txt")

    with pytest.raises(EnvError, match="Worker 0 .*maps/level1.txt") as info:
        MultiSyncDataCollector([missing_map], None, frames_per_batch=10)
    assert isinstance(info.value, WorkerError) and isinstance(info.value, FileNotFoundError)
    assert "missing_map" in info.value.remote_traceback
    # a bad env id is the caller's mistake there as here
    with pytest.raises(ArgumentValueError, match="Worker 0 .*NoSuchEnv"):
        MultiSyncDataCollector(["NoSuchEnv-v0"], None, frames_per_batch=10)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_worker_runs_a_multisync_collector_with_two_workers_of_its_own():
    """What a collector rank runs with ``collector_class=MultiSyncDataCollector``."""
    spec = WorkerSpec(
        [lambda: CounterEnv(4)] * 2,
        None,
        dict(frames_per_batch=16, traj_id_offset=1, traj_id_stride=2, num_threads=1),
        collector_class=MultiSyncDataCollector,
    )
    (channel,) = start_local_workers(worker_main, [(spec.dumps(), None)], daemon=False)
    pool = WorkerPool([channel])
    try:
        layout = pool.recv(0, Reply.LAYOUT, 120)
        assert layout.pid == channel.pid and layout.host == socket.gethostname()
        inner = children(channel.pid)
        assert len([p for p in inner if alive(p)]) >= 2  # its own workers (and a tracker)
        batch = layout.batch
        assert batch.batch_size == (2, 8) and batch.names == [None, "time"]
        assert pool.request(0, Command.COLLECT, 1, 60) == 16
        first = batch.clone()
        assert (first["next", "reward"].squeeze(-1) == first["next", "observation"][..., 0]).all()
        ids = first.get(TRAJ)
        assert (ids % 2 == 1).all()  # offset 1, stride 2: the outer collector's share
        assert not set(ids[0].tolist()) & set(ids[1].tolist())  # its two workers differ
        assert pool.request(0, Command.COLLECT, 1, 60) == 16
        assert not (batch.get(TRAJ) == ids).all()  # the buffers hold the new batch
        assert pool.request(0, Command.SEED, Seed(5, False), 60) == 6
        state = pool.request(0, Command.STATE_DICT, None, 60)
        assert state["frames"] == 32 and {"worker0", "worker1"} <= set(state)
        pool.request(0, Command.LOAD_STATE_DICT, state, 60)
    finally:
        start = time.monotonic()
        pool.shutdown(timeout=30)
    assert time.monotonic() - start < 30
    deadline = time.monotonic() + 10
    while any(alive(p) for p in [channel.pid, *inner]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in [channel.pid, *inner] if alive(p)], "worker processes survived"
