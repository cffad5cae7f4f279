"""TorchRL 0.14.1's keywords and names, with TorchRL's meaning (gymnasium envs: no torchrl here)."""

from __future__ import annotations

import socket

import pytest
import torch
from conftest import BiasPolicy, CounterEnv
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

import hpccollect
from hpccollect import (
    Collector,
    DistributedCollector,
    DistributedSyncCollector,
    MultiCollector,
    MultiSyncCollector,
)
from hpccollect.collectors.torchrl_api.policy_options import (
    check_cudagraph_device,
    policy_input_device,
)
from hpccollect.errors import ArgumentTypeError, ArgumentValueError

#: whether this machine really has CUDA (``cuda_here`` makes the main process say so)
CUDA = torch.cuda.is_available()


def bias_policy() -> TensorDictModule:
    """Takes action 0 until weights with a larger second bias arrive."""
    return TensorDictModule(BiasPolicy(), ["observation"], ["action"])


def flipped() -> TensorDict:
    return TensorDict({"module": {"bias": torch.tensor([0.0, 1.0])}}, [])


def counter() -> CounterEnv:
    return CounterEnv(4)


def actions(batch: TensorDict) -> torch.Tensor:
    return batch["action"].argmax(-1)


def test_policy_factory_builds_the_policy() -> None:
    collector = Collector(counter, policy_factory=bias_policy, frames_per_batch=8, total_frames=16)
    first = next(iter(collector))
    collector.update_policy_weights_(
        TensorDict.from_module(BiasPolicy()).apply(lambda b: b.flip(0))
    )
    second = next(iter(collector))
    collector.shutdown()
    assert (actions(first) == 0).all() and (actions(second) == 1).all()


def test_policy_and_policy_factory_together_are_refused() -> None:
    with pytest.raises(TypeError, match="policy_factory"):
        Collector(counter, bias_policy(), policy_factory=bias_policy, frames_per_batch=8)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sync", [True, False])
def test_policy_factory_in_workers_takes_weights_sent_to_every_worker(sync: bool) -> None:
    collector = MultiCollector(
        [counter, counter], policy_factory=bias_policy, sync=sync, frames_per_batch=16
    )
    try:
        assert isinstance(collector, MultiCollector)
        before = next(iter(collector))
        with pytest.raises(ArgumentValueError, match="policy_factory"):
            collector.update_policy_weights_()  # no weights here to send
        collector.update_policy_weights_(flipped())
        states = collector.state_dict()
        after = [next(iter(collector)) for _ in range(4)]
    finally:
        collector.shutdown()
    assert (actions(before) == 0).all()
    for i in range(2):
        assert states[f"worker{i}"]["policy_state_dict"]["module.bias"].tolist() == [0.0, 1.0]
    # async workers may each have delivered one batch collected before the update
    assert all((actions(b) == 1).all() for b in after[2:])


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("cls", [DistributedCollector, DistributedSyncCollector])
def test_policy_factory_on_ranks_with_a_string_tcp_port(cls: type) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])  # as TorchRL's docs and tests pass it
    collector = cls(
        [counter, counter],
        policy_factory=bias_policy,
        frames_per_batch=16,
        total_frames=-1,
        launcher="mp",
        tcp_port=port,
    )
    stale = new = 0
    try:
        assert collector.tcp_port == int(port)
        before = next(iter(collector))
        collector.update_policy_weights_(flipped())
        # a rank may have begun one batch before the weights came (async: two ranks, so up
        # to two such batches, in any order); every later batch is collected with them
        for batch in collector:
            if (actions(batch) == 1).all():
                new += 1
            else:
                stale += 1
            if new == 4 or stale + new == 20:
                break
    finally:
        collector.shutdown()
    assert (actions(before) == 0).all()
    if cls is DistributedSyncCollector:
        assert before.batch_size == (2, 8)
    assert new >= 1 and stale <= 2, (new, stale)


@pytest.mark.parametrize("port", ["abc", "70000", -1, 3.5])
def test_a_bad_tcp_port_is_named(port) -> None:
    with pytest.raises((ArgumentValueError, ArgumentTypeError), match="tcp_port"):
        DistributedCollector([counter], None, frames_per_batch=8, launcher="mp", tcp_port=port)


def test_distributed_sync_collector_is_always_sync() -> None:
    with pytest.raises(ArgumentValueError, match="always synchronous"):
        DistributedSyncCollector([counter], None, frames_per_batch=8, launcher="mp", sync=False)


