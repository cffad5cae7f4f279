"""The collector arguments are declared once (``CollectorArgs``) and checked once; the public
constructors keep TorchRL's explicit signatures and forward to that one check."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from tensordict.nn import InteractionType

from hpccollect import (
    MultiaSyncDataCollector,
    MultiSyncDataCollector,
    SyncDataCollector,
    aSyncDataCollector,
)
from hpccollect.collectors.multi_base import MultiCollectorBase
from hpccollect.collectors.torchrl_api.options import CollectorArgs
from hpccollect.errors import ArgumentTypeError, ArgumentValueError

DECLARED = {f.name: f for f in dataclasses.fields(CollectorArgs)}
#: TorchRL's multi-process collectors have no return_same_td
NOT_IN_MULTI = {"return_same_td"}


def signature_defaults(cls: type) -> dict:
    params = inspect.signature(cls.__init__).parameters
    return {name: p.default for name, p in params.items() if name in DECLARED}


@pytest.mark.parametrize("cls", [SyncDataCollector, MultiCollectorBase])
def test_public_signatures_keep_the_declared_defaults(cls):
    defaults = signature_defaults(cls)
    expected = set(DECLARED) - (NOT_IN_MULTI if cls is MultiCollectorBase else set())
    assert set(defaults) == expected
    for name, default in defaults.items():
        declared = DECLARED[name].default
        if declared is dataclasses.MISSING:  # frames_per_batch: required in both
            assert default is inspect.Parameter.empty, name
        else:
            assert default == declared, (name, default, declared)


def test_the_distributed_collector_means_the_declared_defaults():
    """TorchRL's DistributedCollector writes three defaults its own way (-1 for "no limit",
    False for "no split"); each means what the declared default means once checked."""
    from hpccollect import DistributedDataCollector

    defaults = signature_defaults(DistributedDataCollector)
    assert len(defaults) >= 15  # the arguments it shares with the local collectors
    spelled_otherwise = []
    for name, default in defaults.items():
        declared = DECLARED[name].default
        if declared is dataclasses.MISSING:
            assert default is inspect.Parameter.empty, name
            continue
        if default == declared:
            continue
        spelled_otherwise.append(name)
        ours = CollectorArgs.check({"frames_per_batch": 10, name: default}, None)
        theirs = CollectorArgs.check({"frames_per_batch": 10, name: declared}, None)
        assert getattr(ours, name) == getattr(theirs, name), (name, default, declared)
    assert sorted(spelled_otherwise) == ["init_random_frames", "max_frames_per_traj", "split_trajs"]


@pytest.mark.parametrize(
    "cls", [MultiSyncDataCollector, MultiaSyncDataCollector, aSyncDataCollector]
)
def test_multi_collectors_forward_to_the_base(cls):
    assert cls.__init__ is MultiCollectorBase.__init__ or "**kwargs" in str(
        inspect.signature(cls.__init__)
    )


def test_check_normalises_and_is_idempotent():
    args = CollectorArgs.check(
        {
            "frames_per_batch": 10,
            "total_frames": None,
            "max_frames_per_traj": -1,
            "init_random_frames": -5,
            "exploration_mode": "mode",
            "not_an_argument": object(),
        }
    )
    assert (args.total_frames, args.max_frames_per_traj, args.init_random_frames) == (-1, None, 0)
    assert args.split_trajs is False and args.trust_policy is False and args.endless
    assert args.exploration_type is InteractionType.MODE and args.exploration_mode is None
    assert CollectorArgs.check(args.kwargs()) == args
    changed = args.kwargs(frames_per_batch=5, replay_buffer=None)
    assert changed["frames_per_batch"] == 5 and set(changed) == set(DECLARED)


@pytest.mark.parametrize(
    ("given", "error", "message"),
    [
        ({}, ArgumentTypeError, "frames_per_batch is required"),
        ({"frames_per_batch": 0}, ArgumentValueError, "frames_per_batch"),
        ({"frames_per_batch": 10, "replay_buffer": {}}, ArgumentTypeError, "extend"),
        ({"frames_per_batch": 10, "use_buffers": 1}, ArgumentTypeError, "use_buffers"),
        ({"frames_per_batch": 10, "traj_id_stride": 0}, ArgumentValueError, "traj_id_stride"),
    ],
)
def test_bad_arguments_are_named(given, error, message):
    with pytest.raises(error, match=message):
        CollectorArgs.check(given)


@pytest.mark.parametrize("cls", [SyncDataCollector, MultiSyncDataCollector])
def test_both_kinds_refuse_bad_arguments_with_the_same_message(cls):
    with pytest.raises(ArgumentTypeError, match="replay_buffer must have an extend"):
        cls(["CartPole-v1"], None, frames_per_batch=10, replay_buffer={})
