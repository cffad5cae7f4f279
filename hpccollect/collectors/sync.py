"""``SyncDataCollector``: collects in the caller's process, one batch per iteration."""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import InteractionType
from torch import nn

from hpccollect._checks import check_bool, check_int
from hpccollect.collectors.background import BackgroundThread
from hpccollect.collectors.base import DataCollectorBase, Interruptor
from hpccollect.collectors.filling import ThreadFilling
from hpccollect.collectors.loops.policy_version import TracksPolicyVersion, make_stamp
from hpccollect.collectors.loops.rollout import StepLoop
from hpccollect.collectors.loops.td_policy import wrap_env_policy
from hpccollect.collectors.loops.td_rollout import TensorDictLoop
from hpccollect.collectors.loops.trajectories import TrajIdPool, split_trajectories
from hpccollect.collectors.profiling import Profiling
from hpccollect.collectors.sync_state import SyncState
from hpccollect.collectors.torchrl_api.execution import ByExecution
from hpccollect.collectors.torchrl_api.keyword_docs import SINGLE, with_args
from hpccollect.collectors.torchrl_api.options import CollectorArgs
from hpccollect.collectors.torchrl_api.policy_options import (
    check_cudagraph_device,
    factories,
    module_device,
    policy_input_device,
    wrap_for_speed,
)
from hpccollect.collectors.torchrl_api.torchrl_keywords import check_weight_schemes
from hpccollect.collectors.weights import (
    LocalWeightsUpdaterBase,
    PolicyWeightsCopier,
    RemoteWeightsUpdaterBase,
    WeightUpdaterBase,
    built_updater,
)
from hpccollect.envs import envbase
from hpccollect.envs.factory import make_env
from hpccollect.envs.policy_transforms import fill_policy_specs, with_policy_transforms
from hpccollect.errors import ArgumentTypeError, ArgumentValueError
from hpccollect.policy import (
    WrappedPolicy,
    wrap_policy,
)

__all__ = ["SyncDataCollector"]


