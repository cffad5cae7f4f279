"""DistributedDataCollector over real ranks: local processes in a real gloo group (launcher "mp")."""

from __future__ import annotations

import gc
import io
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from functools import partial

import gymnasium as gym
import pytest
import torch
from conftest import (
    BiasPolicy,
    CounterEnv,
    SlowCounter,
    WideCounter,
    alive,
    assert_each_holds_its_own,
    assert_flips_with,
    assert_none_started_left,
    descriptors,
    listening_addresses,
    started_here,
    until_each_gave,
)
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

from hpccollect import DistributedDataCollector, MultiSyncDataCollector, SyncDataCollector
from hpccollect.collectors.distributed import DistributedWeightUpdater
from hpccollect.collectors.workers.gathering import AsyncGathering, SyncGathering
from hpccollect.collectors.workers.reports import is_report
from hpccollect.errors import (
    ArgumentTypeError,
    ArgumentValueError,
    CollectorTimeoutError,
    EnvError,
    WorkerError,
)
from hpccollect.protocol import Command
from hpccollect.storage import ReplayBuffer

pytestmark = [pytest.mark.slow]

TRAJ = ("collector", "traj_ids")


def bias_policy() -> TensorDictModule:
    return TensorDictModule(BiasPolicy(), ["observation"], ["action"])


class Raising(gym.Wrapper):
    def step(self, action):
        raise KeyError("this env fails on purpose")


def raising_env() -> gym.Env:
    return Raising(CounterEnv(5))


def envs(*lengths: int) -> list:
    """One CounterEnv per rank; rank r's episodes last ``lengths[r-1]`` steps, so a batch's
    rank shows in its largest observation."""
    return [partial(CounterEnv, n) for n in lengths]


def make(fns, policy=None, **kwargs) -> DistributedDataCollector:
    kwargs.setdefault("launcher", "mp")
    kwargs.setdefault("frames_per_batch", 40)
    return DistributedDataCollector(fns, policy, **kwargs)


def rank_pids(collector) -> list[int]:
    return [c.pid for c in collector._pool.channels]


def assert_all_gone(pids: list[int], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if alive(p)], "collector rank processes survived"


def lengths_of(batch) -> int:
    return int(batch["next", "observation"].max())


def until_each_rank_gave(batches, lengths: tuple[int, ...], n: int):
    """``(rank's episode length, batch)`` until the rank of each of ``lengths`` gave ``n``."""
    for (length,), batch in until_each_gave(batches, lambda b: (lengths_of(b),), lengths, n):
        yield length, batch


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "sync, collector_class, k, shape",
    [
        (True, "single", 1, (2, 20)),
        (False, "single", 2, (2, 20)),
        (True, "sync", 2, (2, 2, 10)),
        (False, "async", 2, (40,)),
    ],
)
def test_layout_rows_and_trajectory_ids_across_ranks(sync, collector_class, k, shape):
    collector = make(
        envs(3, 5),
        sync=sync,
        collector_class=collector_class,
        num_workers_per_collector=k,
        total_frames=240,
    )
    assert type(collector) is DistributedDataCollector
    assert type(collector._gathering) is (SyncGathering if sync else AsyncGathering)
    pids = rank_pids(collector)
    ids: dict[int, set] = {3: set(), 5: set()}
    try:
        batches = list(collector)
    finally:
        collector.shutdown()
    assert_all_gone(pids)
    assert len(batches) == 6 and all(b.batch_size == shape for b in batches)
    assert batches[0].names[-1] == "time"
    for batch in batches:
        rows = [batch[0], batch[1]] if sync else [batch]
        for row in rows:
            ids[lengths_of(row)].update(row.get(TRAJ).flatten().tolist())
    assert ids[3] and ids[5], "every rank delivered"  # the rows are each rank's own data
    assert not ids[3] & ids[5], "a trajectory id is used by two ranks"


@pytest.mark.timeout(180)
def test_sync_collects_what_multisync_collects_over_the_same_envs():
    fns = [partial(gym.make, "CartPole-v1")] * 2
    results = []
    for cls, extra in (
        (DistributedDataCollector, dict(sync=True, launcher="mp")),
        (MultiSyncDataCollector, {}),
    ):
        collector = cls(fns, bias_policy(), frames_per_batch=64, total_frames=192, **extra)
        try:
            # one class; the gathering is the strategy object sync chose (no class swap)
            assert type(collector) is cls and isinstance(collector._gathering, SyncGathering)
            collector.set_seed(7)
            results.append([b.clone() for b in collector])
        finally:
            collector.shutdown()
    dist, multi = results
    assert len(dist) == len(multi) == 3
    for a, b in zip(dist, multi, strict=True):
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        assert a.batch_size == b.batch_size and a.names == b.names
        for key in a.keys(True, True):
            assert torch.equal(a[key], b[key]), key


