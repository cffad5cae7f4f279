"""The distributed collector: rank 0 gathers batches from collector ranks over torch.distributed.

Loading it under an MPI launcher (several ranks) makes an uncaught exception end the whole job
instead of leaving the other ranks waiting; an mpiexec script loads it before anything can fail."""

from hpccollect.distributed.collector import DistributedDataCollector, DistributedSyncCollector
from hpccollect.launchers.mpi import abort_on_uncaught_under_mpiexec, serve
from hpccollect.launchers.rank import RankArgs, serve_rank
from hpccollect.transport.backends import available_backends

abort_on_uncaught_under_mpiexec()

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
