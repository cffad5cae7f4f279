"""Every public constructor documents every one of its keywords in an ``Args:`` section."""

from __future__ import annotations

import inspect

import pytest
from docstrings import args_entries

import hpccollect
import hpccollect.collectors.distributed as distributed
from hpccollect.collectors.torchrl_api.keyword_docs import KEYWORDS, with_args

PUBLIC = [
    hpccollect.SyncDataCollector,
    hpccollect.aSyncDataCollector,
    hpccollect.MultiSyncDataCollector,
    hpccollect.MultiaSyncDataCollector,
    hpccollect.MultiCollector,
    hpccollect.DistributedDataCollector,
    hpccollect.DistributedSyncCollector,
    distributed.RPCCollector,
    distributed.submitit_delayed_launcher,
]


def documented(obj) -> list[str]:
    """The names of the ``Args:`` entries of ``obj``'s docstring, in order."""
    return args_entries(inspect.cleandoc(obj.__doc__))


def parameters(obj) -> list[str]:
    call = obj.__init__ if inspect.isclass(obj) else obj
    names = []
    for name, p in inspect.signature(call).parameters.items():
        if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            names.append(name)
    return names


@pytest.mark.parametrize("obj", PUBLIC, ids=lambda o: o.__name__)
def test_every_keyword_of_a_public_constructor_has_an_args_entry(obj):
    entries = documented(obj)
    assert len(entries) == len(set(entries)), "a keyword documented twice"
    names = {e.lstrip("*") for e in entries}
    assert set(parameters(obj)) <= names, set(parameters(obj)) - names
    if obj is not hpccollect.MultiCollector:  # its keywords are another class's
        assert [e for e in entries if not e.startswith("*")] == parameters(obj)  # in order


def test_the_args_section_comes_before_the_example():
    doc = hpccollect.DistributedDataCollector.__doc__
    assert doc.index("\nArgs:\n") < doc.index("\nExample:\n")
    assert "update_interval: each rank gets the policy's weights" in doc
    # a keyword with another meaning on the distributed collector reads as its own there
    assert "sync: yield one batch from every rank" in doc
    assert "sync: with ``backend``" in hpccollect.SyncDataCollector.__doc__


def test_a_keyword_without_a_description_or_a_description_without_a_keyword_fails_at_once():
    class Made:
        """A collector with a keyword nobody described."""

        def __init__(self, frames_per_batch: int, undescribed_knob: int = 0) -> None: ...

    with pytest.raises(KeyError, match="undescribed_knob"):
        with_args()(Made)
    assert "frames_per_batch" in KEYWORDS
    with pytest.raises(KeyError, match="renamed_knob"):  # wording for a keyword not there
        with_args(undescribed_knob="described.", renamed_knob="stale.")(Made)
    made = with_args(undescribed_knob="now described.")(Made)
    assert documented(made) == ["frames_per_batch", "undescribed_knob"]