@pytest.mark.timeout(180)
def test_weights_reach_exactly_the_named_ranks_and_every_later_batch():
    policy = bias_policy()
    collector = make(envs(3, 5), policy, sync=True, track_policy_version=True)
    try:
        it = iter(collector)
        first = next(it)
        assert (first["action"][..., 0] == 1).all()  # bias favours action 0
        assert (first["policy_version"] == 0).all() and first["policy_version"].shape == (2, 20)
        with torch.no_grad():
            policy.module.bias.copy_(torch.tensor([0.0, 1.0]))
        collector.update_policy_weights_(worker_ids=[1])
        assert collector.policy_versions == [0, 1]
        for _ in range(2):
            batch = next(it)
            assert (batch[0]["action"][..., 0] == 1).all(), "rank 1 was not named"
            assert (batch[1]["action"][..., 1] == 1).all(), "rank 2 did not load the weights"
            assert batch["policy_version"][:, 0].tolist() == [0, 1]
        collector.update_policy_weights_()  # every rank: one broadcast
        batch = next(it)
        assert (batch["action"][..., 1] == 1).all()
        assert collector.policy_versions == [1, 2]
        assert batch["policy_version"][:, 0].tolist() == [1, 2]
        collector.update_policy_weights_({"module": {"bias": torch.tensor([2.0, 0.0])}})
        assert (next(it)["action"][..., 0] == 1).all()  # weights given explicitly
        # weights of another policy are refused, naming what differs; nothing is sent
        versions = list(collector.policy_versions)
        with pytest.raises(ArgumentValueError, match=r"missing \[\"\('module', 'bias'\)"):
            collector.update_policy_weights_({"foo": torch.zeros(3)})
        with pytest.raises(ArgumentValueError, match=r"shapes \('module', 'bias'\): \(3,\)"):
            collector.update_policy_weights_({"module": {"bias": torch.zeros(3)}})
        assert (next(it)["action"][..., 0] == 1).all()
        assert collector.policy_versions == versions
    finally:
        collector.shutdown()
    with pytest.raises(RuntimeError, match="was shut down: its workers are gone"):
        collector.update_policy_weights_()


@pytest.mark.timeout(120)
def test_a_distributed_weight_updater_sends_its_policy_weights_to_the_ranks():
    """TorchRL's ``DistributedWeightUpdater(store, policy_weights, num_workers, sync)``: what
    ``update_policy_weights_()`` sends is its ``policy_weights``, not the trainer policy's."""
    weights = TensorDict({"module": {"bias": torch.tensor([1.0, 0.0])}}, [])
    updater = DistributedWeightUpdater(None, weights, num_workers=2, sync=True)
    collector = make(envs(3, 5), bias_policy(), sync=True, weight_updater=updater)
    assert collector.remote_weight_updater is updater
    assert_flips_with(collector, weights)
    wrong = DistributedWeightUpdater(None, weights, num_workers=3, sync=True)
    with pytest.raises(ArgumentValueError, match="num_workers=3, but the collector has 2"):
        make(envs(3, 5), bias_policy(), weight_updater=wrong)


@pytest.mark.timeout(180)
def test_update_after_each_batch_updates_the_rank_that_delivered():
    collector = make(
        envs(3, 5), bias_policy(), update_after_each_batch=True, track_policy_version=True
    )
    seen: dict[int, list[int]] = {3: [], 5: []}
    try:
        for i, batch in enumerate(collector):
            seen[lengths_of(batch)].append(int(batch["policy_version"][0]))
            assert sum(collector.policy_versions) == i + 1
            if i == 7:
                break
    finally:
        collector.shutdown()
    for versions in seen.values():  # each rank's batches: 0, 1, 2, ... (one update per batch)
        assert versions == list(range(len(versions)))


@pytest.mark.timeout(180)
def test_max_weight_update_interval_bounds_how_long_a_rank_goes_without_weights():
    collector = make(
        envs(3, 5), bias_policy(), max_weight_update_interval=2, track_policy_version=True
    )
    seen: dict[int, list[int]] = {3: [], 5: []}
    try:
        for length, batch in until_each_rank_gave(collector, (3, 5), 5):
            seen[length].append(int(batch["policy_version"][0]))
    finally:
        collector.shutdown()
    for versions in seen.values():
        assert versions[0] == 0
        runs = [versions.count(v) for v in set(versions)]
        assert max(runs) <= 2, versions
        assert versions == sorted(versions) and len(set(versions)) > 1, versions


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sync", [True, False])
def test_a_policy_with_a_factory_is_where_the_ranks_weights_come_from(sync):
    """TorchRL's distributed collectors take a policy and a ``policy_factory`` together: each
    rank builds its policy with the factory (its first batch takes the factory's weights, here
    action 1), and with ``update_interval=1`` the policy's weights (action 0) reach it after
    each batch, with no call; a change to the policy follows."""

    def factory():
        policy = bias_policy()
        with torch.no_grad():
            policy.module.bias.copy_(torch.tensor([0.0, 5.0]))
        return policy

    policy = bias_policy()
    collector = make(envs(3, 5), policy, policy_factory=factory, update_interval=1, sync=sync)
    try:
        it = iter(collector)
        actions = [next(it)["action"].argmax(-1).unique().tolist() for _ in range(4)]
        with torch.no_grad():
            policy.module.bias.copy_(torch.tensor([0.0, 1.0]))  # no call follows
        # a rank's first batch after the change may have begun before it; its second has not
        batches = (  # synced, each batch holds every rank's rows
            [(0, next(it)) for _ in range(2)] if sync else until_each_rank_gave(it, (3, 5), 2)
        )
        after: dict[int, list] = {}
        for length, batch in batches:
            after.setdefault(length, []).append(batch["action"].argmax(-1).unique().tolist())
    finally:
        collector.shutdown()
    assert actions[0] == [1]  # the factory's own weights
    assert [0] in actions[1:]  # the policy's, with no call
    assert all(mine[-1] == [1] for mine in after.values()), after  # its change


