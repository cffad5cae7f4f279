"""Where tensordict 0.14 (torchrl 0.14.1's) and 0.15 differ in ways hpccollect sees.

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
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection, pad
from torch.utils.data._utils.collate import default_collate_fn_map

__all__ = ["pad_keeps_names", "register_tensordict_collate"]


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
