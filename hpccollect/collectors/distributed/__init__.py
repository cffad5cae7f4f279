"""Where TorchRL users import the distributed collectors from (``torchrl.collectors.distributed``):
``DistributedCollector``, ``DistributedSyncCollector`` and hpccollect's ``DistributedDataCollector``,
``RPCCollector``, their weight updaters, ``submitit_delayed_launcher`` and ``DEFAULT_SLURM_CONF``;
``RayCollector`` and ``RayEvalWorker`` import, and say what to use instead when built.

Importing it loads hpccollect's distributed layer; ``hpccollect.collectors`` alone does not.
"""

from hpccollect.collectors.distributed.default_configs import DEFAULT_SLURM_CONF
from hpccollect.collectors.torchrl_api.elsewhere import RayCollector, RayEvalWorker
from hpccollect.distributed import (
    DistributedCollector,
    DistributedDataCollector,
    DistributedSyncCollector,
)
from hpccollect.distributed.rpc import RPCCollector
from hpccollect.distributed.weights import DistributedWeightUpdater, RPCWeightUpdater
from hpccollect.launchers.prelaunched import submitit_delayed_launcher

__all__ = [
    "DEFAULT_SLURM_CONF",
    "DistributedCollector",
    "DistributedDataCollector",
    "DistributedSyncCollector",
    "DistributedWeightUpdater",
    "RPCCollector",
    "RPCWeightUpdater",
    "RayCollector",
    "RayEvalWorker",
    "submitit_delayed_launcher",
]
