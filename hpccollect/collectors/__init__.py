"""Data collectors with TorchRL's API, under TorchRL 0.14.1's names too (``Collector``,
``AsyncCollector``, ``MultiSyncCollector``, ``MultiAsyncCollector``, ``MultiCollector``,
``BaseCollector``): ``from torchrl.collectors import X`` becomes ``from hpccollect.collectors
import X``. The distributed ones are in ``hpccollect.collectors.distributed``, as in TorchRL.

Each name loads its module when first used (see ``hpccollect._lazy.lazy_exports``)."""

from typing import TYPE_CHECKING

from hpccollect._lazy import lazy_exports

if TYPE_CHECKING:
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

_MULTI = "hpccollect.collectors.multi"
_UPDATERS = "hpccollect.collectors.torchrl_api.weight_updaters"
_WEIGHTS = "hpccollect.collectors.weights"
_ELSEWHERE = "hpccollect.collectors.torchrl_api.elsewhere"
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "DataCollectorBase": "hpccollect.collectors.base:DataCollectorBase",
        "Interruptor": "hpccollect.collectors.base:Interruptor",
        "split_trajectories": "hpccollect.collectors.loops.trajectories:split_trajectories",
        "MultiaSyncDataCollector": f"{_MULTI}:MultiaSyncDataCollector",
        "MultiCollector": f"{_MULTI}:MultiCollector",
        "MultiSyncDataCollector": f"{_MULTI}:MultiSyncDataCollector",
        "aSyncDataCollector": f"{_MULTI}:aSyncDataCollector",
        "ProfileConfig": "hpccollect.collectors.profiling:ProfileConfig",
        "SyncDataCollector": "hpccollect.collectors.sync:SyncDataCollector",
        "AsyncBatchedCollector": f"{_ELSEWHERE}:AsyncBatchedCollector",
        "Evaluator": f"{_ELSEWHERE}:Evaluator",
        "RayWeightUpdater": f"{_ELSEWHERE}:RayWeightUpdater",
        "MultiProcessedWeightUpdater": f"{_UPDATERS}:MultiProcessedWeightUpdater",
        "RemoteModuleWeightUpdater": f"{_UPDATERS}:RemoteModuleWeightUpdater",
        "VanillaWeightUpdater": f"{_UPDATERS}:VanillaWeightUpdater",
        "LocalWeightsUpdaterBase": f"{_WEIGHTS}:LocalWeightsUpdaterBase",
        "PolicyWeightsCopier": f"{_WEIGHTS}:PolicyWeightsCopier",
        "RemoteWeightsUpdaterBase": f"{_WEIGHTS}:RemoteWeightsUpdaterBase",
        "WeightUpdaterBase": f"{_WEIGHTS}:WeightUpdaterBase",
        "RandomPolicy": "hpccollect.policy:RandomPolicy",
        # TorchRL 0.14.1's names for the same classes
        "BaseCollector": "hpccollect.collectors.base:DataCollectorBase",
        "Collector": "hpccollect.collectors.sync:SyncDataCollector",
        "AsyncCollector": f"{_MULTI}:aSyncDataCollector",
        "MultiSyncCollector": f"{_MULTI}:MultiSyncDataCollector",
        "MultiAsyncCollector": f"{_MULTI}:MultiaSyncDataCollector",
    },
)

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