def test_compile_policy_gives_the_same_batches() -> None:
    def run(**kwargs) -> TensorDict:
        collector = Collector(
            counter, bias_policy(), frames_per_batch=12, total_frames=24, **kwargs
        )
        out = torch.cat([b["action"] for b in collector])
        collector.shutdown()
        return out

    assert torch.equal(run(), run(compile_policy={"backend": "eager", "warmup": 2}))
    if not torch.cuda.is_available():  # calls pass through
        assert torch.equal(run(), run(cudagraph_policy=True))
        return
    assert torch.equal(run(), run(cudagraph_policy=True, policy_device="cuda").cpu())
    with pytest.raises(ArgumentValueError, match="policy_device='cuda'"):  # a CPU input
        Collector(counter, bias_policy(), frames_per_batch=12, cudagraph_policy=True)
    with pytest.raises(ArgumentValueError, match="policy_device='cuda'"):  # in the worker
        MultiSyncCollector([counter], bias_policy(), frames_per_batch=12, cudagraph_policy=True)


@pytest.mark.parametrize(
    ("device", "cuda", "refused"),
    [("cpu", True, True), ("cuda", True, False), ("cpu", False, False), (None, True, False)],
)
def test_cudagraph_policy_needs_the_policys_input_on_cuda_where_there_is_cuda(
    device, cuda, refused
):
    """The rule the GPU run of the test above checks end to end, decided here without a GPU
    (None: a worker's input device, not known before its env is built, is checked there)."""
    dev = None if device is None else torch.device(device)
    if not refused:
        check_cudagraph_device({}, dev, cuda=cuda)
        return
    with pytest.raises(ArgumentValueError, match="input is on cpu: pass policy_device='cuda'"):
        check_cudagraph_device({}, dev, cuda=cuda)
    check_cudagraph_device(None, dev, cuda=cuda)  # off: nothing to check


@pytest.mark.parametrize(
    ("policy_device", "env_device", "torchrl_env", "input_device"),
    [
        (None, None, False, "cpu"),  # a gymnasium env's steps are built on the CPU
        ("cuda", None, False, "cuda"),  # moved to policy_device
        (None, "cuda", True, "cuda"),  # a TorchRL env's data stays where the env gives it
        ("cpu", "cuda", True, "cpu"),
        (None, "cuda", False, "cpu"),
    ],
)
def test_the_policys_input_is_where_policy_device_or_a_torchrl_env_puts_it(
    policy_device, env_device, torchrl_env, input_device
):
    def dev(name):
        return None if name is None else torch.device(name)

    where = policy_input_device(dev(policy_device), dev(env_device), torchrl_env)
    assert where == torch.device(input_device)


@pytest.fixture
def cuda_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process takes CUDA to be usable (worker processes still see the truth)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_cudagraph_policy_with_a_cpu_input_is_refused_before_anything_runs(cuda_here) -> None:
    """A gymnasium env's input is on the CPU, whatever the policy (with or without weights);
    a Multi collector refuses a worker's ``policy_device`` off CUDA before any worker starts."""
    for policy in (bias_policy(), None):
        with pytest.raises(ArgumentValueError, match="input is on cpu: pass policy_device="):
            Collector(counter, policy, frames_per_batch=12, cudagraph_policy=True)
    with pytest.raises(ArgumentValueError, match="input is on cpu: pass policy_device="):
        MultiSyncCollector(
            [counter, counter],
            policy_factory=bias_policy,
            frames_per_batch=12,
            cudagraph_policy=True,
            policy_device="cpu",
        )


@pytest.mark.timeout(60)
def test_a_multi_collectors_workers_decide_cudagraph_policy_without_policy_device(
    cuda_here,
) -> None:
    """Without ``policy_device`` the Multi collector leaves the check to each worker, which
    knows its env: on a CPU machine the worker calls the policy as it is; on a CUDA machine it
    refuses the gymnasium env's CPU input (the main process only thought it had CUDA here)."""
    if CUDA:
        with pytest.raises(ArgumentValueError, match="input is on cpu"):
            MultiSyncCollector(
                [counter], policy_factory=bias_policy, frames_per_batch=8, cudagraph_policy=True
            )
        return
    collector = MultiSyncCollector(
        [counter],
        policy_factory=bias_policy,
        frames_per_batch=8,
        total_frames=16,
        cudagraph_policy=True,
    )
    try:
        assert sum(batch.numel() for batch in collector) == 16
    finally:
        collector.shutdown()


