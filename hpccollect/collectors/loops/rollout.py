"""The step loop: env and policy run for ``T`` steps, writing straight into ``[N, T]`` buffers.

No processes and no threads here. Per step the loop writes numpy rows into preallocated buffers
(torch tensors viewed as numpy arrays) and calls the policy once on the whole env batch; the
output TensorDict is assembled once per batch, in TorchRL's layout.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import set_interaction_type

from hpccollect.collectors.loops.policy_version import version_keys
from hpccollect.collectors.loops.step_policy import StepPolicy, _declared_inputs
from hpccollect.collectors.loops.trajectories import TrajIdPool
from hpccollect.collectors.torchrl_api.options import CollectorArgs, Devices
from hpccollect.envs.gym import DONE_KEYS, GymEnv, Leaves, env_seeds
from hpccollect.envs.spaces import Key
from hpccollect.errors import ArgumentValueError, EnvError, PolicyError, with_builtin
from hpccollect.policy import RandomPolicy, WrappedPolicy

__all__ = ["StepLoop"]

TRAJ_KEY: Key = ("collector", "traj_ids")
_NEXT = "next"


_SCALAR_KEYS = frozenset(
    [(n,) for n in DONE_KEYS]
    + [(_NEXT, n) for n in DONE_KEYS]
    + [("step_count",), (_NEXT, "step_count"), (_NEXT, "reward")]
)


class StepLoop(StepPolicy):
    """Runs one env (or vector env) with one policy, a batch at a time.

    Args:
        env: the TensorDict adapter over the gymnasium env.
        policy: the wrapped policy.
        options: batch-shaping options.
        devices: env/policy/storing devices.
        traj_pool: where new trajectory ids come from.
    """

    def __init__(
        self,
        env: GymEnv,
        policy: WrappedPolicy,
        options: CollectorArgs,
        devices: Devices,
        traj_pool: TrajIdPool,
    ) -> None:
        self.env, self.policy, self.options, self.devices = env, policy, options, devices
        self.pool = traj_pool
        n = env.num_envs
        self._write = slice(0, 1) if not env.is_vector else slice(None)
        self._read = 0 if not env.is_vector else slice(None)
        self._flag_shape = (*env.batch_size, 1)
        self._false = torch.zeros(self._flag_shape, dtype=torch.bool)
        policy_dev = devices.policy
        self._flat_input = all(len(k) == 1 for k in env.obs_codecs) and (
            policy_dev is None or policy_dev.type == "cpu"
        )
        self.count_steps = options.max_frames_per_traj is not None
        self._extra_inputs = _declared_inputs(policy.module)
        self.random_policy = RandomPolicy(env.action_spec)
        self.traj_ids = traj_pool.take(n)
        self._fresh_ids = True
        self.step_count = np.zeros(n, dtype=np.int64)
        self.root_flags = np.zeros((len(DONE_KEYS), n), dtype=np.bool_)
        self.needs_reset = False
        self.steps_taken = 0
        self.root: Leaves = env.reset_arrays()
        self.policy_fields = self._probe_policy()
        self._direct = self._direct_call()
        self._same_bufs: dict[Key, torch.Tensor] | None = None
        self._same_td: TensorDictBase | None = None

    # ------------------------------------------------------------------ buffers
    def _fields(self) -> dict[Key, tuple[tuple[int, ...], torch.dtype]]:
        obs = {k: (tuple(c.spec.shape), c.spec.dtype) for k, c in self.env.obs_codecs.items()}
        flag = ((1,), torch.bool)
        fields = {**obs, **self.policy_fields}
        fields.update({(name,): flag for name in DONE_KEYS})
        if self.count_steps:
            fields[("step_count",)] = ((1,), torch.int64)
        fields[TRAJ_KEY] = ((), torch.int64)
        fields.update({(_NEXT, *k): v for k, v in obs.items()})
        fields[(_NEXT, "reward")] = ((1,), torch.float32)
        fields.update({(_NEXT, name): flag for name in DONE_KEYS})
        if self.count_steps:
            fields[(_NEXT, "step_count")] = ((1,), torch.int64)
        fields.update(
            {key: ((), torch.int64) for key in version_keys(self.options.track_policy_version)}
        )
        return fields

    def _buffers(self, steps: int) -> dict[Key, torch.Tensor]:
        n = self.env.num_envs
        return {
            key: torch.zeros((n, steps, *shape), dtype=dtype)
            for key, (shape, dtype) in self._fields().items()
        }

    # ------------------------------------------------------------------ resets
    def reset(self) -> None:
        """Reset every env before the next step (new trajectories start)."""
        self.needs_reset = True

    def restart_ids(self) -> None:
        """The running trajectories go on under new ids from the pool (after it is loaded)."""
        self.traj_ids = self.pool.take(self.env.num_envs)
        self._fresh_ids = True

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed env ``i`` with ``seed + i`` (all ``seed`` when ``static_seed``) at a reset of
        every env before the next step; returns the last env's seed."""
        seeds = env_seeds(seed, self.env.num_envs, static_seed)
        self.env.schedule_seeds(seeds)
        self.needs_reset = True
        return seeds[-1]

    def env_state_dict(self) -> OrderedDict:
        """A gymnasium env keeps no state a collector saves (as TorchRL's gym wrapper)."""
        return OrderedDict()

    def load_env_state_dict(self, state: Any) -> None:
        if state:
            raise ArgumentValueError(
                f"state_dict has an env_state_dict with {len(state)} entries, but a gymnasium "
                "env keeps no state to load it into."
            )

    def full_reset(self) -> None:
        """Reset every env (with seeds scheduled by ``set_seed``) and start new trajectories."""
        self.root = self.env.reset_arrays()
        if not self._fresh_ids:
            self.traj_ids = self.pool.take(self.env.num_envs)
            self._fresh_ids = True
        self.step_count[:] = 0
        self.root_flags[:] = False
        self.needs_reset = False

    def _reset_done(self, done: np.ndarray, current: Leaves) -> Leaves:
        self.traj_ids[done] = self.pool.take(int(done.sum()))
        self.step_count[done] = 0
        if not self.env.is_vector:
            return self.env.reset_arrays()
        return self.env.reset_arrays(mask=done, current=current)

    # ------------------------------------------------------------------ the loop
    def collect(
        self, steps: int, *, random: bool = False, should_stop: Callable[[], bool] | None = None
    ) -> TensorDictBase:
        """Run ``steps`` steps of every env; return the batch (``[N, T]``, or ``[T]`` for one env).

        ``random`` draws actions from the action spec instead of the policy. ``should_stop`` is
        polled after each step; when it returns True the batch is cut at the steps taken.
        """
        if self.needs_reset or self.options.reset_at_each_iter:
            self.full_reset()
        bufs = self._reuse_or_alloc(steps)
        views = {
            k: (b.numpy()[..., 0] if k in _SCALAR_KEYS else b.numpy()) for k, b in bufs.items()
        }
        taken = self._run(steps, views, random, should_stop)
        return self._assemble(bufs, taken)

    def _run(self, steps: int, views: dict, random: bool, should_stop: Callable | None) -> int:
        env, w, r, opts = self.env, self._write, self._read, self.options
        obs_keys = list(env.obs_codecs)
        root_obs = [views[k] for k in obs_keys]
        next_obs = [views[(_NEXT, *k)] for k in obs_keys]
        root_flags = [views[(n,)] for n in DONE_KEYS]
        n_done, n_term, n_trunc = (views[(_NEXT, n)] for n in DONE_KEYS)
        reward, traj = views[(_NEXT, "reward")], views[TRAJ_KEY]
        action_view = views[("action",)]
        policy_views = {k: views[k] for k in self.policy_fields}
        max_steps = opts.max_frames_per_traj
        root, taken = self.root, 0
        with torch.no_grad(), set_interaction_type(opts.exploration_type):
            for t in range(steps):
                for key, buf in zip(obs_keys, root_obs, strict=True):
                    buf[w, t] = root[key]
                traj[w, t] = self.traj_ids
                if self.count_steps:
                    views[("step_count",)][w, t] = self.step_count
                if not self._flags_clear:
                    for i, buf in enumerate(root_flags):
                        buf[w, t] = self.root_flags[i]
                for key, value in self._acted(root, random, t):
                    policy_views[key][w, t] = (
                        value.numpy() if value.device.type == "cpu" else value.cpu().numpy()
                    )
                nobs, rew, term, trunc = self._stepped(action_view[r, t], t)
                self.steps_taken += 1
                self._fresh_ids = False
                term = np.asarray(term, dtype=np.bool_)
                trunc = np.asarray(trunc, dtype=np.bool_)
                if max_steps is not None:
                    self.step_count += 1
                    views[(_NEXT, "step_count")][w, t] = self.step_count
                    trunc = trunc | (self.step_count >= max_steps)
                done = term | trunc
                for key, buf in zip(obs_keys, next_obs, strict=True):
                    buf[w, t] = nobs[key]
                reward[w, t] = rew
                n_done[w, t] = done
                n_term[w, t] = term
                n_trunc[w, t] = trunc
                taken = t + 1
                if not done.any():
                    root = nobs
                elif opts.reset_when_done:
                    root = self._reset_after_done(np.atleast_1d(done), nobs)
                else:
                    root = nobs
                    flags = np.broadcast_arrays(done, term, trunc)
                    self.root_flags[:] = np.stack(flags).reshape(self.root_flags.shape)
                if should_stop is not None and should_stop():
                    break
        self.root = root
        return taken

    def _acted(self, root: Leaves, random: bool, t: int) -> list[tuple[Key, torch.Tensor]]:
        """The policy's outputs on ``root`` (step ``t`` of the batch); its error, typed."""
        try:
            return self._act(root, random)
        except Exception as err:
            raise with_builtin(PolicyError, err)(
                f"the policy raised {type(err).__name__} at step {self.steps_taken} "
                f"(step {t} of this batch): {err}"
            ) from err

    def _stepped(self, action: Any, t: int) -> tuple:
        """The env's step on ``action`` (step ``t`` of the batch); its error, typed."""
        env = self.env
        try:
            return env.step_arrays(action)
        except Exception as err:
            raise with_builtin(EnvError, err)(
                f"env {env.name!r} raised {type(err).__name__} in step() at step "
                f"{self.steps_taken} (step {t} of this batch): {err}",
                env_name=env.name,
                step=self.steps_taken,
            ) from err

    @property
    def _flags_clear(self) -> bool:
        return self.options.reset_when_done or not self.root_flags.any()

    def _reset_after_done(self, done: np.ndarray, current: Leaves) -> Leaves:
        try:
            return self._reset_done(done, current)
        except EnvError as err:
            err.step = self.steps_taken
            raise

    def shared_batch(self, steps: int) -> TensorDictBase:
        """Allocate the batch buffers once, in shared memory, and return the TensorDict over them.

        Every later ``collect(steps)`` with ``return_same_td`` writes into these same buffers, so
        another process holding this TensorDict sees each batch without any copy or pickling.
        """
        if not self.options.return_same_td:
            raise RuntimeError("shared_batch() needs a StepLoop built with return_same_td=True")
        self._same_bufs = {k: b.share_memory_() for k, b in self._buffers(steps).items()}
        self._same_td = None
        return self._assemble(self._same_bufs, steps)

    def use_buffers(self, batch: TensorDictBase, steps: int) -> TensorDictBase:
        """Write every later batch into ``batch``'s tensors instead (laid out as
        ``shared_batch(steps)`` returned, in other memory: a transport's send buffer, so a batch
        leaves without a copy); returns the TensorDict over them."""
        single = not self.env.is_vector
        bufs = {}
        for key, old in self._reuse_or_alloc(steps).items():
            new = batch.get(key)
            new = new.unsqueeze(0) if single else new
            if new.shape != old.shape or new.dtype != old.dtype:
                raise ArgumentValueError(
                    f"use_buffers: {key} is {tuple(new.shape)} {new.dtype}, the batch needs "
                    f"{tuple(old.shape)} {old.dtype}."
                )
            bufs[key] = new.copy_(old)
        self._same_bufs, self._same_td = bufs, None
        return self._assemble(bufs, steps)

    def _reuse_or_alloc(self, steps: int) -> dict[Key, torch.Tensor]:
        if not self.options.return_same_td:
            return self._buffers(steps)
        if self._same_bufs is None or next(iter(self._same_bufs.values())).shape[1] != steps:
            self._same_bufs, self._same_td = self._buffers(steps), None
        return self._same_bufs

    @property
    def _compacted(self) -> frozenset:
        """``compact_obs``: what the next step's root repeats is left out of ``next`` (the
        observations and the step count), as TorchRL does."""
        if not self.options.compact_obs:
            return frozenset()
        return frozenset([*((_NEXT, *k) for k in self.env.obs_codecs), (_NEXT, "step_count")])

    def layout(self, steps: int) -> TensorDictBase:
        """Zeroed buffers for a ``steps``-long batch, laid out as ``collect`` returns it."""
        return self._assemble(self._buffers(steps), steps, fresh=True)

    def _assemble(
        self, bufs: dict[Key, torch.Tensor], taken: int, fresh: bool = False
    ) -> TensorDictBase:
        single = not self.env.is_vector
        full = taken == next(iter(bufs.values())).shape[1]
        reuse = self.options.return_same_td and full and not fresh
        storing = self.devices.storing
        on_cpu = storing is None or storing.type == "cpu"
        if reuse and on_cpu and self._same_td is not None:
            td = self._same_td  # wraps the very buffers the loop just wrote
        else:
            td = TensorDict({}, batch_size=[taken] if single else [self.env.num_envs, taken])
            dropped = self._compacted
            for key, buf in bufs.items():
                if key in dropped:
                    continue
                value = buf[0] if single else buf
                td.set(key, value if full else value.narrow(0 if single else 1, 0, taken))
            td.names = ["time"] if single else [None, "time"]
            if storing is not None:
                td = td.to(storing)
        if self.options.set_truncated:
            for name in ("truncated", "done"):
                td.get((_NEXT, name))[..., -1, :] = True
        if not reuse:
            return td
        if self._same_td is None:
            self._same_td = td
        elif td is not self._same_td:
            self._same_td.update_(td)
        return self._same_td
