"""A batch's layout as the tests compare it with TorchRL's (``collectors/test_torchrl_envs.py``,
``launchers/test_submitit_torchrl.py``)."""

from __future__ import annotations

from typing import Any


def leaves(batch: Any) -> dict[str, tuple[Any, Any]]:
    """Each leaf's key (as a string), shape and dtype."""
    return {str(k): (batch.get(k).shape, batch.get(k).dtype) for k in batch.keys(True, True)}
