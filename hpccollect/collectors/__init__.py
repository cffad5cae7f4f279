"""Data collectors with TorchRL's API, under TorchRL 0.14.1's names too (``Collector``,
``AsyncCollector``, ``MultiSyncCollector``, ``MultiAsyncCollector``, ``MultiCollector``,
``BaseCollector``): ``from torchrl.collectors import X`` becomes ``from hpccollect.collectors
import X``. The distributed ones are in ``hpccollect.collectors.distributed``, as in TorchRL."""

from hpccollect.collectors.base import DataCollectorBase, Interruptor
from hpccollect.collectors.loops.trajectories import split_trajectories
from hpccollect.collectors.multi import (
    MultiaSyncDataCollector,
    MultiCollector,
    MultiSyncDataCollector,
    aSyncDataCollector,
)
from hpccollect.collectors.profiling import ProfileConfig
from hpccollect.collectors.sync import SyncDataCollector
from hpccollect.collectors.torchrl_api.elsewhere import (
    AsyncBatchedCollector,
    Evaluator,
    RayWeightUpdater,
)
from hpccollect.collectors.torchrl_api.weight_updaters import (
    MultiProcessedWeightUpdater,
    RemoteModuleWeightUpdater,
    VanillaWeightUpdater,
)
from hpccollect.collectors.weights import (
    LocalWeightsUpdaterBase,
    PolicyWeightsCopier,
    RemoteWeightsUpdaterBase,
    WeightUpdaterBase,
)
from hpccollect.policy import RandomPolicy

# TorchRL 0.14.1's names for the same classes
BaseCollector = DataCollectorBase
Collector = SyncDataCollector
AsyncCollector = aSyncDataCollector
MultiSyncCollector = MultiSyncDataCollector
MultiAsyncCollector = MultiaSyncDataCollector

__all__ = [
    "AsyncBatchedCollector",
    "AsyncCollector",
    "BaseCollector",
    "Collector",
    "DataCollectorBase",
    "Evaluator",
    "Interruptor",
    "LocalWeightsUpdaterBase",
    "MultiAsyncCollector",
    "MultiCollector",
    "MultiProcessedWeightUpdater",
    "MultiSyncCollector",
    "MultiSyncDataCollector",
    "MultiaSyncDataCollector",
    "PolicyWeightsCopier",
    "ProfileConfig",
    "RandomPolicy",
    "RayWeightUpdater",
    "RemoteModuleWeightUpdater",
    "RemoteWeightsUpdaterBase",
    "SyncDataCollector",
    "VanillaWeightUpdater",
    "WeightUpdaterBase",
    "aSyncDataCollector",
    "split_trajectories",
]
