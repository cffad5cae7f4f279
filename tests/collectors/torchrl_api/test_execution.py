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
def test_rpc_builds_the_rpc_collector() -> None:
    from hpccollect.collectors.distributed import RPCCollector

    collector = Collector(
        counter, None, frames_per_batch=8, total_frames=16, backend="rpc", num_collectors=2,
        sync=True, backend_options={"launcher": "mp"},
    )  # fmt: skip
    try:
        assert isinstance(collector, RPCCollector) and collector.sync
        batches = list(collector)
    finally:
        collector.shutdown()
    assert [b.batch_size for b in batches] == [torch.Size([8])] * 2  # both ranks' 4, end to end


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
    ("kwargs", "error", "match"),
    [  # the phrases TorchRL's own tests look for, and the fix
        ({"backend": "ray"}, ArgumentValueError, "RayCollector"),
        ({"backend": "dask"}, ArgumentValueError, "backend must be one of"),
        ({"num_collectors": 0}, ArgumentValueError, "num_collectors must be a positive integer"),
        ({"num_collectors": True}, ArgumentTypeError, "num_collectors must be a positive integer"),
        ({"num_collectors": 2.0}, ArgumentTypeError, "num_collectors must be a positive integer"),
        ({"backend": "direct", "sync": True}, ArgumentValueError, "backend='direct'"),
        ({"backend": "direct", "num_collectors": 2}, ArgumentValueError, "at most one.*'process'"),
        ({"backend": "process", "sync": "yes"}, ArgumentTypeError, "sync"),
        (
            {"backend": "process", "backend_options": {"num_workers": 2}},
            ArgumentValueError,
            r"reserved selector keys \['num_workers'\]",
        ),
        (
            {"backend": "process", "backend_options": {"frames_per_batch": 4}},
            ArgumentValueError,
            r"duplicate top-level collector arguments \['frames_per_batch'\]",
        ),
        (  # a duplicate is named before the backend is refused
            {"backend": "ray", "backend_options": {"frames_per_batch": 4}},
            ArgumentValueError,
            "duplicate",
        ),
        (
            {"backend": "submitit", "backend_options": {"launcher": "mp"}},
            ArgumentValueError,
            "submitit",
        ),
    ],
)
def test_bad_selections_are_named(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Collector(counter, None, frames_per_batch=8, **kwargs)


def test_at_most_two_positional_arguments() -> None:
    with pytest.raises(ArgumentTypeError, match="at most create_env_fn and policy"):
        Collector(counter, None, 8)


def test_num_collectors_must_match_the_env_list() -> None:
    with pytest.raises(ArgumentValueError, match="does not match.*num_collectors=3"):
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


class Recording:
    """An execution backend a user registers: it keeps what ``Collector`` passed it."""

    def __init__(self, create_env_fn, policy, *, sync: bool, frames_per_batch: int) -> None:
        self.given = (create_env_fn, policy, sync, frames_per_batch)


def test_an_execution_backend_registered_by_name_is_built_on_first_use() -> None:
    """``register_execution(name, "module:Class")``, as launchers are registered: the class is
    imported when ``Collector(backend=name)`` first asks for it."""
    from hpccollect.collectors.torchrl_api.execution import execution_names, register_execution

    register_execution("recording", f"{__name__}:Recording")
    try:
        assert "recording" in execution_names()
        built = Collector(counter, None, backend="recording", frames_per_batch=8, sync=True)
        assert type(built) is Recording
        assert built.given == ([counter], None, True, 8)  # one env constructor per collector
        with pytest.raises(ArgumentValueError, match="'module:attr'"):
            register_execution("bad", "no colon")
    finally:
        from hpccollect.collectors.torchrl_api import execution

        execution._EXECUTIONS.pop("recording", None)
