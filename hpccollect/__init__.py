"""hpccollect: TorchRL's collector API for HPC batch jobs, without torchrl.

Switch from TorchRL by changing the import::

    from hpccollect import SyncDataCollector

TorchRL 0.14.1 renamed its collectors (``Collector``, ``AsyncCollector``, ``MultiSyncCollector``,
``MultiAsyncCollector``, ``MultiCollector``, ``BaseCollector``, ``DistributedCollector``,
``DistributedSyncCollector``); those names are the same classes here, importable from
``hpccollect``, ``hpccollect.collectors`` and ``hpccollect.collectors.distributed``.

Importing hpccollect loads neither mpi4py nor the distributed layer: the distributed names load
it when first used (see ``hpccollect.distributed``). It imports tensordict without importing
``torch._dynamo``, which halves a rank's or worker's start-up; dynamo gets tensordict's
``torch.compile`` registrations when it is first imported (see ``hpccollect._startup``).
"""

import importlib
from typing import Any

import hpccollect._startup  # noqa: F401  (first: it imports tensordict, see its docstring)
from hpccollect._version import __version__
from hpccollect.collectors import (
    AsyncCollector,
    BaseCollector,
    Collector,
    DataCollectorBase,
    Interruptor,
    LocalWeightsUpdaterBase,
    MultiAsyncCollector,
    MultiaSyncDataCollector,
    MultiCollector,
    MultiSyncCollector,
    MultiSyncDataCollector,
    RemoteWeightsUpdaterBase,
    SyncDataCollector,
    WeightUpdaterBase,
    aSyncDataCollector,
    split_trajectories,
)
from hpccollect.collectors.torchrl_api.execution import register_execution
from hpccollect.envs import GymEnv
from hpccollect.policy import ExplorationType, RandomPolicy
from hpccollect.storage import ReplayBuffer

# ``Collector(backend=...)`` builds the distributed layer's collectors too; registered here, by
# name, so that neither layer imports the other and the distributed one loads on first use
register_execution("distributed", "hpccollect.distributed:DistributedDataCollector")
register_execution("submitit", "hpccollect.distributed:DistributedDataCollector")
register_execution(
    "rpc",
    "hpccollect.distributed.rpc:RPCCollector",
    defaults_from="hpccollect.distributed:DistributedDataCollector",
)

_DISTRIBUTED = ("DistributedCollector", "DistributedDataCollector", "DistributedSyncCollector")


def __getattr__(name: str) -> Any:
    if name in _DISTRIBUTED:
        from hpccollect import distributed

        return getattr(distributed, name)
    if name in ("distributed", "launchers"):  # ``import hpccollect; hpccollect.distributed``
        return importlib.import_module(f"hpccollect.{name}")
    raise AttributeError(f"module 'hpccollect' has no attribute {name!r}")


__all__ = [
    "AsyncCollector",
    "BaseCollector",
    "Collector",
    "DataCollectorBase",
    "DistributedCollector",
    "DistributedDataCollector",
    "DistributedSyncCollector",
    "ExplorationType",
    "GymEnv",
    "Interruptor",
    "LocalWeightsUpdaterBase",
    "MultiAsyncCollector",
    "MultiCollector",
    "MultiSyncCollector",
    "MultiSyncDataCollector",
    "MultiaSyncDataCollector",
    "RandomPolicy",
    "RemoteWeightsUpdaterBase",
    "ReplayBuffer",
    "SyncDataCollector",
    "WeightUpdaterBase",
    "__version__",
    "aSyncDataCollector",
    "split_trajectories",
]
