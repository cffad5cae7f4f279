"""Data collectors with TorchRL's API."""

from hpccollect.collectors.base import DataCollectorBase, Interruptor
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
    "PolicyWeightsCopier",
    "RemoteWeightsUpdaterBase",
    "SyncDataCollector",
    "WeightUpdaterBase",
    "split_trajectories",
]