class DeviceRecorder(SyncDataCollector):
    """Writes the device keywords it was built with to the file ``record_to``."""

    def __init__(self, *args, record_to: str, **kwargs):
        keys = ("device", "storing_device", "env_device", "policy_device")
        seen = {k: None if kwargs.get(k) is None else str(kwargs[k]) for k in keys}
        with open(record_to, "w") as f:
            json.dump(seen, f)
        super().__init__(*args, **kwargs)


@pytest.mark.timeout(120)
def test_collector_kwargs_device_keywords_are_each_ranks_own(tmp_path):
    """As TorchRL takes them (its examples pass ``{"device": "cpu", "storing_device":
    "cpu"}``): one dict per rank, whose device keywords that rank's collector is built with;
    a rank's ``device`` fills the others it does not give."""
    own = [
        {"device": "cpu", "storing_device": "cpu", "record_to": str(tmp_path / "1.json")},
        {"env_device": "cpu", "record_to": str(tmp_path / "2.json")},
    ]
    with make(envs(3, 5), collector_class=DeviceRecorder, collector_kwargs=own) as collector:
        assert next(iter(collector)).numel() == 40
    seen = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (1, 2)]
    assert seen[0] == dict.fromkeys(("device", "storing_device"), "cpu") | dict.fromkeys(
        ("env_device", "policy_device")
    )
    assert seen[1] == {
        "device": None, "storing_device": "cpu", "env_device": "cpu", "policy_device": None
    }  # fmt: skip


@pytest.mark.timeout(180)
def test_set_seed_and_state_dict_round_trip():
    fns = [partial(gym.make, "CartPole-v1")] * 2
    collector = make(fns, None, sync=True, frames_per_batch=64)
    try:
        assert collector.set_seed(11) == 12  # one env per rank: seeds 11 and 12
        first = next(iter(collector)).clone()
        assert not torch.equal(first["observation"][0], first["observation"][1])
        collector.set_seed(11)
        again = next(iter(collector))
        assert torch.equal(first["observation"], again["observation"])
        state = collector.state_dict()
        assert {"worker0", "worker1"} <= set(state) and state["frames"] == 128
        collector.load_state_dict({**state, "frames": 64})
        assert collector.state_dict()["frames"] == 64
    finally:
        collector.shutdown()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sync", [True, False])
