"""Data collectors with TorchRL's API."""

from hpccollect.collectors.base import DataCollectorBase, Interruptor
from hpccollect.collectors.multi import (
    MultiaSyncDataCollector,
    MultiSyncDataCollector,
    aSyncDataCollector,
)
from hpccollect.collectors.sync import SyncDataCollector
from hpccollect.collectors.trajectories import split_trajectories
from hpccollect.collectors.weights import (
    LocalWeightsUpdaterBase,
    PolicyWeightsCopier,
    RemoteWeightsUpdaterBase,
    WeightUpdaterBase,
)

__all__ = [
    "DataCollectorBase",
    "Interruptor",
    "LocalWeightsUpdaterBase",
    "MultiSyncDataCollector",
    "MultiaSyncDataCollector",
    "PolicyWeightsCopier",
    "RemoteWeightsUpdaterBase",
    "SyncDataCollector",
    "WeightUpdaterBase",
    "aSyncDataCollector",
    "split_trajectories",
]