def test_collect_hooks_are_called_around_each_batch() -> None:
    seen: list = []
    collector = Collector(
        counter,
        None,
        frames_per_batch=6,
        total_frames=12,
        pre_collect_hook=lambda: seen.append("pre"),
        post_collect_hook=lambda batch: seen.append(batch.numel()),
        worker_idx=3,
    )
    list(collector)
    collector.shutdown()
    assert seen == ["pre", 6, "pre", 6] and collector.worker_idx == 3


@pytest.mark.parametrize(
    ("keyword", "value"),
    [
        ("backend", "ray"),
        ("weight_sync_schemes", {"policy": object()}),
    ],
)
def test_a_feature_not_offered_is_named_with_the_way_here(keyword: str, value) -> None:
    with pytest.raises(ArgumentValueError, match=keyword) as info:
        Collector(counter, None, frames_per_batch=8, **{keyword: value})
    assert "TorchRL" in str(info.value) and not isinstance(info.value, TypeError)


@pytest.mark.parametrize(
    "call",
    [
        lambda c, w: c.update_policy_weights_(w),
        lambda c, w: c.update_policy_weights_(weights=w),
        lambda c, w: c.update_policy_weights_(policy_weights=w),
        lambda c, w: c.update_policy_weights_(weights_dict={"policy": w}),
        lambda c, w: c.update_policy_weights_(w, model_id="policy"),
    ],
)
def test_torchrl_spellings_of_update_policy_weights(call) -> None:
    collector = Collector(counter, bias_policy(), frames_per_batch=8)
    before = next(iter(collector))
    call(collector, flipped())
    after = next(iter(collector))
    collector.shutdown()
    assert (actions(before) == 0).all() and (actions(after) == 1).all()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model_id": "value"}, "model_id='value'"),
        ({"weights_dict": {"critic": flipped()}}, "critic"),
        ({"weights": flipped(), "policy": BiasPolicy()}, "once"),
    ],
)
def test_weights_for_another_model_or_given_twice_are_refused(kwargs, match) -> None:
    collector = Collector(counter, bias_policy(), frames_per_batch=8)
    try:
        with pytest.raises((ArgumentValueError, ArgumentTypeError), match=match):
            collector.update_policy_weights_(**kwargs)
    finally:
        collector.shutdown()


@pytest.mark.parametrize(
    ("schemes", "match"),
    [
        ({"weight_sync_schemes": ["policy"]}, "must be a dict"),
        ({"weight_recv_schemes": {"critic": object()}}, "critic"),
        ({"weight_sync_schemes": {"policy": object()}}, "no workers"),
    ],
)
def test_weight_schemes_that_cannot_apply_are_named(schemes, match) -> None:
    with pytest.raises((ArgumentValueError, ArgumentTypeError), match=match):
        Collector(counter, None, frames_per_batch=8, **schemes)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_multi_sync_extends_the_buffer_with_each_workers_part() -> None:
    """As TorchRL's workers each extend the replay buffer with their own batch."""

    class Recording:
        def __init__(self) -> None:
            self.shapes: list = []

        def extend(self, data: TensorDict) -> None:
            self.shapes.append(tuple(data.shape))

    buffer = Recording()
    collector = MultiSyncCollector(
        [counter, counter], None, frames_per_batch=16, total_frames=32, replay_buffer=buffer
    )
    assert list(collector) == [None, None]
    collector.shutdown()
    assert buffer.shapes == [(8,)] * 4


def test_stats_hooks_and_trajectory_attributes_as_torchrl_has_them() -> None:
    collector = Collector(
        counter, None, frames_per_batch=8, total_frames=16, trajs_per_batch=2, traj_format="cat"
    )
    assert (collector.trajs_per_batch, collector.traj_format) == (2, "cat")
    assert collector.stats() == {
        "frames": 0,
        "batches": 0,
        "total_frames": 16,
        "completed": False,
        "requested_frames_per_batch": 8,
    }
    collector.shutdown()
    seen: list = []
    collector = Collector(counter, None, frames_per_batch=8, total_frames=16)
    collector.pre_collect_hook = lambda: seen.append("pre")  # set after construction
    collector.post_collect_hook = lambda batch: seen.append(batch.numel())
    list(collector)
    assert seen == ["pre", 8, "pre", 8]
    assert collector.stats()["completed"] and collector.stats()["batches"] == 2
    collector.shutdown()


