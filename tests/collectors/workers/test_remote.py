"""Reaching into collectors and their workers (TorchRL's get_distant_attr, map_fn, per-worker
stats, hook setters, fake_tensordict, profiling, pause): real worker processes, real envs."""

from __future__ import annotations

import json
import os
import time

import gymnasium as gym
import pytest
import torch
from torch import nn

from hpccollect import (
    MultiaSyncDataCollector,
    MultiSyncDataCollector,
    ReplayBuffer,
    SyncDataCollector,
    aSyncDataCollector,
)
from hpccollect.collectors.profiling import ProfileConfig
from hpccollect.collectors.workers.remote import resolve_attr
from hpccollect.errors import ArgumentValueError, WorkerError

pytestmark = [pytest.mark.timeout(120)]
MULTI = [MultiSyncDataCollector, MultiaSyncDataCollector]


def cartpole():
    return gym.make("CartPole-v1")


class _Holder:
    def __init__(self) -> None:
        self.table = {"a": [10, {"b": 7}]}


def test_attribute_paths_read_attributes_and_items():
    holder = _Holder()
    assert resolve_attr(holder, "table['a'][1]['b']") == 7
    assert resolve_attr(holder, "table.__len__")() == 1
    for bad in ("", ".table", "table[b]", "table['a'"):
        with pytest.raises(ArgumentValueError, match="attribute path|empty"):
            resolve_attr(holder, bad)


def test_local_get_distant_attr_and_map_fn():
    c = SyncDataCollector(cartpole, None, frames_per_batch=16, total_frames=16, worker_idx=5)
    try:
        assert c.get_distant_attr("worker_idx") == 5
        assert c.map_fn(
            "get_distant_attr", list_of_args=[("worker_idx",), ("frames_per_batch",)]
        ) == [5, 16]
        with pytest.raises(ArgumentValueError, match="same length"):
            c.map_fn("get_distant_attr", list_of_args=[("x",)], list_of_kwargs=[{}, {}])
    finally:
        c.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("cls", MULTI)
def test_multi_calls_reach_each_worker_and_a_failed_call_keeps_it(cls):
    c = cls([cartpole] * 2, None, frames_per_batch=16, total_frames=64)
    try:
        assert c.get_distant_attr("worker_idx") == [0, 1]
        assert c.map_fn("get_distant_attr", list_of_args=[("worker_idx",)] * 2) == [0, 1]
        with pytest.raises(ArgumentValueError, match="Expected 2 argument entries"):
            c.map_fn("get_distant_attr", list_of_args=[("worker_idx",)])
        with pytest.raises(AttributeError) as info:
            c.get_distant_attr("no_such_thing")
        assert isinstance(info.value, WorkerError) and info.value.worker == 0
        # the workers are still there, mid-iteration too
        it = iter(c)
        next(it)
        per_worker = 16 if cls is MultiaSyncDataCollector else 8
        assert c.get_distant_attr("frames_per_batch") == [per_worker] * 2
        assert sum(b.numel() for b in it) == 48
    finally:
        c.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("cls", MULTI)
def test_multi_stats_per_worker(cls):
    c = cls([cartpole] * 2, None, frames_per_batch=16, total_frames=32)
    try:
        with pytest.raises(ArgumentValueError, match="workers must be one of"):
            c.stats(workers="bogus")
        next(iter(c))
        stats = c.stats()
        assert stats["workers"] == 2 and stats["workers_alive"] == 2 and stats["frames"] >= 16
        both = c.stats(workers="both")
        assert {"frames", "worker_0/frames", "worker_1/frames"} <= set(both)
        per_worker = c.stats(workers="per_worker")
        assert "frames" not in per_worker and per_worker["worker_0/frames"] > 0
    finally:
        c.shutdown()


@pytest.mark.slow
def test_hooks_set_on_a_multi_collector_run_in_its_workers(tmp_path):
    c = MultiSyncDataCollector([cartpole] * 2, None, frames_per_batch=16, total_frames=64)
    out = str(tmp_path)

    def pre_hook():
        open(os.path.join(out, f"pre-{os.getpid()}"), "a").close()

    def post_hook(batch):
        open(os.path.join(out, f"post-{os.getpid()}-{batch.numel()}"), "a").close()

    try:
        assert c.pre_collect_hook is None
        c.pre_collect_hook, c.post_collect_hook = pre_hook, post_hook
        assert c.pre_collect_hook is pre_hook
        list(c)
    finally:
        c.shutdown()
    names = os.listdir(out)
    pids = {int(n.split("-")[1]) for n in names}
    assert len(pids) == 2 and os.getpid() not in pids
    assert {n.split("-")[0] for n in names} == {"pre", "post"}
    assert {n.split("-")[2] for n in names if n.startswith("post")} == {"8"}


