"""hpccollect: TorchRL's collector API for HPC batch jobs, without torchrl.

Switch from TorchRL by changing the import::

    from hpccollect import SyncDataCollector

TorchRL 0.14.1 renamed its collectors (``Collector``, ``AsyncCollector``, ``MultiSyncCollector``,
``MultiAsyncCollector``, ``BaseCollector``); those names are aliases of the same classes here.
"""

from hpccollect._version import __version__
from hpccollect.collectors import (
    DataCollectorBase,
    Interruptor,
    LocalWeightsUpdaterBase,
    MultiaSyncDataCollector,
    MultiSyncDataCollector,
    RemoteWeightsUpdaterBase,
    SyncDataCollector,
    WeightUpdaterBase,
    aSyncDataCollector,
    split_trajectories,
)
from hpccollect.distributed import DistributedDataCollector
from hpccollect.envs import GymEnv
from hpccollect.launchers.mpi import abort_on_uncaught_under_mpiexec
from hpccollect.policy import ExplorationType, RandomPolicy
from hpccollect.storage import ReplayBuffer

# under mpiexec, an uncaught exception on one rank would leave the others waiting forever
abort_on_uncaught_under_mpiexec()

# TorchRL 0.14.1's names for the same collectors
BaseCollector = DataCollectorBase
Collector = SyncDataCollector
AsyncCollector = aSyncDataCollector
MultiSyncCollector = MultiSyncDataCollector
MultiAsyncCollector = MultiaSyncDataCollector

__all__ = [
    "AsyncCollector",
    "BaseCollector",
    "Collector",
    "DataCollectorBase",
    "DistributedDataCollector",
    "ExplorationType",
    "GymEnv",
    "Interruptor",
    "LocalWeightsUpdaterBase",
    "MultiAsyncCollector",
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