def test_a_weight_updater_written_for_torchrl_runs_its_hooks() -> None:
    """A WeightUpdaterBase subclass with only TorchRL's hooks: the weights go through
    _maybe_map_weights to each worker id by _sync_weights_with_worker."""
    from hpccollect.collectors import WeightUpdaterBase

    class Mine(WeightUpdaterBase):
        def __init__(self) -> None:
            self.synced: list = []

        def _get_server_weights(self):
            return "from the server"

        def _maybe_map_weights(self, weights):
            return f"mapped {weights}"

        def _sync_weights_with_worker(self, *, worker_id, server_weights):
            self.synced.append((worker_id, server_weights))

        def all_worker_ids(self):
            return [0, 1]

    updater = Mine()
    collector = Collector(counter, None, frames_per_batch=8, weight_updater=updater)
    collector.update_policy_weights_()
    collector.update_policy_weights_("given")
    collector.shutdown()
    assert updater.synced == [
        (0, "mapped from the server"),
        (1, "mapped from the server"),
        (0, "mapped given"),
        (1, "mapped given"),
    ]


def test_policy_transforms_cannot_be_appended_to_a_gymnasium_env() -> None:
    with pytest.raises(ArgumentValueError, match="gymnasium"):
        Collector(counter, bias_policy(), frames_per_batch=8, auto_register_policy_transforms=True)


def test_torchrl_defaults_of_those_keywords_are_accepted() -> None:
    collector = Collector(
        counter,
        None,
        frames_per_batch=8,
        total_frames=8,
        backend="direct",
        backend_options=None,
        num_collectors=None,
        sync=None,
        extend_buffer=True,
        weight_sync_schemes=None,
        weight_recv_schemes=None,
        trajs_per_batch=None,
        traj_format=None,
        auto_register_policy_transforms=None,
        compact_obs=False,
        no_cuda_sync=True,
    )
    assert len(list(collector)) == 1
    collector.shutdown()


def test_compact_obs_leaves_the_next_observation_out() -> None:
    collector = Collector(counter, None, frames_per_batch=8, total_frames=8, compact_obs=True)
    (batch,) = list(collector)
    collector.shutdown()
    assert "observation" in batch.keys()
    assert set(batch["next"].keys()) == {"reward", "done", "terminated", "truncated"}


@pytest.mark.parametrize("collector_class", [Collector, MultiSyncCollector])
def test_extend_buffer_false_adds_each_step(collector_class) -> None:
    def fill(extend: bool) -> tuple:
        rb = hpccollect.ReplayBuffer(100)
        adds: list = []
        original = rb.add
        rb.add = lambda step: adds.append(step.batch_size) or original(step)
        kwargs = {"num_workers": 1} if collector_class is MultiSyncCollector else {}
        collector = collector_class(
            counter,
            None,
            frames_per_batch=8,
            total_frames=16,
            replay_buffer=rb,
            extend_buffer=extend,
            **kwargs,
        )
        collector.set_seed(0)
        assert list(collector) == [None, None]
        collector.shutdown()
        return rb[:16], adds

    per_step, adds = fill(False)
    whole, _ = fill(True)
    assert len(adds) == 16
    assert torch.equal(per_step["next", "observation"], whole["next", "observation"])


def test_extend_buffer_false_refuses_postproc() -> None:
    rb = hpccollect.ReplayBuffer(10)
    with pytest.raises(ArgumentValueError, match="extend_buffer"):
        Collector(
            counter,
            None,
            frames_per_batch=8,
            replay_buffer=rb,
            extend_buffer=False,
            postproc=lambda b: b,
        )


def test_multi_collector_needs_sync() -> None:
    with pytest.raises(ArgumentValueError, match="sync=True"):
        MultiCollector([counter], None, frames_per_batch=8)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_async_collector_takes_num_workers_one_and_init_fn() -> None:
    collector = hpccollect.AsyncCollector(
        counter, None, frames_per_batch=8, total_frames=8, num_workers=1, init_fn=_init
    )
    (batch,) = list(collector)
    collector.shutdown()
    assert batch.numel() == 8
    with pytest.raises(ArgumentValueError, match="exactly one worker"):
        hpccollect.AsyncCollector(counter, None, frames_per_batch=8, num_workers=2)


def _init() -> None:
    torch.manual_seed(0)


def test_torchrl_module_paths() -> None:
    from hpccollect.collectors import AsyncCollector, BaseCollector, MultiAsyncCollector
    from hpccollect.collectors.distributed import DistributedCollector as Dist

    assert Dist is hpccollect.DistributedDataCollector
    assert MultiSyncCollector is hpccollect.MultiSyncDataCollector
    assert AsyncCollector is hpccollect.aSyncDataCollector
    assert MultiAsyncCollector is hpccollect.MultiaSyncDataCollector
    assert BaseCollector is hpccollect.DataCollectorBase