def test_a_killed_rank_raises_within_seconds_naming_it(sync):
    collector = make(envs(3, 5, 7), sync=sync, frames_per_batch=60)
    pids = rank_pids(collector)
    try:
        it = iter(collector)
        next(it)
        os.kill(pids[1], signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            while time.monotonic() - start < 10:  # batches take milliseconds here
                next(it)
        assert time.monotonic() - start < 10
        with pytest.raises(WorkerError, match="rank 2"):  # and again, at once, never a hang
            collector.state_dict()
    finally:
        collector.shutdown()
    err = info.value
    assert err.rank == 2 and err.worker == 1 and err.host == socket.gethostname()
    assert "rank 2" in str(err) and "SIGKILL" in str(err)
    assert_all_gone(pids)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sync", [True, False])
def test_on_worker_failure_continue_goes_on_without_the_lost_rank(sync):
    collector = make(envs(3, 5, 7), sync=sync, frames_per_batch=60, on_worker_failure="continue")
    pids = rank_pids(collector)
    try:
        it = iter(collector)
        next(it)
        os.kill(pids[1], signal.SIGKILL)
        assert collector._pool.channels[1].life.join(10)
        # batches yielded up to the call that reported the loss, and those asked for after it
        before, after = [], []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            while len(after) < 4:  # batches take milliseconds here
                reported = [w for w in caught if "collector rank 2" in str(w.message)]
                (after if reported else before).append(next(it))
                assert len(before) < 20, "the lost rank was never noticed"
        assert len([w for w in caught if "collector rank 2" in str(w.message)]) == 1  # once
        assert collector.lost_ranks == [2]
    finally:
        collector.shutdown()
    assert_all_gone(pids)
    if sync:
        assert {b.batch_size for b in after} == {(2, 20)}  # one row fewer
        assert {lengths_of(row) for b in after for row in b} == {3, 7}
    else:
        # at most the batch rank 2 had in flight when it died (it may come in the very call
        # that reports the loss), and nothing of it once the loss was reported
        assert [lengths_of(b) for b in before].count(5) <= 1
        assert {lengths_of(b) for b in after} <= {3, 7}


@pytest.mark.timeout(120)
def test_an_env_raising_on_a_rank_comes_back_typed_with_its_traceback():
    collector = make([partial(CounterEnv, 3), raising_env], sync=True)
    try:
        with pytest.raises(EnvError) as info:
            next(iter(collector))
    finally:
        collector.shutdown()
    err = info.value
    assert isinstance(err, WorkerError) and isinstance(err, KeyError)
    assert err.rank == 2 and err.host == socket.gethostname()
    assert "traceback in rank 2 (worker 1) of 2" in str(err)
    assert "this env fails on purpose" in str(err)


class EndsLeavingAChild(gym.Wrapper):
    """At its third step, forks a child that sleeps holding every socket of the process (as a
    simulator server the env started would), writes its pid to ``path``, and ends the
    process with exit code 7."""

    def __init__(self, path: str) -> None:
        super().__init__(CounterEnv(5))
        self.path, self.steps = path, 0

    def step(self, action):
        self.steps += 1
        if self.steps == 3:
            child = os.fork()
            if child == 0:
                time.sleep(60)
                os._exit(0)
            with open(self.path, "w") as f:
                f.write(str(child))
            os._exit(7)
        return self.env.step(action)


@pytest.mark.timeout(120)
def test_a_rank_that_ended_while_a_child_holds_its_connection_is_named(tmp_path):
    """Its connection stays open, so only its process tells rank 0 that it ended: the error
    names the rank and its exit code (it was an AttributeError of hpccollect's own)."""
    path = tmp_path / "child.pid"
    collector = make([partial(CounterEnv, 3), partial(EndsLeavingAChild, str(path))], sync=True)
    pids = rank_pids(collector)
    try:
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            next(iter(collector))
        assert time.monotonic() - start < 10
    finally:
        collector.shutdown(timeout=5)
        if path.exists():
            os.kill(int(path.read_text()), signal.SIGKILL)
    assert info.value.rank == 2 and "exited with code 7" in str(info.value), str(info.value)
    assert_all_gone(pids)


@pytest.mark.timeout(120)
def test_a_silent_rank_raises_a_timeout_saying_how_long():
    collector = make(envs(3, 5), sync=True, worker_timeout=3)
    pids = rank_pids(collector)
    try:
        it = iter(collector)
        next(it)
        os.kill(pids[0], signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(CollectorTimeoutError, match="within 3 s"):
            next(it)
        assert time.monotonic() - start < 10
    finally:
        collector.shutdown(timeout=5)
    assert_all_gone(pids)


def test_bad_arguments_are_refused_before_any_rank_starts():
    before = set(threading.enumerate())
    cases = [
        (
            dict(launcher="submitit", slurm_kwargs={"cluster": "local", "no_such": 1}),
            ArgumentValueError,
            "slurm_kwargs",
        ),
        (dict(launcher="slurm"), ArgumentValueError, "launcher must be one of"),
        (dict(backend="carrier-pigeon"), ArgumentValueError, "backend must be one of"),
        (dict(collector_class="parallel"), ArgumentValueError, "collector_class"),
        (dict(collector_class=dict), ArgumentTypeError, "collector_class"),
        (dict(collector_kwargs={"frames_per_batch": 3}), ArgumentValueError, "frames_per_batch"),
        (dict(collector_kwargs={"no_such": 1}), ArgumentTypeError, "no_such"),
        (dict(collector_kwargs=[{}]), ArgumentTypeError, "one per collector rank"),
        (dict(num_workers_per_collector=0), ArgumentValueError, "num_workers_per_collector"),
        (dict(on_worker_failure="ignore"), ArgumentValueError, "on_worker_failure"),
        (dict(liveness_timeout=0.5), ArgumentValueError, "liveness_timeout must be .* >= 1"),
        (dict(liveness_timeout="30"), ArgumentValueError, "liveness_timeout"),
        (dict(tcp_port=70000), ArgumentValueError, "tcp_port"),
        (dict(sync="yes"), ArgumentTypeError, "sync"),
        (dict(frames_per_batch=0), ArgumentValueError, "frames_per_batch"),
        (dict(backend="mpi"), ArgumentValueError, "launcher='mpi'"),
        (dict(rank_sink="shards/"), ArgumentTypeError, "rank_sink"),
        (dict(rank_reports=True), ArgumentValueError, "without a rank_sink"),
        (dict(rank_reports=1, rank_sink=print), ArgumentTypeError, "rank_reports"),
        (
            dict(rank_reports=True, rank_sink=print, split_trajs=True),
            ArgumentValueError,
            "drop split_trajs",
        ),
        (dict(rank_reports=True, rank_sink=print, postproc=abs), ArgumentValueError, "postproc"),
        (dict(report_interval=-1), ArgumentValueError, "report_interval must be >= 0"),
    ]
    if "nccl" not in torch.distributed.is_nccl_available() * ["nccl"]:
        cases.append((dict(backend="nccl"), ArgumentValueError, "not in this torch build"))
    for kwargs, error, text in cases:
        with pytest.raises(error, match=text):
            make(envs(3, 5), **kwargs)
    assert set(threading.enumerate()) == before


def test_slurm_kwargs_for_a_launcher_without_slurm_warn_at_the_callers_line():
    warned = pytest.warns(UserWarning, match="slurm_kwargs are for the submitit")
    refused = pytest.raises(ArgumentValueError, match="backend='mpi'")  # before any start
    with warned as caught, refused:
        DistributedDataCollector(
            envs(3),
            None,
            frames_per_batch=40,
            slurm_kwargs={"mem_gb": 1},
            backend="mpi",
            launcher="mp",
        )
    assert caught[0].filename == __file__


@pytest.mark.timeout(60)
def test_a_taken_port_is_refused_in_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ArgumentValueError, match="tcp_port") as info:
            make(envs(3), tcp_port=port)
    assert str(port) in str(info.value)


@pytest.mark.timeout(120)
def test_nothing_listens_beyond_loopback_on_one_node():
    with make(envs(3, 5)) as collector:
        next(iter(collector))
        addresses = listening_addresses([os.getpid(), *rank_pids(collector)])
    assert addresses and addresses <= {"127.0.0.1"}, addresses


class CountingSink:
    """What a rank's sink saw, appended to ``folder/rank-R.txt``: frames per batch, then
    ``closed``."""

    def __init__(self, folder: str, rank: int) -> None:
        self.path = os.path.join(folder, f"rank-{rank}.txt")

    def extend(self, batch) -> None:
        with open(self.path, "a") as f:
            f.write(f"{batch.numel()} {int(batch['next', 'observation'].max())}\n")

    def close(self) -> None:
        with open(self.path, "a") as f:
            f.write("closed\n")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sync", [True, False])
def test_rank_sink_sees_every_batch_on_its_own_rank_and_is_closed(tmp_path, sync):
    sink = partial(CountingSink, str(tmp_path))
    with make(envs(3, 5), sync=sync, total_frames=240, rank_sink=sink) as collector:
        frames = sum(batch.numel() for batch in collector)
    assert frames == 240
    seen = 0
    for rank, length in ((1, 3), (2, 5)):
        lines = (tmp_path / f"rank-{rank}.txt").read_text().split("\n")[:-1]
        assert lines[-1] == "closed"
        counts = [tuple(map(int, line.split())) for line in lines[:-1]]
        assert {biggest for _, biggest in counts} == {length}  # batches of this rank's env only
        seen += sum(n for n, _ in counts)
    assert seen == 240  # the ranks wrote exactly what rank 0 yielded


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sync", [True, False])
def test_with_rank_reports_rank_0_gets_reports_and_the_ranks_keep_every_batch(tmp_path, sync):
    sink = partial(CountingSink, str(tmp_path))
    with make(
        envs(3, 5), sync=sync, total_frames=2400, rank_sink=sink, rank_reports=True,
        report_interval=0.05,
    ) as collector:  # fmt: skip
        assert all(is_report(layout) for layout in collector._layouts)  # no batch-sized buffer
        reports = torch.cat([r.reshape(-1) for r in collector])
        # a report is a control message: its bytes come in its frame, no receive is posted
        assert all(c._inline and not c._posted for c in collector._pool.channels)
    assert collector._frames == int(reports["frames"].sum()) == 2400
    for rank, length in ((1, 3), (2, 5)):
        mine = reports[reports["rank"] == rank]
        lines = (tmp_path / f"rank-{rank}.txt").read_text().split("\n")[:-1]
        assert lines[-1] == "closed"
        kept = [int(line.split()[0]) for line in lines[:-1]]
        frames = int(mine["frames"].sum())
        assert frames == sum(kept) and int(mine["batches"].sum()) == len(kept)
        assert len(mine) < len(kept)  # several batches per report
        assert int(mine["episodes"].sum()) == frames // length
        assert float(mine["return_sum"].sum()) == frames // length * length * (length + 1) / 2
        assert int(mine["committed_steps"][-1]) == frames  # the reported totals so far
        returns = mine["recent_returns"]
        assert (returns[~returns.isnan()] == length * (length + 1) / 2).all()


@pytest.mark.timed  # rank 1 must collect its 100 frames within the 1 s report interval
@pytest.mark.timeout(120)
def test_with_rank_reports_a_sync_round_with_nothing_left_for_a_rank_lets_it_rest(tmp_path):
    """200 frames, 20 per rank batch; rank 1 collects all it is asked within the interval,
    rank 2 one batch per report. Rounds: 100 + 20, then 40 + 20, then 20 for rank 1 alone:
    rank 2 is not asked for a batch nobody wants (its shard would keep it), and its report in
    that round says so, with its committed counts."""
    sink = partial(CountingSink, str(tmp_path))
    fns = [partial(CounterEnv, 4), partial(SlowCounter, 4, 0.06)]  # 20 steps outlast 1 s
    with make(
        fns, sync=True, total_frames=200, rank_sink=sink, rank_reports=True, report_interval=1.0
    ) as collector:  # fmt: skip
        rounds = [r.clone() for r in collector]
    assert [r["frames"].tolist() for r in rounds] == [[100, 20], [40, 20], [20, 0]]
    assert rounds[-1]["rank"].tolist() == [1, 2] and rounds[-1]["batches"].tolist() == [1, 0]
    assert rounds[-1]["committed_steps"].tolist() == [200 - 40, 40]
    assert rounds[-1]["recent_returns"][1].isnan().all()
    for rank, frames in ((1, 160), (2, 40)):
        lines = (tmp_path / f"rank-{rank}.txt").read_text().split("\n")[:-1]
        assert lines[-1] == "closed" and sum(int(x.split()[0]) for x in lines[:-1]) == frames


@pytest.mark.timeout(120)
def test_shutdown_leaves_no_process_thread_or_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with make(envs(3, 5), tcp_port=port) as collector:
        pids = rank_pids(collector)
        next(iter(collector))
        # no thread a rank: the links are read by the thread that waits for them, and one
        # thread beats on every link
        names = [t.name for t in threading.enumerate()]
        assert not [n for n in names if n.startswith("hpccollect-rank")], names
        assert names.count("hpccollect-beats") == 1, names
    collector.shutdown()  # idempotent
    assert_all_gone(pids)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("hpccollect-rank")]
    with socket.socket() as again:  # the port is free again
        again.bind(("127.0.0.1", port))
    collector = make(envs(3))  # garbage collection stops the ranks too
    pids = rank_pids(collector)
    del collector
    gc.collect()
    assert_all_gone(pids)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sync", [False, True])
