"""The step loop for TorchRL envs: the env's own TensorDicts, stepped as TorchRL's collector does.

Per step the policy writes into the carrier (the env's root TensorDict) and
``env.step_and_maybe_reset`` returns the step and the next carrier; nothing else runs per step.
Once per batch the steps are stacked (straight into the output buffers when the collector keeps
them) and the trajectory ids are computed from the batch's done flags, so a batch costs what the
env's own ``rollout`` costs. Keys, shapes, dtypes and names are those TorchRL's collector gives:
what the env's specs declare (transforms included), what the policy writes, and
``("collector", "traj_ids")``.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDictBase, is_non_tensor
from tensordict.nn import set_interaction_type

from hpccollect.collectors.loops.policy_version import version_keys
from hpccollect.collectors.loops.td_policy import (
    SpecRandomPolicy,
    leaf_keys,
    private_key,
)
from hpccollect.collectors.loops.trajectories import TrajIdPool
from hpccollect.collectors.torchrl_api.options import CollectorArgs, Devices
from hpccollect.envs import envbase
from hpccollect.errors import (
    ArgumentValueError,
    EnvError,
    PolicyError,
    with_builtin,
)
from hpccollect.policy import WrappedPolicy

__all__ = ["TensorDictLoop"]

TRAJ_KEY = ("collector", "traj_ids")


class TensorDictLoop:
    """Runs a TorchRL env with a policy, a batch of ``steps`` steps at a time.

    Args:
        env: the TorchRL env (``EnvBase``).
        policy: the wrapped policy.
        options: batch-shaping options.
        devices: env/policy/storing devices.
        traj_pool: where new trajectory ids come from.
    """

    def __init__(
        self,
        env: Any,
        policy: WrappedPolicy,
        options: CollectorArgs,
        devices: Devices,
        traj_pool: TrajIdPool,
    ) -> None:
        self.env, self.policy, self.options, self.devices = env, policy, options, devices
        self.pool = traj_pool
        self._stamped = version_keys(options.track_policy_version)  # the collector writes them
        self.batch_size = torch.Size(env.batch_size)
        self.random_policy = SpecRandomPolicy(env.full_action_spec)
        self.steps_taken = 0
        # TorchRL's rule, on the devices as given (not the env's own): the carrier loses its
        # device unless env and policy were given one and the same device
        self._clear_device = devices.env is None or devices.policy != devices.env
        #: where the policy reads its input when the carrier has no device (TorchRL casts)
        self._cast = devices.policy if self._clear_device else None
        self.carrier = self._reset_env()
        self.traj_ids = self._new_ids()
        self._missing_action: str | None = None
        self.policy_keys = self._probe_policy()
        fake = env.fake_tensordict()
        self.keys = self._output_keys(fake)
        self._same: TensorDictBase | None = None
        self._lazy = False  # steps differ in shape: batches are lazy stacks
        #: every batch has one layout of tensors, which fixed (shared) buffers can hold
        self.fits_buffers = _fixed_layout(env, fake)

    # ------------------------------------------------------------------ set-up
    def _reset_env(self) -> TensorDictBase:
        try:
            with torch.no_grad():
                carrier = self.env.reset()
        except Exception as err:
            raise with_builtin(EnvError, err)(
                f"env {envbase.env_name(self.env)!r} raised {type(err).__name__} in reset(): {err}",
                env_name=envbase.env_name(self.env),
            ) from err
        return carrier.clear_device_() if self._clear_device else carrier

    def _new_ids(self) -> torch.Tensor:
        return torch.from_numpy(self.pool.take(self.batch_size.numel())).view(self.batch_size)

    def _probe_policy(self) -> list[tuple]:
        """Call the policy once on a copy of the first carrier, as TorchRL's collector does:
        check that it writes the env's actions and learn every key it writes."""
        given = self.carrier.copy() if self._cast is None else self.carrier.to(self._cast)
        before = {k: _get(given, k) for k in leaf_keys(given)}
        try:
            with torch.no_grad():  # TorchRL probes outside the exploration type too
                out = self.policy.module(given)
        except Exception as err:
            raise with_builtin(PolicyError, err)(
                f"the policy raised {type(err).__name__} on the env's first TensorDict: {err}. "
                f"It was called with keys {sorted(map(str, before))} "
                f"(batch_size={list(self.batch_size)})."
            ) from err
        out = given if out is None else out
        if not isinstance(out, TensorDictBase):
            raise PolicyError(
                f"the policy returned {type(out).__name__}; a policy taking a TensorDict must "
                "return a TensorDict (or None after writing into it)."
            )
        written = [
            k
            for k in leaf_keys(out)
            if k not in before or (before[k] is not _UNEVEN and before[k] is not _get(out, k))
        ]
        self._check_actions(out, written)
        self._policy_template = out.select(*written).clone().zero_()
        return written

    def _check_actions(self, out: TensorDictBase, written: list[tuple]) -> None:
        spec = self.env.full_action_spec
        for key in leaf_keys(spec.zero()):
            if key not in written:
                # TorchRL builds the collector and fails at the first step; say so now, raise then
                self._missing_action = (
                    f"the policy did not write the env's action {key if len(key) > 1 else key[0]!r}"
                    f"; it wrote {sorted(map(str, written))}. A TensorDictModule policy must list "
                    "it in its out_keys."
                )
                warnings.warn(
                    self._missing_action + " Collecting with it will fail.",
                    UserWarning,
                    stacklevel=5,
                )
                continue
            got = _get(out, key)
            if got is _UNEVEN:  # parts of a lazy stack, each checked by the env itself
                continue
            want, got = spec[key].shape, got.shape
            # the env takes what broadcasts, or what has its number of elements (TorchRL passes
            # both through; such envs reshape the action themselves)
            if got != want and not _broadcasts(got, want) and got.numel() != want.numel():
                raise PolicyError(
                    f"the policy wrote {key if len(key) > 1 else key[0]!r} with shape "
                    f"{tuple(got)}, but env {envbase.env_name(self.env)!r} needs shape "
                    f"{tuple(want)} ({spec[key]!r})."
                )

    def _output_keys(self, fake: TensorDictBase) -> list[tuple]:
        """What a batch holds, as in TorchRL: the env's declared entries, what the policy writes
        and the trajectory ids; private (``_``-prefixed) entries are left out."""
        keys = leaf_keys(fake) | set(self.policy_keys)
        if self.options.compact_obs:  # what the next step's root repeats leaves "next"
            spec = self.env.output_spec
            keys -= {("next", *k) for k in leaf_keys(spec["full_observation_spec"].zero())}
            keys -= {("next", *k) for k in leaf_keys(self.env.full_state_spec.zero())}
        return [*sorted((k for k in keys if not private_key(k)), key=str), TRAJ_KEY]

    # ------------------------------------------------------------------ resets and seeds
    def reset(self) -> None:
        """Reset every env now; new trajectories, with new ids, start."""
        self.carrier.update(self._reset_env())
        self.traj_ids = self._new_ids()

    def restart_ids(self) -> None:
        """The running trajectories go on under new ids from the pool (after it is loaded)."""
        self.traj_ids = self._new_ids()

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed the env (TorchRL's ``env.set_seed``); returns what it returns."""
        return self.env.set_seed(seed, static_seed=static_seed)

    def env_state_dict(self) -> OrderedDict:
        """The env's state as TorchRL's collector saves it (transforms' or batched env's)."""
        return envbase.env_state_dict(self.env)

    def load_env_state_dict(self, state: Any) -> None:
        envbase.load_env_state_dict(self.env, state)

    # ------------------------------------------------------------------ the loop
    def collect(
        self, steps: int, *, random: bool = False, should_stop: Callable[[], bool] | None = None
    ) -> TensorDictBase:
        """Run ``steps`` steps; return the batch (``[*env.batch_size, T]``, last dim "time").

        ``random`` draws actions from the env's action spec instead of the policy;
        ``should_stop`` is polled after each step and cuts the batch when it returns True.
        """
        if self.options.reset_at_each_iter:
            self.reset()
        if self._missing_action is not None and not random:
            raise with_builtin(PolicyError, KeyError)(self._missing_action)
        tds = self._run(steps, random, should_stop)
        batch = self._stack(tds, steps)
        self._write_traj_ids(batch)
        if self.options.set_truncated:
            self._set_truncated(batch)
        storing = self.devices.storing
        if storing is not None and batch.device != storing:
            batch = batch.to(storing)
        return batch

    def _run(self, steps: int, random: bool, should_stop: Callable | None) -> list:
        env, carrier, tds = self.env, self.carrier, []
        act = self.random_policy if random else self.policy.module
        step = env.step_and_maybe_reset if self.options.reset_when_done else self._step
        keys = self.policy_keys
        with torch.no_grad(), set_interaction_type(self.options.exploration_type):
            for t in range(steps):
                if random:  # the policy's other outputs stay in the batch, zeroed (as TorchRL)
                    carrier.update(self._policy_template)
                given = carrier if self._cast is None or random else carrier.to(self._cast)
                try:
                    out = act(given)
                except Exception as err:
                    raise with_builtin(PolicyError, err)(
                        f"the policy raised {type(err).__name__} at step {self.steps_taken} "
                        f"(step {t} of this batch): {err}"
                    ) from err
                out = given if out is None else out
                if out is not carrier:
                    carrier.update(out, keys_to_update=keys)
                try:
                    td, carrier = step(carrier)
                except Exception as err:
                    name = envbase.env_name(env)
                    raise with_builtin(EnvError, err)(
                        f"env {name!r} raised {type(err).__name__} in step() at step "
                        f"{self.steps_taken} (step {t} of this batch): {err}",
                        env_name=name,
                        step=self.steps_taken,
                    ) from err
                if self._clear_device:
                    carrier.clear_device_()
                tds.append(td)
                self.steps_taken += 1
                if should_stop is not None and should_stop():
                    break
        self.carrier = carrier
        return tds

    def _step(self, carrier: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """``reset_when_done=False``: step without resetting ended envs."""
        td = self.env.step(carrier)
        return td, self.env.step_mdp(td)

    def _stack(self, tds: list, steps: int) -> TensorDictBase:
        dim = len(self.batch_size)
        out = self._same
        if out is None and self.options.return_same_td and self.fits_buffers:
            out = self._same = self.layout(steps)
        if out is None:
            batch = self._stack_steps(tds, dim)
            if self._clear_device:
                batch.clear_device_()
            if leaf_keys(batch) != set(self.keys[:-1]):
                batch = batch.select(*self.keys[:-1])
            batch.set(TRAJ_KEY, torch.empty(batch.shape, dtype=torch.int64))
            return batch.refine_names(*([None] * dim), "time")
        view = out if len(tds) == steps else out[..., : len(tds)]
        body = view.exclude(TRAJ_KEY, *self._stamped)
        try:
            torch.stack(tds, dim, out=body)
        except (RuntimeError, KeyError, ValueError):  # the steps hold entries beyond the specs
            body.update_(torch.stack(tds, dim).select(*self.keys[:-1]))
        return view

    def _stack_steps(self, tds: list, dim: int) -> TensorDictBase:
        """The steps stacked along ``dim``: densely, or lazily where they differ in shape (an
        env with dynamic or heterogeneous specs; TorchRL's collector stacks those lazily too)."""
        if not self._lazy:
            try:
                return torch.stack(tds, dim)
            except RuntimeError:
                self._lazy = True
        return LazyStackedTensorDict.lazy_stack(tds, dim)

    def layout(self, steps: int) -> TensorDictBase:
        """Zeroed buffers for a ``steps``-long batch, laid out as ``collect`` returns it."""
        one = self.env.fake_tensordict()
        one.update(self._policy_template)
        one = one.select(*self.keys[:-1])
        if self._clear_device:
            one.clear_device_()
        batch = one.unsqueeze(-1).expand(*self.batch_size, steps).clone().zero_()
        for key in (TRAJ_KEY, *self._stamped):
            batch.set(key, torch.zeros(batch.shape, dtype=torch.int64))
        return batch.refine_names(*([None] * len(self.batch_size)), "time")

    def _write_traj_ids(self, batch: TensorDictBase) -> None:
        """Each step's trajectory id, from the batch's done flags: an env whose step ends its
        trajectory starts a new one at the next step, with the next id from the pool (ids in the
        order trajectories start, env by env within a step, as TorchRL hands them out)."""
        n, taken = self.batch_size.numel(), batch.shape[-1]
        ended = self._ended(batch).reshape(n, taken).T  # [T, n]
        ids = self.traj_ids.reshape(n)
        count = int(ended.sum())
        if not count:
            _write(batch, TRAJ_KEY, ids.view(*self.batch_size, 1).expand(batch.shape))
            return
        event_ids = torch.zeros(taken, n, dtype=torch.int64)
        event_ids[ended] = torch.from_numpy(self.pool.take(count))
        times = torch.arange(taken).unsqueeze(1).expand(taken, n)
        last = torch.where(ended, times, torch.full_like(times, -1)).cummax(0).values
        before = torch.cat([torch.full((1, n), -1, dtype=torch.int64), last[:-1]])
        picked = event_ids.gather(0, before.clamp(min=0))
        per_step = torch.where(before >= 0, picked, ids.unsqueeze(0))  # [T, n]
        _write(batch, TRAJ_KEY, per_step.T.reshape(batch.shape))
        final = last[-1]
        self.traj_ids = torch.where(final >= 0, event_ids[final.clamp(min=0), torch.arange(n)], ids)
        self.traj_ids = self.traj_ids.view(self.batch_size)

    def _ended(self, batch: TensorDictBase) -> torch.Tensor:
        """Whether each step ended its trajectory: any done flag of the step, as TorchRL reads it."""
        nxt = batch.get("next")
        dims = batch.ndim
        ended = torch.zeros(batch.shape, dtype=torch.bool)
        for key in self.env.done_keys:
            flag = nxt.get(key, None)
            if flag is None:
                continue
            if flag.ndim > dims:
                flag = flag.flatten(dims, flag.ndim - 1).any(-1)
            ended |= flag.cpu()
        return ended

    def _set_truncated(self, batch: TensorDictBase) -> None:
        """``set_truncated``: the last step of the batch is marked truncated, and so done."""
        keys = [
            k for k in self.env.done_keys if (k if isinstance(k, str) else k[-1]) == "truncated"
        ]
        if not keys:
            raise ArgumentValueError(
                "set_truncated=True, but the env has no truncated flag; add one with "
                "env.add_truncated_keys() before giving the env to the collector."
            )
        last = (slice(None),) * (batch.ndim - 1) + (-1,)  # the last time step, whatever the
        present = leaf_keys(batch)
        for key in keys:  # entry's own dims after the batch's (nested envs have some)
            key = key if isinstance(key, tuple) else (key,)
            done_key = ("next", *key[:-1], "done")
            for flag_key in (("next", *key), done_key):
                if flag_key in present:
                    flag = batch.get(flag_key)
                    flag[last] = True
                    if isinstance(batch, LazyStackedTensorDict):  # get() gave a copy
                        batch.set(flag_key, flag)

    # ------------------------------------------------------------------ worker buffers
    def shared_batch(self, steps: int) -> TensorDictBase | None:
        """The output buffers, in shared memory, allocated once; later batches are written there
        (``return_same_td``), so another process holding this TensorDict sees each batch."""
        if not self.options.return_same_td:
            raise RuntimeError("shared_batch() needs a loop built with return_same_td=True")
        if not self.fits_buffers:
            return None
        self._same = self.layout(steps).share_memory_()
        return self._same

    def use_buffers(self, batch: TensorDictBase, steps: int) -> TensorDictBase:
        """Write later batches into ``batch`` (laid out as ``shared_batch(steps)``)."""
        layout = self.layout(steps)
        if leaf_keys(batch) != leaf_keys(layout) or batch.shape != layout.shape:
            raise ArgumentValueError(
                f"use_buffers: the batch has keys {sorted(map(str, leaf_keys(batch)))} and shape "
                f"{tuple(batch.shape)}; this loop writes {sorted(map(str, leaf_keys(layout)))} "
                f"with shape {tuple(layout.shape)}."
            )
        self._same = batch
        return batch


_UNEVEN = object()  # an entry of a lazy stack whose parts differ in shape


def _fixed_layout(env: Any, fake: TensorDictBase) -> bool:
    """Whether every step of ``env`` has the same tensors: no spec with a dynamic dim (-1, also
    what a heterogeneous lazy-stacked spec reports) and no non-tensor entry in ``fake`` (the
    env's ``fake_tensordict()``)."""
    try:
        specs = list(env.specs.values(True, True))
    except RuntimeError:
        return False
    if any(-1 in spec.shape for spec in specs):
        return False
    return not any(is_non_tensor(value) for value in fake.values(True))


def _get(td: TensorDictBase, key: tuple) -> Any:
    """``td``'s entry ``key``, or ``_UNEVEN`` when its parts cannot be stacked into one."""
    try:
        return td.get(key)
    except RuntimeError:
        return _UNEVEN


def _write(batch: TensorDictBase, key: Any, value: torch.Tensor) -> None:
    """Write ``value`` into ``batch``'s entry ``key``: in place (the buffers may be shared), or
    through ``set`` into a lazy stack, whose ``get`` gives a copy."""
    if isinstance(batch, LazyStackedTensorDict):
        batch.set(key, value.clone())
    else:
        batch.get(key).copy_(value)


def _broadcasts(got: torch.Size, want: torch.Size) -> bool:
    try:
        return torch.broadcast_shapes(got, want) == want
    except RuntimeError:
        return False
