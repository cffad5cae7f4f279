"""``Collector(..., backend=..., num_collectors=..., sync=...)`` builds what TorchRL's builds."""

from __future__ import annotations

import inspect

import pytest
import torch
from conftest import CounterEnv

from hpccollect import (
    Collector,
    DistributedDataCollector,
    MultiaSyncDataCollector,
    MultiCollector,
    MultiSyncDataCollector,
    SyncDataCollector,
)
from hpccollect.errors import ArgumentTypeError, ArgumentValueError


def counter() -> CounterEnv:
    return CounterEnv(4)


def test_direct_is_the_collector_itself() -> None:
    for kwargs in ({}, {"backend": "direct"}, {"backend": "direct", "num_collectors": 1}):
        collector = Collector(counter, None, frames_per_batch=8, total_frames=8, **kwargs)
        assert type(collector) is SyncDataCollector
        assert [b.shape for b in collector] == [torch.Size([8])]
        collector.shutdown()


def test_direct_takes_a_list_of_envs() -> None:
    """One env constructor in a list, or several (hpccollect's vector env: a collector rank
    with num_workers_per_collector=2 is built so)."""
    collector = Collector([counter], None, frames_per_batch=8)
    assert type(collector) is SyncDataCollector
    collector.shutdown()
    collector = Collector([counter, counter], None, frames_per_batch=8, total_frames=8)
    assert type(collector) is SyncDataCollector
    assert [b.batch_size for b in collector] == [torch.Size([2, 4])]
    collector.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"num_collectors": 2, "sync": True}, MultiSyncDataCollector),
        ({"num_collectors": 2}, MultiaSyncDataCollector),  # TorchRL's sync default: False
        ({"backend": "multiprocessing", "num_collectors": 2}, MultiaSyncDataCollector),
        ({"backend": "process", "backend_options": {"update_at_each_batch": True}}, None),
    ],
)
def test_process_builds_a_multi_collector(kwargs: dict, expected: type | None) -> None:
    create = counter if "num_collectors" in kwargs else [counter, counter]
    collector = Collector(create, None, frames_per_batch=8, total_frames=16, **kwargs)
    try:
        assert isinstance(collector, MultiCollector) and collector.num_workers == 2
        if expected is not None:
            assert type(collector) is expected
        else:  # a list of two envs and sync left out: async, one worker's batch at a time
            assert type(collector) is MultiaSyncDataCollector
        batches = list(collector)
    finally:
        collector.shutdown()
    assert sum(b.numel() for b in batches) == 16


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_distributed_builds_the_distributed_collector() -> None:
    collector = Collector(
        counter,
        None,
        frames_per_batch=8,
        total_frames=16,
        backend="distributed",
        num_collectors=2,
        sync=True,
        backend_options={"launcher": "mp"},
    )
    try:
        assert isinstance(collector, DistributedDataCollector) and collector.sync
        batches = list(collector)
    finally:
        collector.shutdown()
    assert [b.batch_size for b in batches] == [torch.Size([2, 4])] * 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"backend": "ray"}, "RayCollector"),
        ({"backend": "rpc"}, "RPCCollector"),
        ({"backend": "dask"}, "backend must be one of"),
        ({"num_collectors": 0}, "num_collectors"),
        ({"num_collectors": True}, "num_collectors"),
        ({"backend": "direct", "sync": True}, "backend='direct'"),
        ({"backend": "process", "sync": "yes"}, "sync"),
        ({"backend": "process", "backend_options": {"num_workers": 2}}, "backend_options"),
        ({"backend": "process", "backend_options": {"frames_per_batch": 4}}, "repeats"),
        ({"backend": "submitit", "backend_options": {"launcher": "mp"}}, "submitit"),
    ],
)
def test_bad_selections_are_named(kwargs: dict, match: str) -> None:
    with pytest.raises((ArgumentValueError, ArgumentTypeError), match=match):
        Collector(counter, None, frames_per_batch=8, **kwargs)


def test_num_collectors_must_match_the_env_list() -> None:
    with pytest.raises(ArgumentValueError, match="num_collectors=3"):
        Collector([counter, counter], None, frames_per_batch=8, num_collectors=3)


def test_a_subclass_does_not_dispatch() -> None:
    class Mine(SyncDataCollector):
        pass

    with pytest.raises(ArgumentValueError, match="Mine"):
        Mine(counter, None, frames_per_batch=8, num_collectors=2)
    mine = Mine(counter, None, frames_per_batch=8)
    assert type(mine) is Mine
    mine.shutdown()


def test_signature_is_the_constructors() -> None:
    params = list(inspect.signature(Collector).parameters)
    assert params[:2] == ["create_env_fn", "policy"]
    assert {"backend", "num_collectors", "sync", "frames_per_batch"} <= set(params)
