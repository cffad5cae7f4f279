"""Writing a collector's batches into a replay buffer (hpccollect's or TorchRL's)."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

__all__ = ["store"]


def store(buffer: Any, batch: Any, extend: bool) -> None:
    """Write a batch into a replay buffer: at once (``extend``), or a step at a time, each
    ``[*env batch]`` step in time order (TorchRL's ``extend_buffer=False``)."""
    batch = _with_storage_device(buffer, batch)
    if extend:
        buffer.extend(batch)
        return
    for t in range(batch.shape[-1]):
        buffer.add(batch[..., t])


def _with_storage_device(buffer: Any, batch: Any) -> Any:
    """A batch with no device whose tensors all sit on the device of the buffer's storage is
    written as on that device (TorchRL's collectors set that device first, after a
    ``postproc`` that cleared it, say); no tensor moves."""
    if not isinstance(batch, TensorDictBase) or batch.device is not None:
        return batch
    device = getattr(getattr(buffer, "storage", None), "device", None)
    if device is None or device == "auto":
        return batch
    device = torch.device(device)
    tensors = batch.values(include_nested=True, leaves_only=True)
    if any(getattr(t, "device", device) != device for t in tensors):
        return batch
    return batch.copy().to(device)
