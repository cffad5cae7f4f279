"""The distributed collector: rank 0 gathers batches from collector ranks over torch.distributed."""

from hpccollect.distributed.collector import DistributedDataCollector, DistributedSyncCollector
from hpccollect.distributed.groups import available_backends
from hpccollect.distributed.rank import RankArgs, serve_rank
from hpccollect.launchers.mpi import serve

#: TorchRL 0.14.1's name
DistributedCollector = DistributedDataCollector

__all__ = [
    "DistributedCollector",
    "DistributedDataCollector",
    "DistributedSyncCollector",
    "RankArgs",
    "available_backends",
    "serve",
    "serve_rank",
]
