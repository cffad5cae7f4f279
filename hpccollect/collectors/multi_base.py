"""What the multi-process collectors share: worker processes each running a SyncDataCollector
into shared-memory batch buffers, weights, seeds, state, background filling and shutdown.

Subclasses (``multi.py``) only decide how a round of batches is gathered (``iterator()``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType
from torch import nn

from hpccollect._checks import check_bool, check_callable, check_int, check_seconds
from hpccollect.collectors.base import DataCollectorBase, SharedInterruptor
from hpccollect.collectors.filling import WorkerFilling, inherited_buffer
from hpccollect.collectors.torchrl_api.options import (
    CollectorArgs,
    Devices,
    check_cat_results,
    check_preemptive_threshold,
    env_fns,
    per_worker,
)
from hpccollect.collectors.torchrl_api.policy_options import (
    check_cudagraph_device,
    factories,
)
from hpccollect.collectors.torchrl_api.torchrl_keywords import check_weight_schemes
from hpccollect.collectors.weights import RemoteWeightsUpdaterBase, built_updater
from hpccollect.collectors.workers.batches import WorkerBatches
from hpccollect.collectors.workers.calls import WorkerCalls
from hpccollect.collectors.workers.fork_server import JobForkServer
from hpccollect.collectors.workers.gathering import Gathering
from hpccollect.collectors.workers.pool import WorkerPool, remote_exception
from hpccollect.collectors.workers.processes import start_local_workers
from hpccollect.collectors.workers.remote import Call
from hpccollect.collectors.workers.setup import (
    fake_worker_batch,
    per_worker_frames,
    shares_state,
    worker_class,
)
from hpccollect.collectors.workers.state import WorkerState
from hpccollect.collectors.workers.weights import WorkerWeights
from hpccollect.collectors.workers.worker import WorkerSpec, worker_main
from hpccollect.protocol import Command, RemoteError, Reply
from hpccollect.transport.base import Channel

__all__ = ["MultiCollectorBase"]


class MultiCollectorBase(
    WorkerCalls, WorkerState, WorkerBatches, WorkerWeights, WorkerFilling, DataCollectorBase
):
    """What the multi-process collectors share; subclasses define ``iterator()``. Their
    keywords, TorchRL's and hpccollect's, are described on each public collector (``Args:``,
    from ``torchrl_api/keyword_docs.py``)."""

    #: how the workers' batches become the batches yielded (see ``gathering.py``)
    gathering: type[Gathering] = Gathering
    #: what a failed worker does to collection: "raise", or "continue" without it
    on_worker_failure = "raise"
    #: async: a worker goes on to its next batch only once its last one was yielded and the
    #: caller asked for the next (TorchRL's distributed collector: weights sent meanwhile,
    #: by a call or by the weight schedule, reach that batch), not as soon as it arrived
    #: (TorchRL's multi-process and RPC collectors: its next batch overlaps the caller's work)
    _release_after_yield = False
    #: whether workers are local processes, which a TorchRL env or EnvCreator reaches as a
    #: process argument (its shared-memory state and locks stay shared, as in TorchRL)
    _env_by_inheritance = True
    #: whether workers keep their batches and send reports of them (``reports.py``)
    _reports = False
    #: whether a policy may come with ``policy_factory`` (TorchRL's distributed collectors:
    #: the workers build theirs, the policy here is where their weights come from)
    _policy_with_factory = False

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        num_workers: int | None = None,
        policy_factory: Any = None,
        frames_per_batch: int,
        total_frames: int = -1,
        device: Any = None,
        storing_device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        create_env_kwargs: dict | Sequence[dict] | None = None,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = None,
        reset_at_each_iter: bool = False,
        postproc: Any = None,
        split_trajs: bool | None = None,
        exploration_type: InteractionType | str = InteractionType.RANDOM,
        exploration_mode: str | None = None,
        reset_when_done: bool = True,
        update_at_each_batch: bool = False,
        preemptive_threshold: float | None = None,
        num_threads: int | None = None,
        cat_results: str | int | None = None,
        set_truncated: bool = False,
        use_buffers: bool | None = None,
        trust_policy: bool | None = None,
        replay_buffer: Any = None,
        num_sub_threads: int = 1,
        mp_start_method: str = "spawn",
        worker_timeout: float = 600.0,
        start_timeout: float = 120.0,
        categorical_action_encoding: bool = False,
        local_weight_updater: Any = None,
        remote_weight_updater: RemoteWeightsUpdaterBase | None = None,
        weight_updater: Any = None,
        traj_id_offset: int = 0,
        traj_id_stride: int = 1,
        collector_class: type | None = None,
        init_fn: Callable[[], None] | None = None,
        extend_buffer: bool = True,
        compile_policy: bool | dict | None = None,
        cudagraph_policy: bool | dict | None = None,
        no_cuda_sync: bool = False,
        weight_sync_schemes: dict | None = None,
        weight_recv_schemes: dict | None = None,
        track_policy_version: bool = False,
        worker_idx: int | None = None,
        trajs_per_batch: int | None = None,
        trajs_per_write: int | None = None,
        traj_format: str | None = None,
        auto_register_policy_transforms: bool | None = None,
        pre_collect_hook: Callable[[], None] | None = None,
        post_collect_hook: Callable[[TensorDictBase], None] | None = None,
        compact_obs: bool = False,
    ) -> None:
        arguments = locals()
        self._closed = True
        self._pool: WorkerPool | None = None
        self._threads_set: tuple[int, int] | None = None
        self._gathering = self.gathering(self)
        fns, devices, env_kwargs = self._check_arguments(arguments)
        template = self._weights_template(policy)
        self._live_weights = self._shares_live_weights(template)
        self._weights = self._weight_buffers(template)
        threads = check_int("num_sub_threads", num_sub_threads, minimum=1)
        args = self._worker_args(fns, devices, env_kwargs, template, threads)
        #: workers still collecting (all of them unless some were lost, see ``_lose``)
        self._active = list(range(self.num_workers))
        self.lost_workers: list[int] = []
        #: called after the pool's shutdown (also at garbage collection)
        self._closers: list = []
        self._start(args, arguments)
        try:
            weight_updater = built_updater(weight_updater, policy)
            if remote_weight_updater is None and not isinstance(
                weight_updater, RemoteWeightsUpdaterBase
            ):  # a remote weight_updater takes the default sender's place
                remote_weight_updater = self._weights_sender(template)
            self._set_weight_updaters(local_weight_updater, remote_weight_updater, weight_updater)
        except BaseException:
            self.shutdown()
            raise
        self._gathering.check()

    def _check_arguments(self, a: dict[str, Any]) -> tuple[list, list[Devices], list]:
        """Check the constructor's arguments (``a``) and keep what they decide; the workers'
        env constructors, devices and env kwargs."""
        name = type(self).__name__
        self._weight_sync_schemes = dict(a["weight_sync_schemes"] or {})  # as given, by model
        self._sends_weights = check_weight_schemes(
            name, a["weight_sync_schemes"], a["weight_recv_schemes"], leaf=False
        )
        fns = env_fns(a["create_env_fn"], a["num_workers"])
        self.num_workers = n = len(fns)
        with_policy = self._policy_with_factory or a["weight_sync_schemes"] is not None
        self._factories = factories(a["policy"], a["policy_factory"], n, with_policy=with_policy)
        #: the workers build their policy and have no weights sent but those given by a call
        self._no_weights_here = self._factories is not None and not (
            self._policy_with_factory and isinstance(a["policy"], nn.Module)
        )
        self._worker_class = worker_class(a["collector_class"])
        self._init_fn = check_callable("init_fn", a["init_fn"])
        worker_idx = a["worker_idx"]
        self.worker_idx = None if worker_idx is None else check_int("worker_idx", worker_idx)
        gathering = self._gathering
        self.cat_results = check_cat_results(a["cat_results"], name, gathering.concatenates)
        self.preemptive_threshold = check_preemptive_threshold(a["preemptive_threshold"])
        self.interruptor = (
            SharedInterruptor() if gathering.preempts and self.preemptive_threshold < 1.0 else None
        )
        if a["num_threads"] is not None:
            a["num_threads"] = check_int("num_threads", a["num_threads"], minimum=1)
        self._use_buffers = a["use_buffers"]
        #: TorchRL's per-worker ``frames_per_batch`` (a list), or None
        self._worker_fpb = per_worker_frames(a["frames_per_batch"], n)
        if self._worker_fpb is not None:
            a["frames_per_batch"] = sum(self._worker_fpb)
        self.options = opts = CollectorArgs.check(a, a["policy"])
        self.trajs_per_batch, self.trajs_per_write = opts.trajs_per_batch, opts.trajs_per_write
        self.traj_format = opts.traj_format
        self.trust_policy = opts.trust_policy
        devices = [opts.devices(i, n) for i in range(n)]
        for d in devices:  # here, before any worker starts (without policy_device, each
            # worker checks where its env gives the policy's input)
            check_cudagraph_device(opts.cudagraph_policy, d.policy)
        env_kwargs = [
            per_worker("create_env_kwargs", a["create_env_kwargs"], i, n) for i in range(n)
        ]
        self.worker_timeout = check_seconds("worker_timeout", a["worker_timeout"])
        self.start_timeout = check_seconds("start_timeout", a["start_timeout"])
        self.frames_per_batch = opts.frames_per_batch
        self.total_frames = opts.total_frames
        self.replay_buffer = a["replay_buffer"]
        self.update_at_each_batch = check_bool("update_at_each_batch", a["update_at_each_batch"])
        self.postproc, self.split_trajs = opts.postproc, opts.split_trajs
        self.storing_device = devices[0].storing
        self._policy_devices = [d.policy for d in devices]
        self.policy = a["policy"]
        self._frames, self._iter = 0, -1  # ``_iter``: the last batch's index (TorchRL's)
        self._in_flight: set[int] = set()
        self._shared: TensorDictBase | None = None
        self._filling = False
        return fns, devices, env_kwargs

    def _weights_template(self, policy: Any) -> nn.Module | None:
        """The module whose weights the workers' buffers are laid out as: the policy's; with
        ``policy_factory``, local workers make their buffers from the policy they build, ranks
        need one laid out here first: the policy's where it comes too (the weights' source),
        else that of a policy made here once (as TorchRL's distributed collector does), never
        sent."""
        if not self._no_weights_here:
            template = policy
        else:
            template = None if self._env_by_inheritance else self._factories[0]()
        if not isinstance(template, nn.Module) or TensorDict.from_module(template).is_empty():
            return None
        return template

    def _worker_args(
        self, fns: list, devices: list[Devices], env_kwargs: list, template: Any, threads: int
    ) -> list[list]:
        """What each worker process is started with."""
        args = []
        for i in range(self.num_workers):
            fpb = self._gathering.worker_frames_per_batch(i)
            kwargs = self._worker_kwargs(i, fpb, devices[i], env_kwargs[i])
            if self._factories is not None:
                kwargs["policy_factory"] = self._factories[i]
            spec = self._worker_spec(
                i, fns[i], None if self._factories else self.policy, kwargs, threads
            )
            spec.init_fn = self._init_fn
            spec.weights_template = template if self._factories is not None else None
            spec.live_weights = self._live_weights
            env = None
            if self._env_by_inheritance and shares_state(spec.create_env_fn):
                env, spec.create_env_fn = spec.create_env_fn, None
            args.append([spec.dumps(), self._weights[i], self.interruptor, env])
        if self._env_by_inheritance:
            whole = self.options.trajs_per_batch is not None
            self._inherited = inherited_buffer(
                self.replay_buffer,
                lambda: fake_worker_batch(args[0], whole),
                policy_in_workers_only=self._factories is not None,
            )
            for arg in args:
                arg.append(self._inherited)
        return args

    def _start(self, args: list[list], a: dict[str, Any]) -> None:
        """Start the workers and take the layout each announces."""
        self._set_threads(a["num_threads"])
        try:
            channels = self._start_workers(args, a["mp_start_method"])
            self._pool = WorkerPool(channels, self._on_left_running())
        except BaseException:
            self._restore_threads()
            raise
        self._finalizer = weakref.finalize(self, _close, self._pool, self._closers)
        self._closed = False
        try:
            layouts = [
                self._pool.recv(i, Reply.LAYOUT, self.start_timeout)
                for i in range(self.num_workers)
            ]
        except BaseException:
            self.shutdown()
            raise
        self._layouts: list[TensorDictBase] = [layout.batch for layout in layouts]
        #: each worker's frames per batch, and the frames it was last asked for
        self._batch_frames = [layout.frames or layout.batch.numel() for layout in layouts]
        self._asked: dict[int, int] = {}
        if self._factories is not None and self._env_by_inheritance:
            self._weights = [layout.weights for layout in layouts]
        #: workers whose batches travel by value (``Layout.by_value``), and their last batch
        self._by_value = {i for i, layout in enumerate(layouts) if layout.by_value}
        self._received: dict[int, TensorDictBase] = {}

    def _worker_spec(
        self, index: int, create_env_fn: Any, policy: Any, kwargs: dict, threads: int
    ) -> WorkerSpec:
        """What worker ``index`` builds."""
        return WorkerSpec(create_env_fn, policy, kwargs, threads, self._worker_class)

    def _worker_kwargs(
        self, index: int, frames_per_batch: int, devices: Devices, env_kwargs: Any
    ) -> dict[str, Any]:
        """What worker ``index``'s ``SyncDataCollector`` is built with: its share of each batch
        and of the trajectory ids, written into shared buffers; the rest stays here."""
        opts, n = self.options, self.num_workers
        return opts.kwargs(
            frames_per_batch=frames_per_batch,
            total_frames=-1,
            device=None,
            storing_device=torch.device("cpu"),  # the shared buffers
            env_device=devices.env,
            policy_device=devices.policy,
            create_env_kwargs=env_kwargs,
            init_random_frames=-(-opts.init_random_frames // n),
            postproc=None,
            split_trajs=False,
            return_same_td=True,
            replay_buffer=None,
            local_weight_updater=None,
            remote_weight_updater=None,
            weight_updater=None,
            traj_id_offset=opts.traj_id_offset + index * opts.traj_id_stride,
            traj_id_stride=opts.traj_id_stride * n,
        ) | {"worker_idx": index}

    def _on_left_running(self) -> Callable[[list[int]], None] | None:
        """What the pool calls at shutdown with the workers it could not end (``WorkerPool``);
        None: a local worker always ends (``Channel.kill``). It must not hold the collector,
        which the pool outlives until the collector's finaliser has run."""
        return None

    def _start_workers(self, args: list[tuple], start_method: str) -> list[Channel]:
        """Start the workers, ``worker_main(i, conn, *args[i])`` each; one channel per worker.

        ``"forkserver"`` forks them from a server of this collector's own, which imported
        torch and hpccollect once and ends at ``shutdown`` (Python's own fork server would
        outlive the collector, with the environment of whichever collector started it)."""
        server = None
        if start_method == "forkserver":
            server = JobForkServer()
            server.start()
            self._closers.append(server.close)
        try:
            # not daemonic, as in TorchRL: a worker's env may start processes of its own (a
            # TorchRL ParallelEnv); the pool still ends the workers at shutdown and at exit
            return start_local_workers(
                worker_main,
                args,
                start_method,
                name=type(self).__name__,
                daemon=False,
                fork_server=server,
            )
        except BaseException:
            if server is not None:
                server.close()
            raise

    def _call_workers(self, calls: dict[int, Call]) -> list[Any]:
        with self.pause():
            for i, call in calls.items():
                self._pool.send(i, Command.CALL, call.dumps())
            results = [self._pool.recv(i, Reply.VALUE, self.worker_timeout) for i in calls]
        for i, result in zip(calls, results, strict=True):
            if isinstance(result, RemoteError):
                raise remote_exception(result, i, self.num_workers)
        return results

    def _set_threads(self, num_threads: int | None) -> None:
        """Set the calling process's torch threads (TorchRL's ``num_threads``)."""
        before = torch.get_num_threads()
        wanted = num_threads if num_threads is not None else max(1, before - self.num_workers)
        self.num_threads = wanted
        if wanted != before:
            torch.set_num_threads(wanted)
            self._threads_set = (before, wanted)

    def _restore_threads(self) -> None:
        if self._threads_set is not None:
            before, wanted = self._threads_set
            self._threads_set = None
            if torch.get_num_threads() == wanted:
                torch.set_num_threads(before)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the workers (for monitoring; they are gone after ``shutdown()``)."""
        return [c.pid for c in self._pool.channels] if self._pool is not None else []

    def shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop every worker and release their processes and shared memory; safe to call twice."""
        if getattr(self, "_closed", True) or self._pool is None:
            return
        self._closed = True
        self._finalizer.detach()
        try:
            _close(self._pool, self._closers, timeout if timeout is not None else 10.0, close_env)
        finally:
            self._restore_threads()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_workers={self.num_workers}, "
            f"frames_per_batch={self.frames_per_batch}, total_frames={self.total_frames}, "
            f"frames={self._frames})"
        )


def _close(pool: WorkerPool, closers: list, timeout: float = 10.0, close_env: bool = True) -> None:
    try:
        pool.shutdown(timeout, close_env)
    finally:
        for close in closers:
            close()
