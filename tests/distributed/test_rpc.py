"""``RPCCollector`` and ``RPCWeightUpdater``: TorchRL's RPC collector over hpccollect's own
transport (real ranks, ``launcher="mp"``)."""

from __future__ import annotations

import pytest
import torch
from conftest import BiasPolicy, CounterEnv, assert_flips_with
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from hpccollect.collectors.distributed import RPCCollector, RPCWeightUpdater
from hpccollect.errors import ArgumentTypeError, ArgumentValueError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def short() -> CounterEnv:
    return CounterEnv(3)


def long() -> CounterEnv:
    return CounterEnv(5)


def bias_policy() -> TensorDictModule:
    return TensorDictModule(BiasPolicy(), ["observation"], ["action"])


def make(policy=None, **kwargs) -> RPCCollector:
    kwargs.setdefault("launcher", "mp")
    kwargs.setdefault("frames_per_batch", 40)
    return RPCCollector([short, long], policy, **kwargs)


def test_a_sync_round_is_each_ranks_batch_one_after_the_other():
    """TorchRL's torch.cat: rank 1's 20 frames, then rank 2's, along the first dim."""
    collector = make(sync=True, total_frames=80, tensorpipe_options={"rpc_timeout": 30})
    try:
        assert collector.worker_timeout == 30.0
        batches = list(collector)
    finally:
        collector.shutdown()
    assert [b.shape for b in batches] == [torch.Size([40])] * 2
    for batch in batches:
        steps = batch["next", "observation"][:, 0]
        assert steps[:20].max() == 3 and steps[20:].max() == 5  # rank 1's episodes, then 2's
        ids = batch["collector", "traj_ids"]
        assert not set(ids[:20].tolist()) & set(ids[20:].tolist())


def test_async_yields_one_ranks_batch_at_a_time():
    collector = make(sync=False, total_frames=160)
    try:
        batches = list(collector)
    finally:
        collector.shutdown()
    assert sum(b.numel() for b in batches) == 160
    assert all(b.shape == torch.Size([40]) for b in batches)
    maxima = {int(b["next", "observation"][:, 0].max()) for b in batches}
    assert maxima == {3, 5}  # each batch from one rank, and both ranks delivered


def test_an_rpc_weight_updater_sends_its_policy_weights():
    weights = TensorDict({"module": {"bias": torch.tensor([1.0, 0.0])}}, [])
    updater = RPCWeightUpdater(policy_weights=weights, num_workers=2)
    assert_flips_with(make(bias_policy(), sync=True, weight_updater=updater), weights)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(tensorpipe_options=[1]), ArgumentTypeError, "tensorpipe_options must be a dict"),
        (dict(tensorpipe_options={"rpc_timout": 1}), ArgumentValueError, r"\['rpc_timout'\]"),
        (dict(tensorpipe_options={"rpc_timeout": 0}), ArgumentValueError, "seconds > 0"),
        (dict(visible_devices="cuda:0"), ArgumentTypeError, "one device per collector rank"),
        (dict(visible_devices=["cpu"]), ArgumentValueError, "lists 1 device.* 2 ranks"),
    ],
)
def test_rpc_arguments_are_refused_before_any_rank_starts(kwargs, error, match):
    with pytest.raises(error, match=match):
        make(**kwargs)


@pytest.mark.parametrize(("sync", "per_batch"), [(False, 2), (True, 4)])
def test_trajs_per_batch_yields_whole_trajectories(sync, per_batch):
    """TorchRL's: ``trajs_per_batch`` whole trajectories per batch, from each rank per round
    when sync."""
    collector = make(sync=sync, total_frames=80, trajs_per_batch=2)
    try:
        batches = list(collector)
    finally:
        collector.shutdown()
    assert batches
    for batch in batches:
        assert batch.shape[0] == per_batch
        steps = batch["next", "observation"][..., 0]
        assert (steps[:, 0] == 1).all()  # each row starts an episode
