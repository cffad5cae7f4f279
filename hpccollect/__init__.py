"""hpccollect: TorchRL's collector API for HPC batch jobs, without torchrl.

Switch from TorchRL by changing the import::

    from hpccollect import SyncDataCollector
"""

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
from hpccollect.envs import GymEnv
from hpccollect.policy import ExplorationType, RandomPolicy
from hpccollect.storage import ReplayBuffer

__version__ = "0.1.0"

__all__ = [
    "DataCollectorBase",
    "ExplorationType",
    "GymEnv",
    "Interruptor",
    "LocalWeightsUpdaterBase",
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