def test_shutdown_lets_each_rank_end_on_its_own_and_no_process_is_left(sync):
    """As a user sees it (TorchRL's own test does the same): a few seconds after
    ``shutdown()`` no process the collector started is there, not even unreaped. The ranks
    end on their own once told to stop, weights broadcast to them or not: a rank whose thread
    waited in the next broadcast could not end its groups, and was killed 10 s into the
    shutdown."""
    before = started_here()
    collector = make(envs(3, 5), bias_policy(), sync=sync, total_frames=400)
    for i, _ in enumerate(collector):
        if i == 0:
            collector.update_policy_weights_()  # a broadcast: each rank waits for the next
    started = time.monotonic()
    collector.shutdown()
    assert time.monotonic() - started < 9  # no rank waited for its kill, 10 s in
    assert_none_started_left(before)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_64_ranks_each_give_their_rows_and_leave_nothing_behind():
    """A trainer over 64 collector ranks, which fork from the job's own server (``launcher="mp"``):
    each batch holds every rank's rows, each rank is connected only to the few ranks it talks
    to, and shutdown ends every rank and the server (reaped, not a zombie) and every thread of
    the ranks' links."""
    collector = make(
        envs(*range(1, 65)), sync=True, frames_per_batch=64 * 64, total_frames=2 * 64 * 64
    )
    server = collector.launcher._server.pid
    pids = rank_pids(collector)
    try:
        batches = []
        for batch in collector:
            batches.append(batch.clone())
            held = max(descriptors("socket", pid) for pid in pids)
    finally:
        collector.shutdown()
    # gloo connects a rank only to the ranks it talks to (rank 0; transport/backends._gloo), on
    # the one group batches and broadcasts share: the store, gloo's listener, rank 0, the
    # control link to rank 0 and the broadcast tree's few (log2 65), where a full mesh is 64
    assert held <= 11, f"a collector rank holds {held} sockets"
    assert len(batches) == 2
    for batch in batches:
        assert batch.shape == (64, 64)
        # rank r's episodes last r steps: each of its rows shows its own length
        assert [int(row.max()) for row in batch["next", "observation"]] == list(range(1, 65))
    assert_all_gone(pids)
    with pytest.raises(ChildProcessError):
        os.waitpid(server, os.WNOHANG)
    assert collector.launcher._server is None
    assert not [t.name for t in threading.enumerate() if t.name.startswith("hpccollect-rank")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("sync", "width"), [(False, 4096), (True, 4096), (False, 4)])
