"""Where TorchRL users import the distributed collectors from (``torchrl.collectors.distributed``):
``DistributedCollector``, ``DistributedSyncCollector`` and hpccollect's ``DistributedDataCollector``;
``RayCollector`` and ``RayEvalWorker`` import, and say what to use instead when built.

Importing it loads hpccollect's distributed layer; ``hpccollect.collectors`` alone does not.
"""

from hpccollect.collectors.elsewhere import RayCollector, RayEvalWorker
from hpccollect.distributed import (
    DistributedCollector,
    DistributedDataCollector,
    DistributedSyncCollector,
)

__all__ = [
    "DistributedCollector",
    "DistributedDataCollector",
    "DistributedSyncCollector",
    "RayCollector",
    "RayEvalWorker",
]
