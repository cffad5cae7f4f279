"""TorchRL's collector names hpccollect does not provide: they import from TorchRL's paths, and
building one says what to use instead."""

from __future__ import annotations

import importlib

import pytest

import hpccollect
from hpccollect.errors import NotProvidedError

NAMES = [
    ("hpccollect.collectors", "AsyncBatchedCollector", "MultiaSyncDataCollector"),
    ("hpccollect.collectors", "Evaluator", "SyncDataCollector"),
    ("hpccollect.collectors", "RayWeightUpdater", "DistributedDataCollector"),
    ("hpccollect.collectors.distributed", "RayCollector", "DistributedDataCollector"),
    ("hpccollect.collectors.distributed", "RayEvalWorker", "SyncDataCollector"),
]


@pytest.mark.parametrize(("module", "name", "instead"), NAMES)
def test_a_name_not_provided_imports_and_says_what_to_use_instead(module, name, instead):
    cls = getattr(importlib.import_module(module), name)
    assert name in importlib.import_module(module).__all__
    with pytest.raises(NotProvidedError, match=f"TorchRL's {name}: .*{instead}") as err:
        cls(["CartPole-v1"], None, frames_per_batch=10)
    assert isinstance(err.value, NotImplementedError)
    assert hasattr(hpccollect, instead)  # what it names exists