@with_args(**SINGLE)
class SyncDataCollector(
    TracksPolicyVersion,
    Profiling,
    ThreadFilling,
    SyncState,
    DataCollectorBase,
    metaclass=ByExecution,
):
    """Generic data collector: steps an env (or vector env) with a policy in this process.

    Batches are ``[T]`` named ``["time"]`` for one env and ``[N, T]`` named ``[None, "time"]``
    for N envs, with ``frames_per_batch`` frames in all (rounded up to a multiple of N). The env
    is a gymnasium one (through ``GymEnv``) or a TorchRL env (``EnvBase``), stepped as TorchRL's
    ``Collector`` steps it. Every keyword of TorchRL 0.14.1's ``Collector`` is taken, with its
    meaning (Args, below; "Coming from TorchRL", docs/torchrl.md, lists the differences).

    Attributes as TorchRL sets them: ``storing_device``, ``policy_device``, ``env_device`` (the
    env's own device when not given; None for a ``GymEnv`` made without one),
    ``max_frames_per_traj`` (0 when not given), ``reset_at_each_iter``.

    Called as ``Collector(..., backend=..., num_collectors=..., sync=...)``, this class builds
    the collector ``backend`` names, as TorchRL's ``Collector`` does.

    Example:
        Four CartPoles stepped as one vector env by a policy of one linear layer::

            policy = TensorDictModule(nn.Linear(4, 2), ["observation"], ["action"])
            collector = SyncDataCollector(
                [lambda: gym.make("CartPole-v1")] * 4, policy,
                frames_per_batch=400, total_frames=4000,
            )
            for batch in collector:  # TensorDict [4, 100] named [None, "time"]
                print(batch["next", "reward"].sum())
            collector.shutdown()
    """

    _dispatches = True  # calling this class itself (not a subclass) honours ``backend``

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        policy_factory: Callable[[], Any] | None = None,
        backend: str | None = None,
        backend_options: dict | None = None,
        num_collectors: int | None = None,
        sync: bool | None = None,
        frames_per_batch: int,
        total_frames: int = -1,
        device: Any = None,
        storing_device: Any = None,
        policy_device: Any = None,
        env_device: Any = None,
        create_env_kwargs: dict | None = None,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = None,
        reset_at_each_iter: bool = False,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        split_trajs: bool | None = None,
        exploration_type: InteractionType | str = InteractionType.RANDOM,
        exploration_mode: str | None = None,
        return_same_td: bool = False,
        reset_when_done: bool = True,
        interruptor: Interruptor | None = None,
        set_truncated: bool = False,
        use_buffers: bool | None = None,
        trust_policy: bool | None = None,
        track_traj_ids: bool = True,
        replay_buffer: Any = None,
        local_weight_updater: LocalWeightsUpdaterBase | None = None,
        remote_weight_updater: RemoteWeightsUpdaterBase | None = None,
        weight_updater: WeightUpdaterBase | None = None,
        categorical_action_encoding: bool = False,
        traj_id_offset: int = 0,
        traj_id_stride: int = 1,
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
        self._closed = True  # until construction succeeds, shutdown() has nothing to do
        self._background: BackgroundThread | None = None
        opts = self._check_arguments(arguments)
        factory = factories(policy, policy_factory, 1)
        pool = TrajIdPool(opts.traj_id_offset, opts.traj_id_stride)
        self.env = make_env(
            create_env_fn,
            create_env_kwargs,
            categorical_action_encoding=categorical_action_encoding,
        )
        try:
            if envbase.is_torchrl_env(self.env):
                self.env = self._prepare_torchrl_env(self.env)
            if factory is not None:
                policy = factory[0]()  # built here, once the env exists (as in TorchRL)
            fill_policy_specs(self.env, policy)
            self.env = with_policy_transforms(
                self.env, policy, opts.auto_register_policy_transforms, type(self).__name__
            )
            self._setup(policy, pool, replay_buffer, interruptor)
        except BaseException:
            # the error that stopped the set-up is the one to see, not the close's (an env
            # that never started may refuse to close)
            with contextlib.suppress(Exception):
                self.env.close()
            raise
        self._set_weight_updaters(
            local_weight_updater
            or (  # a weight_updater given takes the copier's place
                PolicyWeightsCopier(self._wrapped.weights_module, self._source)
                if weight_updater is None
                else None
            ),
            remote_weight_updater,
            built_updater(weight_updater, self._wrapped.weights_module),
        )
        self._closed = False

    def _check_arguments(self, a: dict[str, Any]) -> CollectorArgs:
        """Check the constructor's arguments (``a``) and keep what they decide."""
        check_weight_schemes(
            type(self).__name__, a["weight_sync_schemes"], a["weight_recv_schemes"], leaf=True
        )
        worker_idx = a["worker_idx"]
        self.worker_idx = None if worker_idx is None else check_int("worker_idx", worker_idx)
        self.options = opts = CollectorArgs.check(a, a["policy"])
        self.devices = opts.devices()
        self.track_traj_ids = check_bool("track_traj_ids", a["track_traj_ids"])
        self._versions = make_stamp(opts.track_policy_version)
        #: TorchRL's attributes, settable: called before and after each batch
        self.pre_collect_hook = opts.pre_collect_hook
        self.post_collect_hook = opts.post_collect_hook
        self.trajs_per_batch, self.trajs_per_write = opts.trajs_per_batch, opts.trajs_per_write
        self.traj_format = opts.traj_format
        for name in ("split_trajs", "trajs_per_batch"):
            if getattr(opts, name) and not self.track_traj_ids:
                raise ArgumentValueError(
                    f"{name}={getattr(opts, name)!r} needs the trajectory ids: drop "
                    "track_traj_ids=False (TorchRL refuses this combination too)."
                )
        self._use_buffers = a["use_buffers"]
        self.trust_policy = opts.trust_policy
        most = a["max_frames_per_traj"]
        self.max_frames_per_traj = 0 if most is None else int(most)
        self.reset_at_each_iter = opts.reset_at_each_iter
        interruptor = a["interruptor"]
        if interruptor is not None and not callable(
            getattr(interruptor, "collection_stopped", None)
        ):
            raise ArgumentTypeError(
                "interruptor must have a collection_stopped() method "
                f"(hpccollect.collectors.Interruptor), got {type(interruptor).__name__}."
            )
        return opts

    def _prepare_torchrl_env(self, env: Any) -> Any:
        """A TorchRL env as TorchRL's collector prepares it: moved to ``env_device``, and with a
        ``StepCounter`` appended for ``max_frames_per_traj``."""
        if self.devices.env is not None:
            env = env.to(self.devices.env)
        if self.options.max_frames_per_traj is not None:
            env = envbase.add_step_counter(env, self.options.max_frames_per_traj)
        return env

    def _setup(self, policy: Any, pool: TrajIdPool, replay_buffer: Any, interruptor: Any) -> None:
        opts = self.options
        torchrl_env = envbase.is_torchrl_env(self.env)
        self.n_env = envbase.num_envs(self.env) if torchrl_env else self.env.num_envs
        self.storing_device = self.devices.storing
        self.policy_device = self.devices.policy
        self.env_device = self.devices.env or self.env.device
        self._traj_src: TensorDictBase | None = None
        self._traj_view: TensorDictBase | None = None
        self._wrapped, self._source = self._place_policy(policy)
        self.policy = self._wrapped.module
        where = policy_input_device(self.devices.policy, self.env_device, torchrl_env)
        check_cudagraph_device(opts.cudagraph_policy, where)
        if opts.compile_policy is not None or opts.cudagraph_policy is not None:
            fast = wrap_for_speed(
                self._wrapped.module,
                opts.compile_policy,
                opts.cudagraph_policy,
                where if where.type == "cuda" else self.devices.policy,
            )
            self._wrapped = WrappedPolicy(fast, self._wrapped.weights_module, None)
        loop = TensorDictLoop if torchrl_env else StepLoop
        self._loop = loop(self.env, self._wrapped, opts, self.devices, pool)
        self._steps_per_batch = -(-opts.frames_per_batch // self.n_env)
        if opts.frames_per_batch % self.n_env:
            warnings.warn(
                f"frames_per_batch ({opts.frames_per_batch}) is not divisible by the number of "
                f"envs ({self.n_env}); each batch will hold "
                f"{self._steps_per_batch * self.n_env} frames.",
                stacklevel=3,
            )
        self.frames_per_batch = opts.frames_per_batch
        self.requested_frames_per_batch = self._steps_per_batch * self.n_env
        self.total_frames = opts.total_frames
        self.init_random_frames = opts.init_random_frames
        self.replay_buffer = replay_buffer
        self.interruptor = interruptor
        self.postproc = opts.postproc
        self.split_trajs = opts.split_trajs
        self.exploration_type = opts.exploration_type
        self._frames = 0
        self._iter = -1  # the last batch's index (TorchRL's)

    @property
    def _wrapped_policy(self) -> Any:
        """The policy as this collector calls it (TorchRL's attribute): the given module, or
        the ``TensorDictModule`` a plain ``nn.Module`` was wrapped in."""
        return self._wrapped.module

    def _place_policy(self, policy: Any) -> tuple[WrappedPolicy, nn.Module | None]:
        """Wrap the policy; copy it to ``policy_device`` if it lives elsewhere (TorchRL does too)."""
        wrapped = self._wrap(policy)
        target = self.devices.policy
        module = wrapped.weights_module
        current = module_device(module)
        if target is None or current is None or current == target:
            return wrapped, None
        return self._wrap(copy.deepcopy(policy).to(target)), module

    def _wrap(self, policy: Any) -> WrappedPolicy:
        if envbase.is_torchrl_env(self.env):
            return wrap_env_policy(policy, self.env, self.trust_policy)
        keys, spec = self.env.observation_keys, self.env.action_spec
        return wrap_policy(policy, keys, spec, trust_policy=self.trust_policy)

    # ------------------------------------------------------------------ iteration
    def _should_stop(self) -> bool:
        bg = self._background
        if bg is not None and bg.stop_requested():
            return True
        return self.interruptor is not None and self.interruptor.collection_stopped()

    def rollout(self) -> TensorDictBase:
        """Collect one batch (no ``split_trajs``/``postproc``); frames are not counted.

        Returns:
            The batch, ``[T]`` for one env or ``[N, T]`` for N envs.
        """
        if self.pre_collect_hook is not None:
            self.pre_collect_hook()
        random = self._frames < self.init_random_frames
        versions = self._versions
        if versions is not None and self.reset_at_each_iter:
            versions.envs_reset()
        batch = self._loop.collect(
            self._steps_per_batch, random=random, should_stop=self._should_stop
        )
        if versions is not None:
            versions.stamp(batch)
        return batch if self.track_traj_ids else self._without_traj_ids(batch)

    def _without_traj_ids(self, batch: TensorDictBase) -> TensorDictBase:
        """The batch less ``collector`` (``track_traj_ids=False``); with ``return_same_td`` the
        same view of the same buffers every time."""
        if batch is self._traj_src:
            return self._traj_view  # type: ignore[return-value]
        view = batch.exclude("collector")
        if self.options.return_same_td:
            self._traj_src, self._traj_view = batch, view
        return view

    def _collect_counted(self) -> TensorDictBase:
        """One batch, counted in ``frames`` (what a worker process runs per command)."""
        batch = self.rollout()
        self._frames += batch.numel()
        self._iter += 1
        if self.post_collect_hook is not None:
            self.post_collect_hook(batch)
        return batch

    def _weights_for_workers(self) -> TensorDictBase | None:
        """A shared-memory copy of the policy's weights (None without any), for the process that
        sends this one weights."""
        module = self._wrapped.weights_module
        if module is None:
            return None
        weights = TensorDict.from_module(module).data
        return None if weights.is_empty() else weights.clone().share_memory_()

    def _run_on_weights(self, weights: TensorDictBase) -> None:
        """Make the policy's parameters ``weights`` themselves (shared memory that another
        process's policy also runs on): changes made there are seen at the next step."""
        module = self._wrapped.weights_module
        if module is not None:
            weights.to_module(module)

    def fake_tensordict(self) -> TensorDictBase:
        """A zeroed batch laid out as the ones this collector yields (to allocate storage before
        collecting).

        Returns:
            A TensorDict with the keys, shape, names and dtypes of a batch, every value zero.
        """
        batch = self._loop.layout(self._steps_per_batch)
        return batch if self.track_traj_ids else batch.exclude("collector")

    def _shared_batch(self) -> TensorDictBase | None:
        """The output buffers in shared memory (``return_same_td`` collectors in workers); None
        when the batches fit no fixed buffers (see ``_batch_shell``)."""
        return self._loop.shared_batch(self._steps_per_batch)

    def _batch_shell(self) -> TensorDictBase:
        """An empty TensorDict of a batch's shape, for batches that travel by value."""
        return TensorDict({}, batch_size=[*self._loop.batch_size, self._steps_per_batch])

    def _use_batch_buffers(self, batch: TensorDictBase) -> None:
        """Write later batches into ``batch`` (laid out as ``_shared_batch()``), e.g. a rank's
        send buffer."""
        self._loop.use_buffers(batch, self._steps_per_batch)

    def iterator(self) -> Iterator[TensorDictBase | None]:
        """Yield batches until ``total_frames`` (forever when -1); see ``DataCollectorBase``.

        Yields:
            Each batch, or ``None`` with a ``replay_buffer``.
        """
        while self.total_frames < 0 or self._frames < self.total_frames:
            if self._closed:
                return
            batch = self.rollout()
            self._frames += batch.numel()
            self._iter += 1
            if batch.shape[-1] < self._steps_per_batch and self._interrupted():
                batch = self._padded(batch)
            if self.split_trajs:
                batch = split_trajectories(batch)
            if self.postproc is not None:
                batch = self.postproc(batch)
            if self.post_collect_hook is not None:
                self.post_collect_hook(batch)
            yield self._sink(batch)
            if self._background is not None and self._background.stop_requested():
                return

    def _interrupted(self) -> bool:
        return self.interruptor is not None and self.interruptor.collection_stopped()

    def _padded(self, batch: TensorDictBase) -> TensorDictBase:
        """A batch cut short by the ``interruptor``, at full length as TorchRL gives it: the
        steps not taken are zeros with trajectory id -1 (only its real frames are counted)."""
        rest = self.fake_tensordict()[..., batch.shape[-1] :]
        if ("collector", "traj_ids") in rest.keys(True, True):
            rest.set(("collector", "traj_ids"), torch.full(rest.shape, -1, dtype=torch.int64))
        out = torch.cat([batch, rest.to(batch.device)], -1)
        out.names = batch.names
        return out

    # ------------------------------------------------------------------ shutdown
    def shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop background collection and close the env; safe to call twice.

        Args:
            timeout: seconds to wait for a background collection thread to stop (None: 60).
            close_env: close the env (False keeps it, for the caller to reuse).
        """
        bg, self._background = getattr(self, "_background", None), None
        try:
            if bg is not None:
                bg.stop(timeout if timeout is not None else 60.0)
        finally:
            if not getattr(self, "_closed", True):
                self._closed = True
                if close_env:
                    self.env.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(env={self.env!r}, frames_per_batch={self.frames_per_batch}, "
            f"total_frames={self.total_frames}, frames={getattr(self, '_frames', 0)})"
        )