def test_batches_kept_without_a_copy_are_each_their_own(sync, width):
    """A large batch is yielded in the buffer it arrived in, and the next one arrives in
    another; a small one is copied out of it: batches kept without ``clone()`` each still hold
    their own frames, laid out and valued as collected."""
    wide = partial(WideCounter, width=width)
    collector = make(
        [partial(wide, 3), partial(wide, 4)],
        sync=sync,
        frames_per_batch=80 if sync else 40,  # 40 frames of each rank a batch
        total_frames=8 * 80,
    )
    try:
        kept = list(collector)  # no clone: each batch must stay as it came
    finally:
        collector.shutdown()
    if sync:
        assert all(b.shape == (2, 40) for b in kept)
        kept = [row for b in kept for row in b.unbind(0)]
    assert len(kept) == 16
    assert_each_holds_its_own(kept, 40)
    assert len({b["observation"].data_ptr() for b in kept}) == len(kept) or sync
    if width == 4096 and not sync:  # its floats lie in the buffer it came in (a copy: apart)
        assert all(same_storage(b["observation"], b["next", "observation"]) for b in kept)
    torch.save(kept[-1], io.BytesIO())  # one storage per dtype, as a clone has


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@pytest.mark.timeout(120)
def test_replay_buffer_is_extended_here_and_start_fills_it_in_the_background():
    buffer = ReplayBuffer(10_000)
    collector = make(envs(3, 5), replay_buffer=buffer)
    try:
        assert list(itertools.islice(collector, 3)) == [None, None, None]
        assert len(buffer) == 120
        collector.start()
        deadline = time.monotonic() + 30
        while len(buffer) < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        collector.async_shutdown(timeout=30)
    assert len(buffer) >= 200


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["shutdown", "async_shutdown"])
def test_a_shutdown_while_the_background_waits_for_a_long_batch_ends_at_once(how):
    """The background thread waits for a batch that takes 40 s: the shutdown gives that wait
    up (it raised CollectorTimeoutError after its timeout before, and left the thread waiting
    on the closed groups) and ends every rank and thread: the rank, mid-batch, within the
    shutdown's 10 s (5 s with ``shutdown(timeout=5)``)."""
    collector = make([partial(SlowCounter, 5, 1.0)], replay_buffer=ReplayBuffer(1000))
    pids = rank_pids(collector)
    before = {t.ident for t in threading.enumerate()}
    collector.start()
    time.sleep(1.5)  # the background thread now waits in the rank's first batch
    begun = time.monotonic()
    getattr(collector, how)(timeout=5)
    assert time.monotonic() - begun < 15
    assert_all_gone(pids)
    assert not [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]


