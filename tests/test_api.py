"""The public names: TorchRL's collector names (old and 0.14.1's) and the version."""

from __future__ import annotations

import ast
import importlib.metadata
from pathlib import Path

import hpccollect


def test_torchrl_0_14_1_names_are_the_same_classes():
    assert hpccollect.Collector is hpccollect.SyncDataCollector
    assert hpccollect.AsyncCollector is hpccollect.aSyncDataCollector
    assert hpccollect.MultiSyncCollector is hpccollect.MultiSyncDataCollector
    assert hpccollect.MultiAsyncCollector is hpccollect.MultiaSyncDataCollector
    assert hpccollect.BaseCollector is hpccollect.DataCollectorBase
    assert all(hasattr(hpccollect, name) for name in hpccollect.__all__)


def test_version_module_imports_nothing():
    source = Path(hpccollect.__file__).with_name("_version.py").read_text()
    tree = ast.parse(source)
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert hpccollect.__version__ == importlib.metadata.version("hpccollect")
