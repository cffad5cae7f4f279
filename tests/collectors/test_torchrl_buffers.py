"""A TorchRL replay buffer filled by hpccollect's workers after ``start()``, as torchrl's own
collectors fill it: real worker processes writing into torchrl's shared storage.

These run in the second test environment (torchrl 0.14.1); without torchrl they skip, unless
HPCCOLLECT_REQUIRE_TORCHRL=1 (CI's torchrl run), where they fail.
"""

from __future__ import annotations

import gc
import os
import time

import pytest
import torch

if os.environ.get("HPCCOLLECT_REQUIRE_TORCHRL") != "1":
    pytest.importorskip("torchrl")

from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer
from torchrl.modules import RandomPolicy
from torchrl.testing.mocking_classes import CountingEnv

from hpccollect.collectors import (
    AsyncCollector,
    Collector,
    MultiAsyncCollector,
    MultiSyncCollector,
)

pytestmark = [
    pytest.mark.torchrl,
    pytest.mark.slow,
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning"),
]
STORAGES = [LazyMemmapStorage, LazyTensorStorage]


def _wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def bias_policy() -> TensorDictSequential:
    """Action = its bias (an int8 0 at first), whatever the count."""
    linear = torch.nn.Linear(1, 1)
    linear.weight.data.zero_()
    linear.bias.data.zero_()
    return TensorDictSequential(
        TensorDictModule(lambda x: x.float(), in_keys=["observation"], out_keys=["action"]),
        TensorDictModule(linear, in_keys=["action"], out_keys=["action"]),
        TensorDictModule(lambda x: x.to(torch.int8), in_keys=["action"], out_keys=["action"]),
    )


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_workers_fill_a_torchrl_buffer_and_weights_reach_them(cls, storage) -> None:
    rb = ReplayBuffer(storage=storage(1000))
    policy = bias_policy()
    weights = TensorDict.from_module(policy).data.clone()
    c = cls([CountingEnv, CountingEnv], policy, replay_buffer=rb, frames_per_batch=16)
    try:
        c.start()
        _wait_for(lambda: len(rb) >= 32)
        # read while paused: a worker mid-write has moved the cursor before its data lands
        with c.pause():  # the workers see the very buffer (shared length and write count)
            assert (rb[-16:]["action"] == 0).all()
            assert c.map_fn("replay_buffer.__len__") == [len(rb)] * 2
            assert c.get_distant_attr("replay_buffer.write_count") == [rb.write_count] * 2
        weights["module", "1", "module", "bias"] += 1
        c.update_policy_weights_(weights)
        after = rb.write_count
        _wait_for(lambda: rb.write_count >= after + 32)
        with c.pause():
            assert (rb[-16:]["action"] == 1).all()
    finally:
        c.async_shutdown(timeout=30)


def test_a_paused_async_collector_writes_nothing() -> None:
    rb = ReplayBuffer(storage=LazyMemmapStorage(1000))
    c = AsyncCollector(CountingEnv, bias_policy(), replay_buffer=rb, frames_per_batch=16)
    try:
        c.start()
        _wait_for(lambda: len(rb) >= 16)
        with c.pause():
            written = rb.write_count
            time.sleep(0.5)
            assert rb.write_count == written
        _wait_for(lambda: rb.write_count > written)
    finally:
        c.async_shutdown(timeout=30)


def test_workers_write_whole_trajectories_into_a_torchrl_buffer() -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(2000))
    c = MultiSyncCollector(
        [lambda: CountingEnv(max_steps=5)] * 2,
        RandomPolicy(CountingEnv().action_spec),  # steps of 0 or 1: the count ends at 5
        replay_buffer=rb,
        frames_per_batch=8,
        trajs_per_batch=2,
    )
    try:
        c.start()
        _wait_for(lambda: len(rb) >= 60)
        with c.pause():
            data = rb[: len(rb)]
    finally:
        c.async_shutdown(timeout=30)
    ids = data["collector", "traj_ids"]
    done = data["next", "done"].squeeze(-1)
    for traj in ids.unique():
        steps = (ids == traj).nonzero().squeeze(-1)
        assert (steps.diff() == 1).all(), "a trajectory is written in one piece"
        assert done[steps[-1]] and not done[steps[:-1]].any(), "and complete"


class _RecordingFactory:
    """Builds a policy that also writes ``policy_info``; notes each pid it runs in."""

    def __init__(self, log: str) -> None:
        self.log = log

    def __call__(self) -> TensorDictSequential:
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        policy = bias_policy()
        policy[1].module.bias.data.fill_(1.0)  # counts up: trajectories end at max_steps
        info = TensorDictModule(lambda x: x.float() * 2, ["observation"], ["policy_info"])
        return TensorDictSequential(policy, info)


@pytest.mark.parametrize("storage", STORAGES)
def test_policy_factory_runs_only_in_the_workers_that_fill_the_buffer(tmp_path, storage) -> None:
    log = tmp_path / "pids"
    rb = ReplayBuffer(storage=storage(400))
    c = MultiAsyncCollector(
        [lambda: CountingEnv(max_steps=4)] * 2,
        policy_factory=_RecordingFactory(str(log)),
        replay_buffer=rb,
        frames_per_batch=16,
        total_frames=96,
        trajs_per_batch=2,
        traj_format="padded",
    )
    try:
        for _ in c:
            pass
    finally:
        c.shutdown()
    pids = log.read_text().split()
    assert str(os.getpid()) not in pids, "the storage is laid out by a worker, not from here"
    assert len(set(pids)) == 2
    data = rb[: len(rb)]
    assert len(rb) > 0 and "policy_info" in data.keys()
    torch.testing.assert_close(data["policy_info"], data["observation"].float() * 2)
    scratch = getattr(rb.storage, "scratch_dir", None)
    del rb, data, c
    gc.collect()
    assert scratch is None or not os.path.exists(scratch), "the storage's folder goes with it"


@pytest.mark.parametrize("trajs_per_batch", [None, 2])
def test_batches_reach_the_buffer_on_its_storage_device(trajs_per_batch) -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(200, device="cpu"))
    devices = []
    extend = rb.extend

    def spy(td):
        devices.append(td.device)
        return extend(td)

    rb.extend = spy
    c = Collector(
        lambda: CountingEnv(max_steps=4),
        RandomPolicy(CountingEnv().action_spec),
        replay_buffer=rb,
        frames_per_batch=8,
        total_frames=48,
        trajs_per_batch=trajs_per_batch,
        postproc=lambda td: td.clear_device_(),  # the device is gone, the tensors are on cpu
    )
    try:
        list(c)
    finally:
        c.shutdown()
    assert devices and all(d == torch.device("cpu") for d in devices)
