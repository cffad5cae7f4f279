"""Where TorchRL users import the distributed collectors from (``torchrl.collectors.distributed``):
``DistributedCollector``, ``DistributedSyncCollector`` and hpccollect's ``DistributedDataCollector``.

Importing it loads hpccollect's distributed layer; ``hpccollect.collectors`` alone does not.
"""

from hpccollect.distributed import (
    DistributedCollector,
    DistributedDataCollector,
    DistributedSyncCollector,
)

__all__ = ["DistributedCollector", "DistributedDataCollector", "DistributedSyncCollector"]
