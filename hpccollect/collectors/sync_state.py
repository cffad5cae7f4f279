"""Seeds, resets and state of the single-process collector (TorchRL's ``set_seed``,
``reset``, ``state_dict``, ``load_state_dict``): its step loop's envs, its policy's weights
and its progress."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from hpccollect._checks import check_int
from hpccollect.errors import ArgumentTypeError
from hpccollect.policy import RandomPolicy, WrappedPolicy, load_weights_

__all__ = ["SyncState"]


class SyncState:
    """What ``SyncDataCollector`` keeps and restores; what it uses of it is declared here."""

    policy: Any
    track_traj_ids: bool
    _loop: Any  # the step loop: StepLoop (gymnasium) or TensorDictLoop (TorchRL)
    _wrapped: WrappedPolicy
    _versions: Any  # the policy-version stamp, or None
    _frames: int
    _iter: int
    #: drops what is kept of the running trajectories (``traj_ids``; all by default)
    _forget_trajectories: Callable[..., None]

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed env ``i`` with ``seed + i`` (``seed`` for all if ``static_seed``); return the last.

        The envs are reset with these seeds before the next step; the random policy (and
        ``init_random_frames``) draws from a generator seeded with ``seed`` too.
        """
        seed = check_int("seed", seed)
        last = self._loop.set_seed(seed, static_seed)
        for module in (self._loop.random_policy, self.policy):
            if isinstance(module, RandomPolicy):
                module.generator.manual_seed(seed)
        return last

    def reset(self) -> None:
        """Reset every env (new trajectories, with new ids, start); with ``trajs_per_batch``,
        the trajectories held back are dropped."""
        self._loop.reset()
        self._forget_trajectories()
        if self._versions is not None:
            self._versions.envs_reset()

    def state_dict(self) -> OrderedDict:
        """``policy_state_dict`` (when the policy is a module), ``env_state_dict`` (a TorchRL env's
        transforms' or batched env's state), progress."""
        state: OrderedDict = OrderedDict()
        module = self._wrapped.weights_module
        if module is not None:  # an empty one too, as TorchRL for a module without weights
            state["policy_state_dict"] = module.state_dict()
        state["env_state_dict"] = self._loop.env_state_dict()
        state.update(frames=self._frames, iter=self._iter)
        if self.track_traj_ids:
            state["traj_pool"] = self._loop.pool.state_dict()
        if self._versions is not None:
            state["policy_version"] = self._versions.version
        return state

    def load_state_dict(self, state_dict: OrderedDict, **kwargs: Any) -> None:
        """Restore policy weights and progress saved by ``state_dict()``."""
        if "policy_state_dict" in state_dict:
            if self._wrapped.weights_module is None:
                raise ArgumentTypeError(
                    "state_dict has policy_state_dict but this collector's policy has no weights."
                )
            load_weights_(self._wrapped.weights_module, state_dict["policy_state_dict"])
        if state_dict.get("env_state_dict"):
            self._loop.load_env_state_dict(state_dict["env_state_dict"])
        self._frames = int(state_dict.get("frames", self._frames))
        self._iter = int(state_dict.get("iter", self._iter))
        if "traj_pool" in state_dict:
            self._loop.pool.load_state_dict(state_dict["traj_pool"])
        if self.track_traj_ids:  # the envs' running trajectories go on under ids not yet saved
            self._loop.restart_ids()
        if self._versions is not None and state_dict.get("policy_version") is not None:
            self._versions.version = state_dict["policy_version"]