def test_fake_tensordict_is_a_zeroed_batch_laid_out_as_the_real_ones():
    c = SyncDataCollector(
        [cartpole, cartpole], nn.Linear(4, 2), frames_per_batch=20, total_frames=20
    )
    try:
        fake = c.fake_tensordict()
        real = next(iter(c))
        assert fake.batch_size == real.batch_size and fake.names == real.names
        assert sorted(map(str, fake.keys(True, True))) == sorted(map(str, real.keys(True, True)))
        for key, value in fake.items(True, True):
            assert value.dtype == real[key].dtype, key
            assert not value.any(), f"{key} is not zeroed"
    finally:
        c.shutdown()
    multi = MultiSyncDataCollector([cartpole] * 2, None, frames_per_batch=20, total_frames=20)
    try:
        with pytest.raises(NotImplementedError, match="fake_tensordict"):
            multi.fake_tensordict()
    finally:
        multi.shutdown()


def test_profile_config_is_checked():
    with pytest.raises(ArgumentValueError, match="num_rollouts.*must be greater"):
        ProfileConfig(num_rollouts=2, warmup_rollouts=2)
    with pytest.raises(ArgumentValueError, match="warmup_rollouts must be >= 0"):
        ProfileConfig(num_rollouts=5, warmup_rollouts=-1)
    with pytest.raises(ArgumentValueError, match="activities"):
        ProfileConfig(activities=["gpu"])
    assert ProfileConfig(save_path="t/{worker_idx}.json").get_save_path(2).as_posix() == "t/2.json"


def _trace_events(path) -> list:
    with open(path) as f:
        return json.load(f)["traceEvents"]


def test_profiling_a_sync_collector_writes_a_trace_and_restores_the_hook(tmp_path):
    seen = []
    c = SyncDataCollector(
        cartpole, None, frames_per_batch=8, total_frames=48, post_collect_hook=seen.append
    )
    try:
        c.enable_profile(
            num_rollouts=3, warmup_rollouts=1, save_path=str(tmp_path / "t{worker_idx}.json")
        )
        assert c.profile_config.num_rollouts == 3 and c.post_collect_hook is not seen.append
        list(c)
        assert _trace_events(tmp_path / "t0.json")
        assert len(seen) == 6  # the user's hook still ran after each batch
        c.disable_profile()
        assert c.profile_config is None and c.post_collect_hook == seen.append
        with pytest.raises(RuntimeError, match="after iteration"):
            c.enable_profile()
    finally:
        c.shutdown()


@pytest.mark.slow
def test_profiling_named_workers_each_write_their_trace(tmp_path):
    c = MultiSyncDataCollector([cartpole] * 3, None, frames_per_batch=12, total_frames=72)
    try:
        with pytest.raises(ArgumentValueError, match="workers \\[5\\]"):
            c.enable_profile(workers=[5])
        c.enable_profile(
            workers=[0, 2], num_rollouts=3, save_path=str(tmp_path / "t{worker_idx}.json")
        )
        list(c)
    finally:
        c.shutdown()
    assert sorted(os.listdir(tmp_path)) == ["t0.json", "t2.json"]
    assert _trace_events(tmp_path / "t2.json")


def _wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("cls", [SyncDataCollector, aSyncDataCollector, MultiSyncDataCollector])
def test_pause_stops_writing_and_calls_reach_workers_meanwhile(cls):
    rb = ReplayBuffer(100_000)
    fns = cartpole if cls is not MultiSyncDataCollector else [cartpole] * 2
    c = cls(fns, None, frames_per_batch=16, replay_buffer=rb)
    try:
        c.start()
        _wait_for(lambda: len(rb) >= 32)
        with c.pause():
            written = rb.write_count
            time.sleep(0.3)
            assert rb.write_count == written
            if cls is MultiSyncDataCollector:
                assert c.map_fn("replay_buffer.__len__") == [len(rb)] * 2
        _wait_for(lambda: rb.write_count > written)
    finally:
        c.async_shutdown(timeout=30)


class _Bias(nn.Module):
    """Action = one-hot of the bias (0 or 1) whatever the observation."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        index = self.bias.round().long().expand(observation.shape[:-1])
        return nn.functional.one_hot(index, 2)


@pytest.mark.slow
@pytest.mark.parametrize("cls", MULTI)
def test_weights_reach_workers_while_they_fill_the_buffer(cls):
    rb = ReplayBuffer(1_000)
    policy = _Bias()
    c = cls([cartpole] * 2, policy, frames_per_batch=16, replay_buffer=rb)
    try:
        c.start()
        _wait_for(lambda: len(rb) >= 64)
        assert (rb[len(rb) - 16 :]["action"][..., 0] == 1).all()
        with torch.no_grad():
            policy.bias.fill_(1.0)
        c.update_policy_weights_(policy)  # returns once both workers have the weights
        after = rb.write_count
        _wait_for(lambda: rb.write_count >= after + 64)
        latest = torch.tensor([(rb.write_count - k) % 1000 for k in range(1, 33)])
        assert (rb[latest]["action"][..., 1] == 1).all()
    finally:
        c.async_shutdown(timeout=30)
