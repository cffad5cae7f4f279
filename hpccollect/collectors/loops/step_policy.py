"""The policy side of the gymnasium step loop: what the policy reads each step (the
observations as a flat TensorDict, or its declared inputs), a probe of what it writes, the
check of its actions, and the direct call that skips TensorDict work where it can."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase, set_interaction_type

from hpccollect._compat import new_unchecked
from hpccollect.collectors.torchrl_api.options import CollectorArgs, Devices
from hpccollect.envs.gym import DONE_KEYS, GymEnv, Leaves
from hpccollect.envs.spaces import Key
from hpccollect.errors import PolicyError, with_builtin
from hpccollect.policy import RandomPolicy, WrappedPolicy

__all__ = ["StepPolicy"]

_NEXT = "next"


def _show(keys: Any) -> list[str]:
    """Keys as users write them: ``"done"``, ``("sensors", "lidar")``."""
    return sorted(str(k[0] if isinstance(k, tuple) and len(k) == 1 else k) for k in keys)


def _declared_inputs(module: Any) -> frozenset[str]:
    """The root flags and step count a policy reads: those in its ``in_keys`` when it declares
    them as a TensorDict module does, else all of them."""
    everything = frozenset([*DONE_KEYS, "step_count"])
    in_keys = getattr(module, "in_keys", None)
    if not isinstance(module, TensorDictModuleBase) or not isinstance(in_keys, list) or not in_keys:
        return everything
    return frozenset(k for k in in_keys if isinstance(k, str)) & everything


def _key(k: Any) -> Key:
    return k if isinstance(k, tuple) else (k,)


class StepPolicy:
    """The policy calls of ``StepLoop``; what they use of the loop is declared here."""

    env: GymEnv
    policy: WrappedPolicy
    options: CollectorArgs
    devices: Devices
    random_policy: RandomPolicy
    policy_fields: dict[Key, tuple[tuple[int, ...], torch.dtype]]
    _flat_input: bool
    _extra_inputs: frozenset[str]
    _write: slice
    _read: Any
    _false: torch.Tensor  # a done flag of every env, False
    _flag_shape: tuple[int, ...]
    _direct: Any  # the direct call (see ``_direct_call``), or None
    count_steps: bool
    root: Leaves  # the observations the policy acts on
    root_flags: np.ndarray  # the done flags of the root, one row per DONE_KEYS entry
    step_count: np.ndarray

    def _policy_input(self, root: Leaves) -> TensorDict:
        """What the policy sees at the root, as in TorchRL: observations, done flags, step count.

        A module that declares its ``in_keys`` gets the flags and step count only if it reads
        them (fewer keys make every TensorDict policy call cheaper); other callables get all.
        """
        source: dict[str, Any] = {}
        for key, value in root.items():
            node = source
            for part in key[:-1]:
                node = node.setdefault(part, {})
            node[key[-1]] = torch.from_numpy(value)
        wanted = self._extra_inputs
        if self.root_flags.any():
            for i, name in enumerate(DONE_KEYS):
                if name in wanted:
                    source[name] = torch.from_numpy(
                        self.root_flags[i].reshape(self._flag_shape).copy()
                    )
        else:
            source.update((name, self._false.clone()) for name in DONE_KEYS if name in wanted)
        if self.count_steps and "step_count" in wanted:
            source["step_count"] = torch.from_numpy(
                self.step_count.reshape(self._flag_shape).copy()
            )
        if self._flat_input:  # built from checked tensors: skip tensordict's validation
            return new_unchecked(source, batch_size=self.env.batch_size)
        return TensorDict(source, batch_size=self.env.batch_size, device=self.devices.policy)

    def _call_policy_td(self, root: Leaves) -> TensorDictBase:
        td = self._policy_input(root)
        out = self.policy.module(td)
        return td if out is None else out

    def _probe_policy(self) -> dict[Key, tuple[tuple[int, ...], torch.dtype]]:
        """Call the policy once on the first observation: check it, and learn what it writes."""
        in_keys: set[Key] = set()
        try:
            with torch.no_grad(), set_interaction_type(self.options.exploration_type):
                td_in = self._policy_input(self.root)
                in_keys = {_key(k) for k in td_in.keys(True, True)}
                out = self.policy.module(td_in)
                out = td_in if out is None else out
        except Exception as err:
            raise with_builtin(PolicyError, err)(
                f"the policy raised {type(err).__name__} on the env's first observation: {err}. "
                f"It was called with a TensorDict holding {_show(in_keys)} "
                f"(batch_size={list(self.env.batch_size)})."
            ) from err
        if not isinstance(out, TensorDictBase):
            raise PolicyError(
                f"the policy returned {type(out).__name__}; a policy taking a TensorDict must "
                "return a TensorDict (or None after writing into it)."
            )
        fields = {
            _key(k): v
            for k, v in out.items(True, True)
            if _key(k) not in in_keys and _key(k)[0] not in (_NEXT, "collector")
        }
        self._check_action(fields, out)
        batch = len(self.env.batch_size)
        fields = {("action",): fields.pop(("action",)), **fields}
        for key, value in fields.items():
            if tuple(value.shape[:batch]) != tuple(self.env.batch_size):
                raise PolicyError(
                    f"the policy wrote {key} with shape {tuple(value.shape)}; its leading dims "
                    f"must be the env batch size {list(self.env.batch_size)}."
                )
        return {k: (tuple(v.shape[batch:]), v.dtype) for k, v in fields.items()}

    def _check_action(self, fields: dict[Key, torch.Tensor], out: TensorDictBase) -> None:
        spec = self.env.action_spec
        action = fields.get(("action",))
        if action is None:  # TorchRL raises KeyError here
            raise with_builtin(PolicyError, KeyError)(
                f"the policy did not write the action key 'action'; its output keys were "
                f"{_show(out.keys(True, True))}. A TensorDictModule policy must list "
                f"'action' in its out_keys; a plain module must return the action tensor of shape "
                f"{tuple(spec.shape)} ({spec!r})."
            )
        if tuple(action.shape) != tuple(spec.shape):
            raise PolicyError(
                f"the policy wrote 'action' with shape {tuple(action.shape)}, but env "
                f"{self.env.name!r} needs shape {tuple(spec.shape)} ({spec!r}). For a Discrete "
                "action space the action is one-hot by default; pass "
                "categorical_action_encoding=True to GymEnv for integer actions."
            )

    def _direct_call(self) -> tuple[Callable, list[Key], list[Key]] | None:
        direct = self.policy.direct
        if direct is None:
            return None
        fn, in_keys, out_keys = direct
        in_keys, out_keys = [_key(k) for k in in_keys], [_key(k) for k in out_keys]
        if not set(in_keys) <= set(self.root) or set(out_keys) != set(self.policy_fields):
            return None
        return fn, in_keys, out_keys

    def _act(self, root: Leaves, random: bool) -> list[tuple[Key, torch.Tensor]]:
        if random:
            return [(("action",), self.random_policy.sample())]
        device = self.devices.policy
        if self._direct is not None:
            fn, in_keys, out_keys = self._direct
            args = [torch.from_numpy(root[k]) for k in in_keys]
            if device is not None and device.type != "cpu":
                args = [a.to(device, non_blocking=True) for a in args]
            out = fn(*args)
            return list(zip(out_keys, out if isinstance(out, tuple) else (out,), strict=True))
        out = self._call_policy_td(root)
        return [(k, out.get(k)) for k in self.policy_fields]
