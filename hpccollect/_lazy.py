"""Registered plug-ins named as ``"module:attr"``: imported on first use, so registering one
loads nothing (a launcher's mpi4py, a collector kind's worker machinery)."""

from __future__ import annotations

import importlib
from typing import Any

from hpccollect.errors import ArgumentValueError

__all__ = ["check_target", "load_target"]


def check_target(target: str) -> str:
    """``target`` if it has the ``"module:attr"`` form; an error naming the form otherwise."""
    if not isinstance(target, str) or ":" not in target:
        raise ArgumentValueError(f"target must be 'module:attr', got {target!r}.")
    return target


def load_target(target: str) -> Any:
    """The object ``"module:attr"`` names, its module imported now."""
    module, _, attr = check_target(target).partition(":")
    return getattr(importlib.import_module(module), attr)
