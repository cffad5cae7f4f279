"""hpccollect: TorchRL's collector API for HPC batch jobs, without torchrl.

Switch from TorchRL by changing the import::

    from hpccollect import SyncDataCollector

TorchRL 0.14.1 renamed its collectors (``Collector``, ``AsyncCollector``, ``MultiSyncCollector``,
``MultiAsyncCollector``, ``MultiCollector``, ``BaseCollector``, ``DistributedCollector``,
``DistributedSyncCollector``); those names are the same classes here, importable from
``hpccollect``, ``hpccollect.collectors`` and ``hpccollect.collectors.distributed``.
"""

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
from hpccollect.distributed import (
    DistributedCollector,
    DistributedDataCollector,
    DistributedSyncCollector,
)
from hpccollect.envs import GymEnv
from hpccollect.launchers.mpi import abort_on_uncaught_under_mpiexec
from hpccollect.policy import ExplorationType, RandomPolicy
from hpccollect.storage import ReplayBuffer

# under mpiexec, an uncaught exception on one rank would leave the others waiting forever
abort_on_uncaught_under_mpiexec()

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