@pytest.mark.timeout(180)
def test_a_broadcast_while_ranks_collect_reaches_each_ranks_next_batch():
    policy = bias_policy()
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    collector = make(envs(3, 5), policy, frames_per_batch=20, track_policy_version=True)
    try:
        it = iter(collector)
        next(it)
        # a training step on the trainer's policy (its parameters now live in the flat buffer)
        optimizer.zero_grad()
        (policy.module.bias * torch.tensor([1.0, -1.0])).sum().backward()
        optimizer.step()
        assert policy.module.bias[1] > policy.module.bias[0]
        collector.update_policy_weights_()  # one broadcast; the rank not yet yielded collects
        assert collector.policy_versions == [1, 1]
        seen: dict[int, list] = {3: [], 5: []}
        for length, batch in until_each_rank_gave(it, (3, 5), 3):
            new = bool((batch["action"][..., 1] == 1).all())
            assert new == bool((batch["policy_version"] == 1).all())
            seen[length].append(new)
        for news in seen.values():  # at most the batch in flight was collected before it
            assert news and all(news[1:]), seen
    finally:
        collector.shutdown()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["call", "update_interval"])
def test_weights_set_in_the_loop_reach_the_next_batch_of_the_rank_that_delivered(how):
    """As TorchRL's ``DistributedCollector(sync=False)``: the rank whose batch was yielded goes
    on only when the next batch is asked for, so weights the loop body sends (a call, or
    ``update_interval``'s push) reach its very next batch, not the one after."""
    policy = bias_policy()
    kwargs = {"update_interval": 1} if how == "update_interval" else {}
    collector = make(envs(3, 5), policy, frames_per_batch=20, track_policy_version=True, **kwargs)
    try:
        it = iter(collector)
        rank = lengths_of(next(it))
        with torch.no_grad():
            policy.module.bias.copy_(torch.tensor([0.0, 1.0]))
        if how == "call":
            collector.update_policy_weights_()
        batch = next(it)
        while lengths_of(batch) != rank:
            batch = next(it)
        assert (batch["action"][..., 1] == 1).all(), "collected with the weights before the loop's"
        assert (batch["policy_version"] == 1).all()
    finally:
        collector.shutdown()


@pytest.mark.timeout(120)
def test_a_rank_goes_on_at_once_only_where_no_weights_can_reach_it():
    """With weights (a policy with parameters) the rank whose batch was yielded waits for the
    next ``next()``; without (a random policy) it is asked again before the yield, so its next
    batch overlaps the caller's work."""
    for policy, in_flight in ((bias_policy(), 1), (None, 2)):
        collector = make(envs(3, 5), policy, frames_per_batch=20)
        try:
            it = iter(collector)
            next(it)
            assert len(collector._in_flight) == in_flight
        finally:
            collector.shutdown()


@pytest.mark.timeout(180)
def test_weights_still_arrive_after_the_trainer_replaces_a_parameter():
    policy = bias_policy()
    collector = make(envs(3, 5), policy, sync=True)
    try:
        it = iter(collector)
        next(it)
        policy.module.bias = nn.Parameter(torch.tensor([0.0, 1.0]))  # not in the flat buffer
        collector.update_policy_weights_()
        assert (next(it)["action"][..., 1] == 1).all()
    finally:
        collector.shutdown()


@pytest.mark.timeout(180)
def test_broadcasts_in_a_row_leave_the_last_weights_and_replies_in_step():
    policy = bias_policy()
    collector = make(envs(3, 5), policy, sync=True, worker_timeout=30)
    try:
        it = iter(collector)
        next(it)
        for i in range(12):  # faster than the ranks load them: queued updates fold together
            with torch.no_grad():
                policy.module.bias.copy_(torch.tensor([float(i % 2), 1.0 - i % 2]))
            collector.update_policy_weights_()
        collector.update_policy_weights_(worker_ids=[0])  # point to point, acknowledged later
        collector.reset()  # waits for its own acknowledgements: none is mistaken for another
        assert (next(it)["action"][..., 0] == 1).all()  # the last weights: bias [1, 0]
        assert collector.policy_versions == [13, 12]
    finally:
        collector.shutdown()


RANK_0 = """
import sys
sys.path.insert(0, {tests!r})
from functools import partial
from conftest import CounterEnv
from hpccollect import DistributedDataCollector


def two_ranks():
    # a gloo collector over two CounterEnv ranks, its ranks' pids printed first
    c = DistributedDataCollector([partial(CounterEnv, 3)] * 2, None, frames_per_batch=20,
                                 launcher="mp")
    print(*[ch.pid for ch in c._pool.channels], flush=True)
    return c
"""

CTRL_C = """
if __name__ == "__main__":
    for batch in two_ranks():
        pass
"""


def run_rank_0(tmp_path, text: str, *args: str, ctrl_c_after: float | None = None):
    """Run ``text`` after ``RANK_0`` (its ``{tests}`` filled in) as a rank 0 script in a
    session of its own; it prints its ranks' pids first (``two_ranks()``). ``ctrl_c_after``:
    SIGINT to the whole session that many seconds later, as Ctrl-C in a terminal does. Returns
    the exit code, the standard error and the ranks' pids; a session still running after 60 s
    is killed."""
    script = tmp_path / "rank_0.py"
    script.write_text((RANK_0 + text).format(tests=os.path.dirname(os.path.dirname(__file__))))
    job = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        pids = [int(p) for p in job.stdout.readline().split()]
        if ctrl_c_after is not None:
            time.sleep(ctrl_c_after)
            os.killpg(job.pid, signal.SIGINT)
        _, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    return job.returncode, err, pids


