"""``DistributedDataCollector``: rank 0 of a job whose other ranks each run a local collector.

It is the multi-worker collector (``collectors/multi_base.py``) over ``RankChannel``s instead of
pipes: the same protocol, pool, worker loop, seeds, state and weight fan-out. ``sync=True``
gathers like ``MultiSyncDataCollector`` (one batch from every rank, stacked), ``sync=False``
like ``MultiaSyncDataCollector`` (first ready, first served). A launcher plug-in starts the ranks
(``hpccollect/launchers``); this module never knows how.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import gymnasium as gym
import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType
from torch import nn

from hpccollect._checks import check_bool, check_int
from hpccollect.collectors.channels import Channel
from hpccollect.collectors.filling import ThreadFilling
from hpccollect.collectors.multi import MultiaSyncDataCollector, MultiSyncDataCollector
from hpccollect.collectors.multi_base import MultiCollectorBase
from hpccollect.collectors.sync import SyncDataCollector
from hpccollect.collectors.weights import RemoteWeightsUpdaterBase
from hpccollect.collectors.worker import WorkerSpec
from hpccollect.distributed.arguments import (
    accepted_kwargs,
    check_collector_class,
    check_collector_kwargs,
)
from hpccollect.distributed.channels import RankChannel
from hpccollect.distributed.groups import RankGroups, check_backend, open_store
from hpccollect.distributed.rank import RankArgs, ready_key
from hpccollect.distributed.weights import RankWeightsSender
from hpccollect.errors import (
    ArgumentTypeError,
    ArgumentValueError,
    CollectorTimeoutError,
    WorkerError,
)
from hpccollect.launchers import get_launcher

__all__ = ["DistributedDataCollector"]

POLICY_VERSION_KEY = "policy_version"


class DistributedDataCollector(ThreadFilling, MultiCollectorBase):
    """TorchRL's distributed collector: rank 0 (this process) gathers the batches that collector
    ranks 1..N collect, and sends them policy weights.

    ``create_env_fn`` is one constructor per collector rank (a list), or one for a single rank.
    Each rank runs ``collector_class`` (``SyncDataCollector`` or ``"single"``,
    ``MultiSyncDataCollector``/``"sync"``, ``MultiaSyncDataCollector``/``"async"``, or a
    subclass) over ``num_workers_per_collector`` copies of its env: a ``SyncDataCollector`` steps
    them as one vector env (``[k, T]`` batches, as TorchRL's ``ParallelEnv`` gives), a multi
    collector runs them in its own worker processes. ``collector_kwargs`` (a dict, or one per
    rank) goes to those collectors. Trajectory ids are unique across ranks and their workers.

    ``sync=True`` yields one batch from every rank stacked ``[N, ...]``, ``frames_per_batch`` in
    total; ``sync=False`` each rank's batch (``frames_per_batch`` frames) as soon as it is ready.
    Rank 0 builds no env: the batch layout comes from each rank's first message, and batches
    arrive in receive buffers allocated once.

    Weights: ``update_policy_weights_(weights=None, worker_ids=None)`` sends the trainer policy's
    weights (or ``weights``) to every rank, or to workers ``worker_ids`` (worker ``i`` is rank
    ``i + 1``), for their next batch. ``update_after_each_batch`` updates every rank before each
    round (sync) or the rank that just delivered (async); ``max_weight_update_interval=k`` makes
    sure no rank collects more than ``k`` batches without an update. ``policy_versions[i]``
    counts the updates worker ``i`` received; ``track_policy_version=True`` adds a per-frame
    ``"policy_version"`` entry with the version each frame was collected with.

    ``backend``: ``"gloo"`` (default), ``"nccl"``, ``"ucc"`` or ``"mpi"`` where this torch build
    has them. ``launcher``: ``"mp"`` (local processes, rendezvous on loopback) or a
    ``hpccollect.launchers.Launcher``; ``tcp_port``: where rank 0 listens (None: a free port).

    Beyond TorchRL's arguments: ``on_worker_failure`` (``"raise"``, or ``"continue"`` with the
    remaining ranks, the lost ones in ``lost_ranks``), ``worker_timeout`` (s a rank may take for
    one batch or answer), ``start_timeout`` (s for the ranks to start), ``replay_buffer``
    (extended here; the iterator then yields None), ``track_policy_version``, ``num_threads``.
    """

    def __new__(cls, *args: Any, sync: bool = False, **kwargs: Any) -> DistributedDataCollector:
        if cls is DistributedDataCollector:
            cls = _SyncDistributed if check_bool("sync", sync) else _AsyncDistributed
        return super().__new__(cls)

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
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
        launcher: Any = "submitit",
        tcp_port: int | None = None,
        replay_buffer: Any = None,
        track_policy_version: bool = False,
        on_worker_failure: str = "raise",
        worker_timeout: float = 600.0,
        start_timeout: float = 120.0,
        num_threads: int | None = None,
    ) -> None:
        self._closed = True
        self._groups: RankGroups | None = None
        fns = list(create_env_fn) if isinstance(create_env_fn, (list, tuple)) else [create_env_fn]
        self.collector_class = check_collector_class(collector_class)
        self.num_workers_per_collector = check_int(
            "num_workers_per_collector", num_workers_per_collector, minimum=1
        )
        self._collector_kwargs = check_collector_kwargs(
            collector_kwargs, len(fns), self.collector_class
        )
        self.backend = check_backend(backend)
        self.sync = check_bool("sync", sync)
        self.update_after_each_batch = check_bool(
            "update_after_each_batch", update_after_each_batch
        )
        self.max_weight_update_interval = check_int(
            "max_weight_update_interval", max_weight_update_interval
        )
        self.track_policy_version = check_bool("track_policy_version", track_policy_version)
        if on_worker_failure not in ("raise", "continue"):
            raise ArgumentValueError(
                f"on_worker_failure must be 'raise' or 'continue', got {on_worker_failure!r}."
            )
        self.on_worker_failure = on_worker_failure
        if tcp_port is not None:
            check_int("tcp_port", tcp_port, minimum=0)
            if tcp_port > 65535:
                raise ArgumentValueError(f"tcp_port must be a TCP port (0-65535), got {tcp_port}.")
        self.tcp_port = tcp_port
        if slurm_kwargs is not None and not isinstance(slurm_kwargs, dict):
            raise ArgumentTypeError(
                f"slurm_kwargs must be a dict of submitit executor parameters, got "
                f"{type(slurm_kwargs).__name__}."
            )
        self.slurm_kwargs = slurm_kwargs
        inner_processes = issubclass(self.collector_class, MultiCollectorBase)
        self.launcher = get_launcher(launcher, starts_processes=inner_processes)
        if slurm_kwargs and not getattr(self.launcher, "uses_slurm_kwargs", False):
            warnings.warn(
                f"slurm_kwargs are for the submitit launchers; {type(self.launcher).__name__} "
                "ignores them.",
                stacklevel=3,
            )
        self._transport_device = "cpu"
        self._lock = threading.RLock()  # the background thread of start() and the caller
        n = len(fns)
        self.policy_versions = [0] * n
        self._since_update = [0] * n
        self._batch_versions = [0] * n
        if num_threads is None and not self.launcher.shares_host:
            num_threads = torch.get_num_threads()  # the ranks run elsewhere
        super().__init__(
            fns,
            policy,
            frames_per_batch=frames_per_batch,
            total_frames=total_frames,
            device=device,
            storing_device=storing_device,
            env_device=env_device,
            policy_device=policy_device,
            max_frames_per_traj=max_frames_per_traj,
            init_random_frames=init_random_frames,
            reset_at_each_iter=reset_at_each_iter,
            postproc=postproc,
            split_trajs=split_trajs,
            exploration_type=exploration_type,
            exploration_mode=exploration_mode,
            update_at_each_batch=self.update_after_each_batch,
            num_threads=num_threads,
            cat_results="stack" if self.sync else None,
            replay_buffer=replay_buffer,
            worker_timeout=worker_timeout,
            start_timeout=start_timeout,
        )

    # ------------------------------------------------------------------ the ranks
    @property
    def num_collectors(self) -> int:
        """How many collector ranks the job has (lost ones included)."""
        return self.num_workers

    @property
    def lost_ranks(self) -> list[int]:
        """Ranks lost during collection (``on_worker_failure="continue"``)."""
        return [i + 1 for i in self.lost_workers]

    def _worker_spec(
        self, create_env_fn: Any, policy: Any, kwargs: dict, threads: int
    ) -> WorkerSpec:
        k = self.num_workers_per_collector
        env = create_env_fn
        if k > 1 or issubclass(self.collector_class, MultiCollectorBase):
            single = partial(gym.make, env) if isinstance(env, str) and k > 1 else env
            env = [single] * k
        return WorkerSpec(env, policy, kwargs, threads, self.collector_class)

    def _worker_kwargs(self, index: int, frames_per_batch: int, devices: Any, env_kwargs: Any):
        kwargs = super()._worker_kwargs(index, frames_per_batch, devices, env_kwargs)
        kwargs.update(self._collector_kwargs[index])
        accepted = accepted_kwargs(self.collector_class)
        return kwargs if accepted is None else {k: v for k, v in kwargs.items() if k in accepted}

    def _weight_buffers(self, module: nn.Module | None) -> list[None]:
        return [None] * self.num_workers  # each rank's channel holds its own

    def _weights_sender(self, module: nn.Module | None) -> RemoteWeightsUpdaterBase:
        return RankWeightsSender(
            self._pool,
            module,
            self._groups,
            self._transport_device,
            self.worker_timeout,
            active=lambda: list(self._active),
            delivered=self._delivered,
        )

    def _start_workers(self, args: list[tuple], start_method: str) -> list[Channel]:
        """Listen, start the ranks through the launcher, wait until each joined, and open the
        job's process groups; one ``RankChannel`` per rank."""
        n = self.num_workers
        store = open_store(
            self.launcher.address(), self.tcp_port or 0, n + 1, True, self.start_timeout
        )
        processes: list = []
        try:
            ranks = [
                RankArgs(
                    rank=i + 1,
                    world_size=n + 1,
                    host=self.launcher.address(),
                    port=store.port,
                    backend=self.backend,
                    payload=payload,
                    start_timeout=self.start_timeout,
                    device=self._transport_device,
                    send_timeout=self.worker_timeout,
                )
                for i, (payload, *_) in enumerate(args)
            ]
            processes = self.launcher.start(ranks)
            self._await_ranks(store, processes)
            self._groups = self._open_groups(store, processes)
        except BaseException:
            for process in processes:
                if process is not None:
                    process.kill()
                    process.close()
            raise
        self._closers.append(self._groups.close)
        return [
            RankChannel(
                self._groups,
                i + 1,
                process=process,
                device=self._transport_device,
                send_timeout=self.worker_timeout,
            )
            for i, process in enumerate(processes)
        ]

    def _await_ranks(self, store: Any, processes: Sequence[Any]) -> None:
        """Return once every rank is about to join; a rank that ends first is reported at once
        (not after ``start_timeout``)."""
        deadline = time.monotonic() + self.start_timeout
        waiting = set(range(len(processes)))
        while waiting:
            for i in sorted(waiting):
                if store.check([ready_key(i + 1)]):
                    waiting.discard(i)
            self._check_started(processes, waiting)
            if waiting and time.monotonic() > deadline:
                raise CollectorTimeoutError(
                    f"collector ranks {sorted(r + 1 for r in waiting)} did not join within "
                    f"start_timeout={self.start_timeout:g} s; pass a larger start_timeout if they "
                    "start slowly, or check that they can reach "
                    f"{self.launcher.address()}:{store.port}."
                )
            if waiting:
                time.sleep(0.02)

    def _open_groups(self, store: Any, processes: Sequence[Any]) -> RankGroups:
        """Join the process groups with the ranks; a rank that ends meanwhile is reported at
        once instead of leaving this process waiting inside torch.distributed (the joining
        thread is then abandoned: it cannot be interrupted)."""
        result: dict[str, Any] = {}

        def join() -> None:
            try:
                result["groups"] = RankGroups.open(self.backend, store, 0, self.num_workers + 1)
            except BaseException as err:
                result["error"] = err

        thread = threading.Thread(target=join, name="hpccollect-join", daemon=True)
        thread.start()
        deadline = time.monotonic() + self.start_timeout
        while thread.is_alive():
            thread.join(0.05)
            self._check_started(processes)
            if time.monotonic() > deadline:
                raise CollectorTimeoutError(
                    f"the collector ranks did not join the process groups within "
                    f"start_timeout={self.start_timeout:g} s."
                )
        if "error" in result:
            raise result["error"]
        return result["groups"]

    def _check_started(self, processes: Sequence[Any], which: Any = None) -> None:
        """Raise for the first rank (of ``which``) whose process ended during start-up."""
        for i in range(len(processes)) if which is None else which:
            if processes[i] is not None and (how := processes[i].death()) is not None:
                raise WorkerError(
                    f"collector rank {i + 1} (pid {processes[i].pid}) {how} before joining "
                    "the job; its own output above says why.",
                    worker=i,
                    host=processes[i].host,
                    num_workers=len(processes),
                    rank=i + 1,
                )

    # ------------------------------------------------------------------ weights and versions
    def _collect_from(self, index: int) -> None:
        interval = self.max_weight_update_interval
        try:
            if interval > 0 and self._since_update[index] >= interval:
                self.update_policy_weights_(worker_ids=[index])
            super()._collect_from(index)
        except WorkerError as err:
            self._lose(err)
            return
        self._batch_versions[index] = self.policy_versions[index]
        self._since_update[index] += 1

    def _delivered(self, worker_ids: Sequence[int]) -> None:
        for i in worker_ids:
            self.policy_versions[i] += 1
            self._since_update[i] = 0

    def _versioned(self, batch: TensorDictBase, versions: Sequence[int]) -> TensorDictBase:
        """``batch`` with the per-frame policy version (``versions``: one per leading row, or a
        single one) when ``track_policy_version``."""
        if self.track_policy_version:
            v = torch.tensor(versions, dtype=torch.int64)
            v = v.reshape(v.shape + (1,) * (batch.ndim - v.ndim)).expand(batch.shape)
            batch.set(POLICY_VERSION_KEY, v.clone())
        return batch

    # ------------------------------------------------------------------ one caller at a time
    def iterator(self) -> Iterator[TensorDictBase | None]:
        """Batches as the sync or async gathering yields them; each step holds the collector's
        lock, so calls from another thread (weights, state, seeds while ``start()`` fills the
        buffer) never interleave with it."""
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

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        with self._lock:
            return super().set_seed(seed, static_seed)

    def reset(self, reset_idx: Sequence[bool] | None = None) -> None:
        with self._lock:
            super().reset(reset_idx)

    def state_dict(self) -> Any:
        with self._lock:
            return super().state_dict()

    def load_state_dict(self, state_dict: Any, **kwargs: Any) -> None:
        with self._lock:
            super().load_state_dict(state_dict, **kwargs)

    # ------------------------------------------------------------------ shutdown
    def shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop background filling and every rank (bounded), close the process groups and the
        listening port; safe to call twice."""
        bg, self._background = self._background, None
        try:
            if bg is not None:
                bg.stop(timeout if timeout is not None else 60.0)
        finally:
            super().shutdown(timeout, close_env)

    def __repr__(self) -> str:
        return (
            f"DistributedDataCollector(ranks={self.num_workers}, sync={self.sync}, "
            f"backend={self.backend!r}, frames_per_batch={self.frames_per_batch}, "
            f"total_frames={self.total_frames}, frames={self._frames})"
        )


class _SyncDistributed(DistributedDataCollector, MultiSyncDataCollector):
    """``sync=True``: one batch from every rank per iteration, stacked."""

    def _gather(self, frames: list[int]) -> tuple[TensorDictBase, int]:
        batch, real = super()._gather(frames)
        return self._versioned(batch, [self._batch_versions[i] for i in self._active]), real


class _AsyncDistributed(DistributedDataCollector, MultiaSyncDataCollector):
    """``sync=False``: each rank's batch as soon as it is ready."""

    def _next_ready(self) -> tuple[int, TensorDictBase]:
        index, batch = super()._next_ready()
        return index, self._versioned(batch, [self._batch_versions[index]])
