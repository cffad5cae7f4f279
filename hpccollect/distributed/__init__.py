"""The distributed collector: rank 0 gathers batches from collector ranks over torch.distributed."""

from hpccollect.distributed.collector import DistributedDataCollector
from hpccollect.distributed.groups import available_backends
from hpccollect.distributed.rank import RankArgs, serve_rank
from hpccollect.launchers.mpi import serve

__all__ = ["DistributedDataCollector", "RankArgs", "available_backends", "serve", "serve_rank"]
