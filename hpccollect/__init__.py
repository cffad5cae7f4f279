"""hpccollect: TorchRL's collector API for HPC batch jobs, without torchrl.

Switch from TorchRL by changing the import::

    from hpccollect import SyncDataCollector

TorchRL 0.14.1 renamed its collectors (``Collector``, ``AsyncCollector``, ``MultiSyncCollector``,
``MultiAsyncCollector``, ``MultiCollector``, ``BaseCollector``, ``DistributedCollector``,
``DistributedSyncCollector``); those names are the same classes here, importable from
``hpccollect``, ``hpccollect.collectors`` and ``hpccollect.collectors.distributed``.

Importing hpccollect imports nothing else: each public name loads its module when first used,
so ``python -m hpccollect`` answers ``--help`` and reports a mistake on its command line before
torch loads (on every rank of an ``mpiexec`` job). The distributed names load the distributed
layer and mpi4py only when used. Importing hpccollect changes nothing of Python's or another
package's: no import hook, no replaced function (``tests/test_boundaries.py``).
"""

from typing import TYPE_CHECKING

from hpccollect._lazy import lazy_exports
from hpccollect._version import __version__
from hpccollect.collectors.torchrl_api.execution import register_execution

if TYPE_CHECKING:
    from hpccollect.collectors import (
        AsyncCollector,
        BaseCollector,
        Collector,
        DataCollectorBase,
        Interruptor,
        LocalWeightsUpdaterBase,
        MultiAsyncCollector,
        MultiaSyncDataCollector,
        MultiCollector,
        MultiSyncCollector,
        MultiSyncDataCollector,
        RemoteWeightsUpdaterBase,
        SyncDataCollector,
        WeightUpdaterBase,
        aSyncDataCollector,
        split_trajectories,
    )
    from hpccollect.distributed import (
        DistributedCollector,
        DistributedDataCollector,
        DistributedSyncCollector,
    )
    from hpccollect.envs import GymEnv
    from hpccollect.policy import ExplorationType, RandomPolicy
    from hpccollect.storage import ReplayBuffer

__all__ = [
    "AsyncCollector",
    "BaseCollector",
    "Collector",
    "DataCollectorBase",
    "DistributedCollector",
    "DistributedDataCollector",
    "DistributedSyncCollector",
    "ExplorationType",
    "GymEnv",
    "Interruptor",
    "LocalWeightsUpdaterBase",
    "MultiAsyncCollector",
    "MultiCollector",
    "MultiSyncCollector",
    "MultiSyncDataCollector",
    "MultiaSyncDataCollector",
    "RandomPolicy",
    "RemoteWeightsUpdaterBase",
    "ReplayBuffer",
    "SyncDataCollector",
    "WeightUpdaterBase",
    "__version__",
    "aSyncDataCollector",
    "split_trajectories",
]

#: where each public name lives, the collectors' package when not said
_HOMES = {
    "DistributedCollector": "hpccollect.distributed",
    "DistributedDataCollector": "hpccollect.distributed",
    "DistributedSyncCollector": "hpccollect.distributed",
    "ExplorationType": "hpccollect.policy",
    "GymEnv": "hpccollect.envs",
    "RandomPolicy": "hpccollect.policy",
    "ReplayBuffer": "hpccollect.storage",
}
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        name: f"{_HOMES.get(name, 'hpccollect.collectors')}:{name}"
        for name in __all__
        if name != "__version__"
    },
)

# what ``Collector(backend=...)`` builds, registered here by name: the collectors named import
# the registry (the single-process one dispatches through it), and the distributed layer loads
# on first use
register_execution(
    "process",
    "hpccollect.collectors.multi:MultiCollector",
    defaults_from="hpccollect.collectors.multi_base:MultiCollectorBase",
)
register_execution("distributed", "hpccollect.distributed:DistributedDataCollector")
register_execution("submitit", "hpccollect.distributed:DistributedDataCollector")
register_execution(
    "rpc",
    "hpccollect.distributed.rpc:RPCCollector",
    defaults_from="hpccollect.distributed:DistributedDataCollector",
)
