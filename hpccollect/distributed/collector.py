"""``DistributedDataCollector``: the multi-worker collector (``collectors/multi_base.py``) over
``RankChannel``s instead of pipes, with the same protocol, pool, worker loop, seeds, state and
weight fan-out. A launcher plug-in (``hpccollect/launchers``) starts the ranks; this module never
knows how.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from functools import partial, wraps
from typing import Any

import gymnasium as gym
import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType
from torch import nn

from hpccollect._checks import check_bool, check_float, check_int, check_seconds
from hpccollect._exit import done_at_exit, shut_down_at_exit
from hpccollect.collectors.filling import ThreadFilling
from hpccollect.collectors.multi_base import MultiCollectorBase
from hpccollect.collectors.sync import SyncDataCollector
from hpccollect.collectors.torchrl_api.keyword_docs import DISTRIBUTED, with_args
from hpccollect.collectors.weights import RemoteWeightsUpdaterBase
from hpccollect.collectors.workers.cadence import DEFAULT_REPORT_INTERVAL
from hpccollect.collectors.workers.gathering import AsyncGathering, SyncGathering
from hpccollect.collectors.workers.reports import Reporting
from hpccollect.collectors.workers.worker import WorkerSpec
from hpccollect.distributed.arguments import (
    RANK_DEVICES,
    accepted_kwargs,
    check_collector_class,
    check_collector_kwargs,
    check_liveness_timeout,
    check_on_worker_failure,
    check_port,
    check_rank_reports,
    check_rank_sink,
    check_slurm_kwargs,
    rank_envs,
    weight_schedule,
)
from hpccollect.distributed.gathered import GatheredRows
from hpccollect.distributed.schedule import WeightSchedule
from hpccollect.distributed.weights import RankWeightsSender
from hpccollect.errors import ArgumentValueError
from hpccollect.launchers.rank import start_ranks
from hpccollect.transport.backends import backend_named, check_backend, rank_device
from hpccollect.transport.base import Channel
from hpccollect.transport.control import DEFAULT_LIVENESS_TIMEOUT
from hpccollect.transport.groups import RankGroups

__all__ = ["DistributedDataCollector", "DistributedSyncCollector", "GroupGatherer"]


def _holding_lock(name: str) -> Callable[..., Any]:
    """The method ``name`` of the classes after ``DistributedDataCollector``, called holding the
    collector's lock: a call from another thread (weights, state, seeds while ``start()`` fills
    the buffer) never interleaves with a step of the iterator."""

    @wraps(getattr(MultiCollectorBase, name))  # its signature and docstring
    def locked(self: DistributedDataCollector, *args: Any, **kwargs: Any) -> Any:
        with self._lock:  # the next class in the MRO, as super() would find it
            return getattr(super(DistributedDataCollector, self), name)(*args, **kwargs)

    return locked


@with_args(**DISTRIBUTED)
class DistributedDataCollector(GatheredRows, ThreadFilling, WeightSchedule, MultiCollectorBase):
    """TorchRL's distributed collector: rank 0 (this process) gathers the batches that collector
    ranks 1..N collect, and sends them policy weights.

    Each rank runs ``collector_class`` over ``num_workers_per_collector`` copies of its env,
    with ``collector_kwargs``; trajectory ids are unique across ranks and their workers.

    ``sync=True`` yields one batch from every rank stacked ``[N, ...]``, ``frames_per_batch`` in
    total; ``sync=False`` each rank's batch (``frames_per_batch`` frames) as soon as it is ready.
    Rank 0 builds no env: the batch layout comes from each rank's first message, and batches
    arrive in receive buffers allocated once.

    Weights: ``update_policy_weights_(weights=None, worker_ids=None)`` sends the trainer policy's
    weights (or ``weights``) to every rank, or to workers ``worker_ids`` (worker ``i`` is rank
    ``i + 1``), for their next batch; ``update_after_each_batch``, ``max_weight_update_interval``
    and ``update_interval`` send them without a call. With ``sync=False`` a rank goes on to its
    next batch only once its last one was yielded (as TorchRL's), so weights sent in the loop
    body reach its very next batch; where no rank's policy has weights, or with
    ``rank_reports``, it goes on at once. ``policy_versions[i]`` counts the updates worker ``i``
    received. With ``policy_factory`` each rank builds its own policy, and ``policy`` is where
    the weights come from.

    ``rank_reports=True`` (with a ``rank_sink``): the batches stay in the ranks' sinks, and the
    iterator yields one report per rank and collection stretch instead (its frames, batches,
    ended episodes and their returns, its sink's committed counts; stacked ``[N]`` with
    ``sync=True``), at least every ``report_interval`` s: rank 0 handles one small message per
    rank and interval, whatever the batches' size or rate. Weights reach a rank between two of
    its reports. ``split_trajs``, ``postproc`` and ``replay_buffer`` are refused with it.

    ``launcher="mpi"`` (under ``mpiexec``/``srun``): every rank constructs the same collector;
    rank 0 gets it, every other rank serves rank 0 inside the constructor and then ends its
    process with status 0. ``create_env_fn`` is then one constructor for every rank, or one per
    collector rank (MPI ranks 1..N-1). ``backend="mpi"`` moves the data with MPI (torch's MPI
    backend, or mpi4py where torch has none); an uncaught exception on any rank aborts the job.
    Every rank refuses an argument mistake alike before any rank serves (rank 0 alone finds
    those that need the ranks: per-rank lists, ``rank_reports`` without a ``rank_sink``).

    Example:
        A trainer on rank 0 fed by two local collector ranks, pushing its weights after each
        batch (under ``mpiexec -n 3``, ``launcher="mpi"`` makes ranks 1 and 2 the collectors)::

            collector = DistributedDataCollector(
                [make_env, make_env], policy, frames_per_batch=2048, total_frames=200_000,
                launcher="mp", backend="gloo",
            )
            for batch in collector:  # [2, 1024]: one row per rank
                train(policy, batch)
                collector.update_policy_weights_()
            collector.shutdown()
    """

    starts_ranks = True  # never a rank's own collector_class

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        policy_factory: Any = None,
        frames_per_batch: int,
        total_frames: int = -1,
        device: Any = None,
        storing_device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        max_frames_per_traj: int = -1,
        init_random_frames: int = -1,
        reset_at_each_iter: bool = False,
        postproc: Any = None,
        split_trajs: bool = False,
        exploration_type: InteractionType | str = InteractionType.RANDOM,
        exploration_mode: str | None = None,
        collector_class: type | str = SyncDataCollector,
        collector_kwargs: dict | Sequence[dict] | None = None,
        num_workers_per_collector: int = 1,
        sync: bool = False,
        slurm_kwargs: dict | None = None,
        backend: str = "gloo",
        update_after_each_batch: bool = False,
        max_weight_update_interval: int = -1,
        update_interval: int | None = None,
        launcher: Any = "submitit",
        tcp_port: int | str | None = None,
        weight_updater: Any = None,
        weight_sync_schemes: dict | None = None,
        weight_recv_schemes: dict | None = None,
        trajs_per_batch: int | None = None,
        replay_buffer: Any = None,
        track_policy_version: bool = False,
        on_worker_failure: str = "raise",
        worker_timeout: float = 600.0,
        start_timeout: float = 120.0,
        liveness_timeout: float | None = DEFAULT_LIVENESS_TIMEOUT,
        num_threads: int | None = None,
        rank_sink: Any = None,
        rank_reports: bool = False,
        report_interval: float = DEFAULT_REPORT_INTERVAL,
    ) -> None:
        arguments = locals()
        self._closed = True
        self._groups: RankGroups | None = None
        # every argument that needs no launcher is checked first: under mpiexec every rank
        # then refuses it alike, before any rank starts serving rank 0 (``launcher.enter``)
        self.collector_class = check_collector_class(collector_class)
        self.sync = check_bool("sync", sync)
        self.gathering = SyncGathering if self.sync else AsyncGathering
        self.num_workers_per_collector = check_int(
            "num_workers_per_collector", num_workers_per_collector, minimum=1
        )
        self.backend = check_backend(backend)
        self.update_after_each_batch, self.max_weight_update_interval, self.update_interval = (
            weight_schedule(update_after_each_batch, max_weight_update_interval, update_interval)
        )
        self.track_policy_version = check_bool("track_policy_version", track_policy_version)
        self.on_worker_failure = check_on_worker_failure(on_worker_failure)
        self.liveness_timeout = check_liveness_timeout(liveness_timeout)
        self.tcp_port = check_port(tcp_port)
        self.rank_sink = check_rank_sink(rank_sink)
        self.report_interval = check_float("report_interval", report_interval, minimum=0.0)
        start_timeout = check_seconds("start_timeout", start_timeout)
        # launchers import this layer (their rank entry points); loaded here, either can come first
        from hpccollect.launchers import get_launcher

        inner_processes = issubclass(self.collector_class, MultiCollectorBase)
        self.launcher = get_launcher(
            launcher, starts_processes=inner_processes, slurm_kwargs=slurm_kwargs
        )
        self.slurm_kwargs = check_slurm_kwargs(slurm_kwargs, self.launcher)
        if self.backend == "mpi" and not self.launcher.mpi_world:
            raise ArgumentValueError(
                "backend='mpi' moves data between the ranks of one MPI job: start the script "
                "with mpiexec -n N and pass launcher='mpi', or use backend='gloo'."
            )
        self.launcher.enter(start_timeout)  # under mpiexec: ranks 1..N serve, then end
        # rank 0's alone: a script may make the rank_sink on rank 0 only (``collect --shards``)
        self._reports = check_rank_reports(rank_reports, arguments)
        gathered = getattr(self.launcher, "gathered", None)  # MPILauncher(gather=...)
        ranks = self.launcher.num_ranks if gathered is None else sum(map(len, gathered))
        fns = rank_envs(create_env_fn, ranks)
        self._collector_kwargs = check_collector_kwargs(
            collector_kwargs, len(fns), self.collector_class
        )
        if gathered is not None:
            fns = self._gather_from(gathered, fns, arguments)
        # where batches and weights travel (a GPU for nccl: they never touch the host)
        self._transport_device = rank_device(backend_named(self.backend).device, 0)
        self._lock = threading.RLock()  # the background thread of start() and the caller
        n = len(fns)
        self.policy_versions = [0] * n
        self._since_update = [0] * n
        if num_threads is None and not self.launcher.shares_host:
            num_threads = torch.get_num_threads()  # the ranks run elsewhere
        super().__init__(
            fns,
            policy,
            **{name: arguments[name] for name in _PASSED_ON},
            update_at_each_batch=self.update_after_each_batch,
            num_threads=num_threads,
            cat_results=self._sync_layout if self.sync else None,
            **self._base_kwargs(),
        )
        if self._reports or not any(ch.peer_weights_nbytes for ch in self._pool.channels):
            # the ranks' sinks keep the batches (rank 0 only tallies reports), or no rank's
            # policy has weights: no weights can wait for a rank, so it goes on at once
            self._release_after_yield = False
        shut_down_at_exit(self)  # left open, it stops its ranks at exit as shutdown() does

    # ------------------------------------------------------------------ the ranks
    @property
    def num_collectors(self) -> int:
        """How many collector ranks the job has (lost ones included)."""
        return self.num_workers

    @property
    def lost_ranks(self) -> list[int]:
        """Ranks lost during collection (``on_worker_failure="continue"``), by their number in
        the job (a gathered MPI job's gatherers by their MPI rank)."""
        channels = self._pool.channels if self._pool is not None else None
        return [i + 1 if channels is None else channels[i].rank for i in self.lost_workers]

    #: how a sync round's batches are put together: stacked, or concatenated along a dim
    _sync_layout: str | int = "stack"
    _env_by_inheritance = False  # ranks get everything in their payload
    _policy_with_factory = True  # as TorchRL's: the ranks build theirs, weights come from here
    _release_after_yield = True  # as TorchRL's: weights sent in the loop reach a rank's next batch

    def _base_kwargs(self) -> dict[str, Any]:
        """More keywords for the local collector machinery (a gatherer's trajectory ids)."""
        return {}

    def _worker_spec(
        self, index: int, create_env_fn: Any, policy: Any, kwargs: dict, threads: int
    ) -> WorkerSpec:
        if self._gathered is not None:
            return self._gathered.spec(index, policy, kwargs, threads, GroupGatherer)
        k = self.num_workers_per_collector
        env = create_env_fn
        if k > 1 or issubclass(self.collector_class, MultiCollectorBase):
            single = partial(gym.make, env) if isinstance(env, str) and k > 1 else env
            env = [single] * k
        sink = None if self.rank_sink is None else partial(self.rank_sink, index + 1)
        reports = Reporting(index + 1, self.report_interval) if self._reports else None
        return WorkerSpec(env, policy, kwargs, threads, self.collector_class, sink, reports=reports)

    def _worker_kwargs(self, index: int, frames_per_batch: int, devices: Any, env_kwargs: Any):
        kwargs = super()._worker_kwargs(index, frames_per_batch, devices, env_kwargs)
        own = self._collector_kwargs[index]
        if own.get("device") is not None:
            # the rank's own device fills what its collector_kwargs leave out, as on that rank
            for key in RANK_DEVICES:
                kwargs[key] = None
        kwargs.update(own)
        accepted = accepted_kwargs(self.collector_class)
        return kwargs if accepted is None else {k: v for k, v in kwargs.items() if k in accepted}

    def _weight_buffers(self, module: nn.Module | None) -> list[None]:
        return [None] * self.num_workers  # each rank's channel holds its own

    def _weights_sender(
        self, module: nn.Module | TensorDictBase | None
    ) -> RemoteWeightsUpdaterBase:
        return RankWeightsSender(
            self._pool,
            module,
            self._groups,
            self._transport_device,
            self.worker_timeout,
            active=lambda: list(self._active),
            delivered=self._delivered,
        )

    def _on_left_running(self) -> Callable[[list[int]], None]:
        """Ranks the pool could not end go to the launcher, which ends them as only it can."""
        return partial(_hand_to_launcher, self.launcher)

    def _start_workers(self, args: list[tuple], start_method: str) -> list[Channel]:
        """Start the ranks through the launcher and join them (``startup.start_ranks``)."""
        port = self.launcher.default_port if self.tcp_port is None else self.tcp_port
        self._groups, channels = start_ranks(
            self.launcher,
            [payload for payload, *_ in args],
            port=port,
            backend=self.backend,
            start_timeout=self.start_timeout,
            send_timeout=self.worker_timeout,
            device=self._transport_device,
            liveness_timeout=self.liveness_timeout,
        )
        self._closers.extend((self._groups.close, self.launcher.close))
        return channels

    # ------------------------------------------------------------------ one caller at a time
    def iterator(self) -> Iterator[TensorDictBase | None]:
        """Batches as the sync or async gathering yields them; each step holds the collector's
        lock, so calls from another thread (weights, state, seeds while ``start()`` fills the
        buffer) never interleave with it.

        Yields:
            Each batch (``[N, ...]`` stacked with ``sync=True``, one rank's with ``sync=False``),
            each rank's report with ``rank_reports``, or ``None`` with a ``replay_buffer``.
        """
        inner = super().iterator()
        while True:
            with self._lock:
                try:
                    batch = next(inner)
                except StopIteration:
                    return
            yield batch

    def update_policy_weights_(self, *args: Any, **kwargs: Any) -> None:
        """Send weights to every rank (one broadcast) or to workers ``worker_ids``; returns once
        they are sent: each named rank loads them before its next batch."""
        with self._lock:
            super().update_policy_weights_(*args, **kwargs)

    set_seed = _holding_lock("set_seed")
    reset = _holding_lock("reset")
    state_dict = _holding_lock("state_dict")
    load_state_dict = _holding_lock("load_state_dict")

    # ------------------------------------------------------------------ shutdown
    def shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop background filling and every rank (bounded), close the process groups and the
        listening port; safe to call twice.

        Args:
            timeout: seconds a background filling, then the ranks, get to stop before they are
                ended (None: 60 and 10).
            close_env: the ranks close their envs as they stop.
        """
        done_at_exit(self)
        try:
            self._stop_background(timeout, abandon=True)
        finally:
            super().shutdown(timeout, close_env)

    def __repr__(self) -> str:
        return (
            f"DistributedDataCollector(ranks={self.num_workers}, sync={self.sync}, "
            f"backend={self.backend!r}, frames_per_batch={self.frames_per_batch}, "
            f"total_frames={self.total_frames}, frames={self._frames})"
        )


#: the constructor's arguments handed to the local collector machinery as they are
_PASSED_ON = (
    "frames_per_batch",
    "total_frames",
    "device",
    "storing_device",
    "env_device",
    "policy_device",
    "max_frames_per_traj",
    "init_random_frames",
    "reset_at_each_iter",
    "postproc",
    "split_trajs",
    "exploration_type",
    "exploration_mode",
    "replay_buffer",
    "worker_timeout",
    "start_timeout",
    "policy_factory",
    "weight_updater",
    "weight_sync_schemes",
    "weight_recv_schemes",
    "trajs_per_batch",
)


@with_args(
    args="``create_env_fn`` and ``policy``, as ``DistributedDataCollector`` takes them.",
    update_interval="as ``DistributedDataCollector`` takes it; 1 here (when the policy has "
    "weights).",
    kwargs="``DistributedDataCollector``'s keywords but ``sync`` (always True).",
)
class DistributedSyncCollector(DistributedDataCollector):
    """TorchRL's ``DistributedSyncCollector``: ``DistributedDataCollector`` with ``sync=True``
    fixed, and weights sent to every rank before each batch (``update_interval=1``) when the
    policy has weights. Takes ``DistributedDataCollector``'s keywords but ``sync``."""

    def __init__(self, *args: Any, update_interval: int | None = 1, **kwargs: Any) -> None:
        if "sync" in kwargs:
            raise ArgumentValueError(
                "DistributedSyncCollector is always synchronous: drop sync, or use "
                "DistributedDataCollector(sync=...)."
            )
        super().__init__(*args, sync=True, update_interval=update_interval, **kwargs)


def _hand_to_launcher(launcher: Any, workers: list[int]) -> None:
    """Hand the workers a pool left running to ``launcher`` as ranks (worker i is rank i + 1)."""
    launcher.left_running([i + 1 for i in workers])


class GroupGatherer(DistributedDataCollector):
    """A gatherer rank's collector: ``DistributedDataCollector(sync=True)`` over the ranks of
    its group (its launcher: the group's communicator, split by ``MPILauncher(gather=...)``),
    each of whose rounds, stacked ``[ranks, T]``, it sends rank 0 as one batch. Weights, seeds,
    resets and state from rank 0 reach its ranks through it. Rank 0 builds it on each gatherer
    (``Gathered.spec``); a script never does.

    Args:
        create_env_fn: one env constructor per rank of the group.
        policy: the policy, as rank 0 sent it.
        frames_per_batch: the group's frames per round.
        traj_id_offset: the first trajectory id of the group's share (from rank 0).
        traj_id_stride: the step between the group's trajectory ids (from rank 0).
        **kwargs: ``DistributedDataCollector``'s keywords, as rank 0 passes them on.
    """

    def __init__(
        self,
        create_env_fn: list,
        policy: Any = None,
        *,
        frames_per_batch: int,
        traj_id_offset: int = 0,
        traj_id_stride: int = 1,
        **kwargs: Any,
    ) -> None:
        from hpccollect.launchers.mpi import MPILauncher
        from hpccollect.launchers.mpi_gather import gatherer_group

        self._traj_ids = {"traj_id_offset": traj_id_offset, "traj_id_stride": traj_id_stride}
        super().__init__(
            create_env_fn,
            policy,
            frames_per_batch=frames_per_batch,
            sync=True,
            launcher=MPILauncher(comm=gatherer_group()),
            **kwargs,
        )

    def _base_kwargs(self) -> dict[str, Any]:
        return self._traj_ids
