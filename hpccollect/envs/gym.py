"""A gymnasium ``Env`` or ``VectorEnv`` that speaks TensorDict, laid out as TorchRL's gym wrapper.

Two faces: ``reset()``/``step()``/``rand_action()`` take and return TensorDicts for users, and the
``*_arrays`` methods take and return numpy leaves for the collector's step loop, which writes them
straight into its preallocated buffers.

Vector envs: whatever the autoreset mode, a done step reports the env's true final observation and
the auto-reset step is never exposed. Done sub-envs are reset with ``reset_mask`` (NEXT_STEP and
DISABLED modes) or picked up from ``info["final_obs"]`` (SAME_STEP mode).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from hpccollect._compat import can_reset_one_sub_env, reset_one_sub_env
from hpccollect.envs.spaces import Key, LeafCodec, action_codec, observation_codecs
from hpccollect.envs.specs import Categorical, Composite, TensorSpec, Unbounded
from hpccollect.errors import ArgumentTypeError, ArgumentValueError, EnvError, with_builtin

__all__ = ["DONE_KEYS", "GymEnv", "env_seeds"]

DONE_KEYS = ("done", "terminated", "truncated")
_NEXT_STEP = gym.vector.AutoresetMode.NEXT_STEP
_SAME_STEP = gym.vector.AutoresetMode.SAME_STEP

Leaves = dict[Key, np.ndarray]


def env_seeds(seed: int, num_envs: int, static_seed: bool = False) -> list[int]:
    """Seeds for ``num_envs`` envs: ``seed, seed+1, ...`` (all ``seed`` when ``static_seed``)."""
    return [seed] * num_envs if static_seed else [seed + i for i in range(num_envs)]


class GymEnv:
    """TensorDict adapter over a gymnasium env, vector env, or env id.

    Args:
        env: a ``gymnasium.Env``, a ``gymnasium.vector.VectorEnv``, or a registered env id.
        num_envs: with an env id, build a vector env of this many copies (``gym.make_vec``).
        categorical_action_encoding: store Discrete/MultiDiscrete values as integer indices
            instead of one-hot (TorchRL's default is one-hot).
        device: device of the tensors this adapter returns (None, the default as in TorchRL:
            wherever they are made, the CPU).
        vectorization_mode: ``"sync"`` or ``"async"``, with ``num_envs``.
        **kwargs: forwarded to ``gymnasium.make``/``make_vec`` with an env id.
    """

    def __init__(
        self,
        env: gym.Env | gym.vector.VectorEnv | str,
        *,
        num_envs: int | None = None,
        categorical_action_encoding: bool = False,
        device: Any = None,
        vectorization_mode: str = "sync",
        **kwargs: Any,
    ) -> None:
        if isinstance(env, str):
            env = _make_from_id(env, num_envs, vectorization_mode, kwargs)
        elif kwargs or num_envs is not None:
            raise ArgumentValueError(
                "GymEnv: num_envs and make kwargs only apply when env is an env id string, "
                f"got an instance of {type(env).__name__}."
            )
        if not isinstance(env, (gym.Env, gym.vector.VectorEnv)):
            raise ArgumentTypeError(
                f"GymEnv: env must be a gymnasium.Env, a gymnasium.vector.VectorEnv or an env id, "
                f"got {type(env).__name__}."
            )
        self.env = env
        self.device = None if device is None else torch.device(device)
        self.is_vector = isinstance(env, gym.vector.VectorEnv)
        self.num_envs = int(env.num_envs) if self.is_vector else 1
        self.batch_size = torch.Size([self.num_envs] if self.is_vector else [])
        self.name = _env_name(env)
        obs_space = env.single_observation_space if self.is_vector else env.observation_space
        act_space = env.single_action_space if self.is_vector else env.action_space
        self.obs_codecs: dict[Key, LeafCodec] = observation_codecs(
            obs_space, categorical_action_encoding
        )
        self.action_codec: LeafCodec = action_codec(act_space, categorical_action_encoding)
        self._autoreset_mode = (
            env.metadata.get("autoreset_mode", _NEXT_STEP) if self.is_vector else None
        )
        self._direct_sub_reset = _supports_direct_sub_reset(env)
        self._same_step_root: Leaves | None = None
        self._same_step_done: np.ndarray | None = None
        self._pending_seeds: list[int] | None = None
        self._closed = False

    # ---------------------------------------------------------------- specs and keys
    @property
    def observation_keys(self) -> list[Key]:
        """Leaf keys of the observation, as tuples: ``("observation",)`` for a non-Dict space, or
        ``("pixels",)`` for an image (``spaces.is_image``: TorchRL's rule, applied to the single
        env's space, so a vector env of image envs gives ``pixels`` too)."""
        return list(self.obs_codecs)

    @property
    def action_key(self) -> str:
        return "action"

    @property
    def done_keys(self) -> list[str]:
        return list(DONE_KEYS)

    @property
    def observation_spec(self) -> Composite:
        batch = tuple(self.batch_size)
        root = Composite(shape=batch)
        for key, codec in self.obs_codecs.items():
            node = root
            for part in key[:-1]:
                if part not in node:
                    node[part] = Composite(shape=batch)
                node = node[part]
            node[key[-1]] = codec.spec.expand(*batch)
        return root

    @property
    def action_spec(self) -> TensorSpec:
        return self.action_codec.spec.expand(*self.batch_size)

    @property
    def reward_spec(self) -> TensorSpec:
        return Unbounded((*self.batch_size, 1), torch.float32)

    @property
    def done_spec(self) -> Composite:
        flag = Categorical(2, (*self.batch_size, 1), torch.bool)
        return Composite({k: flag for k in DONE_KEYS}, shape=self.batch_size)

    # ---------------------------------------------------------------- array API (hot path)
    def leaves(self, obs: Any) -> Leaves:
        """Flatten and encode a raw gymnasium observation into stored leaves.

        Args:
            obs: the observation as gymnasium gives it (an array, or a dict of them).

        Returns:
            One array per observation key, in the stored dtype.
        """
        out: Leaves = {}
        for key, codec in self.obs_codecs.items():
            value = obs
            if isinstance(obs, dict):
                for part in key:
                    value = value[part]
            if codec.encode is None:
                out[key] = np.ascontiguousarray(value, dtype=codec.np_dtype)
            else:
                out[key] = codec.encode(value)
        return out

    def reset_arrays(
        self,
        seeds: Sequence[int] | None = None,
        mask: np.ndarray | None = None,
        current: Leaves | None = None,
    ) -> Leaves:
        """Reset all envs, or those in ``mask``.

        Args:
            seeds: one seed per env (None: the seeds ``schedule_seeds`` left, if any, which
                reset every env whatever ``mask`` says).
            mask: the envs of a vector env to reset (None: all).
            current: the leaves the last step returned, so a partial reset need not read the envs
                that keep running again.

        Returns:
            Every env's current leaves.
        """
        if seeds is None and self._pending_seeds is not None:
            seeds, self._pending_seeds = self._pending_seeds, None
            mask = None
        try:
            if not self.is_vector:
                obs, _ = self.env.reset(seed=None if seeds is None else int(seeds[0]))
                return self.leaves(obs)
            if mask is None:
                obs, _ = self.env.reset(seed=None if seeds is None else [int(s) for s in seeds])
                self._same_step_done = None
                return self.leaves(obs)
            return self._partial_reset(mask, current)
        except EnvError:
            raise
        except Exception as err:
            raise with_builtin(EnvError, err)(
                f"env {self.name!r} raised {type(err).__name__} in reset(): {err}",
                env_name=self.name,
            ) from err

    def _partial_reset(self, mask: np.ndarray, current: Leaves | None = None) -> Leaves:
        if current is not None and self._direct_sub_reset:
            return self._reset_sub_envs(mask, current)
        if self._autoreset_mode == _SAME_STEP and self._same_step_done is not None:
            # gymnasium already reset the envs that ended; reset only those we truncated ourselves
            rest = mask & ~self._same_step_done
            self._same_step_done = None
            if not rest.any():
                return self._same_step_root  # type: ignore[return-value]
            mask = rest
        obs, _ = self.env.reset(options={"reset_mask": np.asarray(mask, dtype=np.bool_)})
        return self.leaves(obs)

    def _reset_sub_envs(self, mask: np.ndarray, current: Leaves) -> Leaves:
        """Reset finished sub-envs of a gymnasium ``SyncVectorEnv`` one by one.

        Same effect as ``reset(options={"reset_mask": mask})`` (the sub-env is reset and its
        pending auto-reset cleared) without re-concatenating every sub-env's observation.
        ``current`` is updated in place: the step loop has already copied it into its buffers.
        """
        venv = self.env
        out = current
        for i in np.flatnonzero(mask):
            obs, _ = venv.envs[i].reset()
            reset_one_sub_env(venv, i, obs)
            for key, value in self.leaves(obs).items():
                out[key][i] = value
        return out

    def step_arrays(self, action: np.ndarray) -> tuple[Leaves, Any, Any, Any]:
        """Step with an action in the stored format.

        Args:
            action: the action, as the collector stores it (one row per env of a vector env).

        Returns:
            ``(next leaves, reward, terminated, truncated)``; the next leaves hold each env's true
            final observation where its episode ended.
        """
        obs, reward, terminated, truncated, info = self.env.step(self.action_codec.decode(action))
        if self._autoreset_mode == _SAME_STEP:
            return self._same_step_next(obs, info), reward, terminated, truncated
        return self.leaves(obs), reward, terminated, truncated

    def _same_step_next(self, obs: Any, info: dict) -> Leaves:
        root = self.leaves(obs)
        ended = info.get("_final_obs")
        if ended is None or not np.any(ended):
            self._same_step_done = None
            return root
        self._same_step_root = root
        self._same_step_done = np.asarray(ended, dtype=np.bool_)
        nxt = {k: np.array(v, copy=True) for k, v in root.items()}
        for i in np.flatnonzero(ended):
            final = self.leaves(info["final_obs"][i])
            for key in nxt:
                nxt[key][i] = final[key]
        return nxt

    def schedule_seeds(self, seeds: Sequence[int]) -> None:
        """Use these per-env seeds at the next reset of all envs.

        Args:
            seeds: one seed per env; the first also seeds the action space.
        """
        self._pending_seeds = list(seeds)
        space = self.env.single_action_space if self.is_vector else self.env.action_space
        space.seed(int(seeds[0]))

    # ---------------------------------------------------------------- TensorDict API
    def _to_td(self, leaves: Leaves, **extra: Any) -> TensorDict:
        td = TensorDict({}, batch_size=self.batch_size, device=self.device)
        for key, value in leaves.items():
            td.set(key, torch.as_tensor(np.asarray(value)))
        for key, value in extra.items():
            td.set(key, torch.as_tensor(np.asarray(value)).reshape(*self.batch_size, 1))
        return td

    def reset(
        self, tensordict: TensorDictBase | None = None, *, seed: int | None = None
    ) -> TensorDict:
        """Reset and return the root TensorDict (observation keys and done flags set to False).

        Args:
            tensordict: None, or a TensorDict whose ``"_reset"`` bool entry names the envs of a
                vector env to reset.
            seed: seed env ``i`` with ``seed + i`` first.

        Returns:
            Every env's root TensorDict (the envs not reset keep their observations).
        """
        mask = None
        if tensordict is not None and "_reset" in tensordict.keys():
            mask = tensordict.get("_reset").reshape(-1).cpu().numpy().astype(np.bool_)
        seeds = None if seed is None else env_seeds(seed, self.num_envs)
        leaves = self.reset_arrays(seeds, mask if self.is_vector else None)
        false = np.zeros(self.batch_size, dtype=np.bool_)
        return self._to_td(leaves, done=false, terminated=false, truncated=false)

    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Step with ``tensordict["action"]`` and write the result under ``tensordict["next"]``.

        Args:
            tensordict: the step's TensorDict, with its ``"action"``.

        Returns:
            ``tensordict``, with ``"next"`` (observations, reward, done, terminated, truncated).
        """
        action = tensordict.get("action").detach().cpu().numpy()
        leaves, reward, terminated, truncated = self.step_arrays(action)
        terminated = np.asarray(terminated, dtype=np.bool_)
        truncated = np.asarray(truncated, dtype=np.bool_)
        nxt = self._to_td(
            leaves,
            reward=np.asarray(reward, dtype=np.float32),
            done=terminated | truncated,
            terminated=terminated,
            truncated=truncated,
        )
        tensordict.set("next", nxt)
        return tensordict

    def rand_action(
        self, tensordict: TensorDictBase | None = None, generator: torch.Generator | None = None
    ) -> TensorDictBase:
        """Write a uniformly random action from the action spec into ``tensordict``.

        Args:
            tensordict: where the action goes (None: a new TensorDict of the env's batch size).
            generator: the torch generator to draw with (None: torch's default).

        Returns:
            ``tensordict``, with its ``"action"``.
        """
        if tensordict is None:
            tensordict = TensorDict({}, batch_size=self.batch_size, device=self.device)
        action = self.action_spec.rand(generator=generator)
        tensordict.set("action", action if self.device is None else action.to(self.device))
        return tensordict

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed every env and reset them all.

        Args:
            seed: env ``i`` gets ``seed + i``.
            static_seed: every env gets ``seed`` itself.

        Returns:
            The seed of the last env.
        """
        seeds = env_seeds(seed, self.num_envs, static_seed)
        self.schedule_seeds(seeds)
        self.reset_arrays()
        return seeds[-1]

    def close(self) -> None:
        """Close the underlying env; safe to call twice."""
        if not self._closed:
            self._closed = True
            self.env.close()

    def __repr__(self) -> str:
        return f"GymEnv({self.name!r}, batch_size={list(self.batch_size)})"


def _supports_direct_sub_reset(env: Any) -> bool:
    """gymnasium's own SyncVectorEnv in NEXT_STEP or DISABLED mode, with the fields we update."""
    return (
        type(env) is gym.vector.SyncVectorEnv
        and env.metadata.get("autoreset_mode", _NEXT_STEP) != _SAME_STEP
        and can_reset_one_sub_env(env)
    )


def _env_name(env: Any) -> str:
    spec = getattr(env, "spec", None)
    return getattr(spec, "id", None) or type(getattr(env, "unwrapped", env)).__name__


def _make_from_id(env_id: str, num_envs: int | None, mode: str, kwargs: dict) -> Any:
    try:
        if num_envs is None:
            return gym.make(env_id, **kwargs)
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=mode, **kwargs)
    except gym.error.Error as err:
        raise ArgumentValueError(
            f"create_env_fn: cannot make gymnasium env {env_id!r}: {err} "
            "List registered ids with `python -c 'import gymnasium; gymnasium.pprint_registry()'`."
        ) from err
