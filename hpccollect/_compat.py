"""What hpccollect needs of other packages beyond their public API, in one place: where
tensordict's versions differ, and what no package offers publicly.

**Private names.** Each is read here and nowhere else (``tests/test_boundaries.py`` fails on one
read elsewhere), checked against the versions this project installs and tests: torch 2.13,
tensordict 0.14.3 and 0.15.3, gymnasium 1.1.0 and 1.4.0, torchrl 0.14.1, CPython 3.10 to 3.13.
``tests/test_compat_private.py`` fails when one of them changes:

* ``new_unchecked`` (``TensorDict._new_unsafe``): a TensorDict over leaves whose shapes and
  devices are already right, without tensordict's per-leaf checks (a batch's nest, a step's
  TensorDict: the hot paths).
* ``foreach_copy_`` (``torch._foreach_copy_``): one fused copy of many leaves (a batch into the
  buffers it leaves from, weights into their flat buffer).
* ``storage_holds`` (``torch._C._storage_Use_Count``): how many holds a tensor's memory has,
  so a batch buffer nobody else holds is reused; None where torch cannot count them.
* ``has_hooks`` (``nn.Module._forward_hooks``/``_forward_pre_hooks``): whether a module's
  forward must go through ``__call__``.
* ``can_reset_one_sub_env``/``reset_one_sub_env`` (gymnasium ``SyncVectorEnv``'s
  ``_env_obs``/``_autoreset_envs``): one finished sub-env reset without concatenating all.
* ``lay_out_on_first_write`` (TorchRL storage's ``_make_init_directory``, ``_compilable``,
  ``_init_lock``, ``_init_event``): a shared storage laid out by its first writer, as TorchRL's
  collector turns it on.
* ``stop_fd_passing`` (``multiprocessing.resource_sharer``): the thread that sending shared
  tensors down a pipe starts, stopped once no pipe can fetch from it.

A job's own fork server reaches into ``multiprocessing`` too; that module holds it
(``collectors/workers/fork_server.py``).

**tensordict 0.14 (torchrl 0.14.1's) and 0.15.**

* Collate: tensordict 0.15 registers TensorDicts in torch's ``default_collate_fn_map``, so
  ``default_collate`` hands a batch that a dataset read in one ``__getitems__`` call back as is
  and stacks a list of TensorDicts. tensordict 0.14 registers nothing: ``default_collate`` takes
  a TensorDict for a plain mapping, iterates it (over rows, not keys) and fails, which breaks
  ``DataLoader(TransitionDataset(path), batch_size=...)``, the docs' recipe (docs/datasets.md).
  ``register_tensordict_collate`` adds the same entry where none covers TensorDicts.
* Names: ``tensordict.pad`` keeps dim names on 0.15 and drops them on 0.14. TorchRL's
  ``split_trajectories`` pads every trajectory, so its padded split of a ``[T]`` batch is named
  ``[None, "time"]`` on one and unnamed on the other; hpccollect names its split the same way
  (``pad_keeps_names``).

``interaction_type`` needs nothing here: ``tensordict.nn`` exports it from 0.15 only, but
``tensordict.nn.probabilistic`` defines it in both, and hpccollect imports it from there.
Both helpers test what the installed tensordict does, not its version number.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
from multiprocessing import resource_sharer
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection, pad
from torch import nn
from torch.utils.data._utils.collate import default_collate_fn_map

__all__ = [
    "can_reset_one_sub_env",
    "foreach_copy_",
    "has_hooks",
    "lay_out_on_first_write",
    "new_unchecked",
    "pad_keeps_names",
    "register_tensordict_collate",
    "reset_one_sub_env",
    "stop_fd_passing",
    "storage_holds",
]

#: ``new_unchecked(source, batch_size=..., device=..., names=...)``: see the module
new_unchecked = TensorDict._new_unsafe
#: ``foreach_copy_(dst, src)``: see the module
foreach_copy_ = torch._foreach_copy_
_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


def storage_holds(tensor: torch.Tensor) -> int | None:
    """How many holds there are on ``tensor``'s memory (the tensor and its views, arrays made
    from it); None where this torch cannot count them."""
    return None if _USE_COUNT is None else _USE_COUNT(tensor.untyped_storage()._cdata)


def has_hooks(module: nn.Module) -> bool:
    """Whether ``module`` has forward hooks of its own (its forward then goes through them)."""
    return bool(module._forward_hooks or module._forward_pre_hooks)


def can_reset_one_sub_env(venv: Any) -> bool:
    """Whether ``venv`` (a gymnasium ``SyncVectorEnv``) keeps what ``reset_one_sub_env``
    updates."""
    return isinstance(getattr(venv, "_autoreset_envs", None), np.ndarray) and isinstance(
        getattr(venv, "_env_obs", None), list
    )


def reset_one_sub_env(venv: Any, index: int, obs: Any) -> None:
    """Record in ``venv`` that sub-env ``index`` was reset to ``obs`` (as its
    ``reset(options={"reset_mask": ...})`` would, without concatenating every observation)."""
    venv._env_obs[index] = obs
    venv._autoreset_envs[index] = False


def lay_out_on_first_write(storage: Any) -> bool:
    """Turn on a TorchRL storage's ``shared_init`` (its first writer, in whatever process,
    lays it out) as TorchRL's collector does; False where the storage cannot."""
    if not callable(getattr(storage, "_make_init_directory", None)) or getattr(
        storage, "_compilable", False
    ):
        return False
    storage._init_lock, storage._init_event = mp.Lock(), mp.Event()
    storage._make_init_directory()
    storage.shared_init = True
    return True


def stop_fd_passing(timeout: float = 1.0) -> None:
    """Stop the thread that passes descriptors to other processes (sending a shared tensor down
    a pipe starts it); the next such send starts it again."""
    resource_sharer.stop(timeout=timeout)


def _collate_tensordicts(batch: Any, *, collate_fn_map: Any = None) -> Any:
    if is_tensor_collection(batch):  # a minibatch read in one __getitems__ call
        return batch
    return torch.stack(list(batch))


def register_tensordict_collate() -> None:
    """Make ``default_collate`` pass TensorDict batches through, unless tensordict already does."""
    if not any(
        isinstance(key, type) and issubclass(TensorDictBase, key) for key in default_collate_fn_map
    ):
        default_collate_fn_map[TensorDictBase] = _collate_tensordicts


@functools.cache
def pad_keeps_names() -> bool:
    """Whether ``tensordict.pad`` keeps a TensorDict's dim names (0.15 does, 0.14 drops them)."""
    return pad(TensorDict({}, batch_size=[1]).refine_names("time"), [0, 1]).names == ["time"]