@pytest.mark.timeout(120)
def test_ctrl_c_to_the_whole_job_stops_every_rank(tmp_path):
    _, err, pids = run_rank_0(tmp_path, CTRL_C, ctrl_c_after=1.0)  # collecting by then
    assert "KeyboardInterrupt" in err
    assert len(pids) == 2
    assert_all_gone(pids)


RANK_0_DIES = """
import os, signal

if __name__ == "__main__":
    next(iter(two_ranks()))
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.timeout(120)
def test_collector_ranks_end_when_rank_0_is_killed(tmp_path):
    returncode, err, pids = run_rank_0(tmp_path, RANK_0_DIES)
    assert returncode == -signal.SIGKILL, err
    assert len(pids) == 2
    assert_all_gone(pids)


LOST_RECEIVE = """
def lose_the_receives(c):
    held = list(c._pool.channels[0]._posted)  # kept by this frame in the traceback of "raise"
    for channel in c._pool.channels:  # what a Ctrl-C between a receive's post and its store did
        channel._posted.clear()
    if sys.argv[1] == "raise":
        raise RuntimeError("the script fails")


if __name__ == "__main__":
    c = two_ranks()
    next(iter(c))
    lose_the_receives(c)
    c.shutdown(timeout=2)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("ending", "code"), [("shutdown", 0), ("raise", 1)])
def test_a_posted_receive_dropped_unwaited_hangs_neither_shutdown_nor_exit(tmp_path, ending, code):
    """A Ctrl-C can come between the post of a link's next receive and the line that keeps
    it: the receive is dropped unwaited, and its message, when it comes, holds gloo's loop
    for good. Releasing the group, or the last work that holds its context, then never
    returned: the process hung at its shutdown, or at its exit where the traceback Python
    keeps until its teardown held a posted receive in a frame (seen as a hang of the Ctrl-C
    test above, 1 run in 8 to 22 on a loaded machine)."""
    returncode, err, pids = run_rank_0(tmp_path, LOST_RECEIVE, ending)
    assert returncode == code, err
    assert len(pids) == 2
    assert_all_gone(pids)


CTRL_C_AT_THE_POST = """
import threading
from hpccollect.transport.rank_channel import BATCH, RankChannel

read = RankChannel._read
interrupted = []


def interrupt(frame, event, arg):
    # Python raises a Ctrl-C's KeyboardInterrupt where a C call returns to Python code: here,
    # at the first such return in the receive of a batch announced on a link
    if event == "c_return" and arg is not sys.setprofile:
        sys.setprofile(None)
        interrupted.append(True)
        raise KeyboardInterrupt


def read_frame(channel, frame):
    if interrupted or frame.kind != BATCH:
        return read(channel, frame)
    sys.setprofile(interrupt)
    try:
        return read(channel, frame)
    finally:
        sys.setprofile(None)


if __name__ == "__main__":
    c = two_ranks()
    batches = iter(c)
    next(batches)
    RankChannel._read = read_frame
    try:
        for _ in range(100):  # until a link receives a batch on this thread
            next(batches)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    c.shutdown(timeout=2)
    hung = [t.name for t in threading.enumerate() if t.name == "hpccollect-drop"]
    print("releases that never ended:", hung, file=sys.stderr)
"""


@pytest.mark.timeout(120)
def test_a_ctrl_c_right_after_a_receive_is_posted_loses_no_receive(tmp_path):
    """The Ctrl-C of the test above, where it came: at the first C call's return to Python
    in the receive of a batch its link announced. The groups are released at once all the
    same, and nothing is left running."""
    returncode, err, pids = run_rank_0(tmp_path, CTRL_C_AT_THE_POST)
    assert returncode == 0, err
    assert "interrupted" in err
    assert "releases that never ended: []" in err, err
    assert_all_gone(pids)


@pytest.mark.timeout(180)
def test_replies_between_batches_never_touch_a_batch_not_yet_read():
    collector = make(envs(3, 5), None, frames_per_batch=30)
    try:
        for i, batch in enumerate(collector):
            # a reply from the rank whose batch waits in the inbox must not land in its buffer
            collector.state_dict()
            ids = batch.get(TRAJ)
            assert (ids % 2 == (0 if lengths_of(batch) == 3 else 1)).all(), ids
            assert torch.equal(batch["next", "reward"], batch["next", "observation"])
            if i == 11:
                break
    finally:
        collector.shutdown()


@pytest.mark.timeout(120)
def test_a_reply_after_a_batch_leaves_that_batch_intact():
    collector = make(envs(3), None, frames_per_batch=20)  # a batch smaller than a reply
    pool = collector._pool
    try:
        assert pool.request(0, Command.COLLECT, 1, 60) == 20
        before = collector._layouts[0].clone()
        state = pool.request(0, Command.STATE_DICT, None, 60)
        assert state["frames"] == 20
        assert (collector._layouts[0] == before).all()
    finally:
        collector.shutdown()
