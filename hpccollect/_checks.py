"""Argument checks shared by the public constructors: each names the argument and the fix."""

from __future__ import annotations

import numbers
from typing import Any

from hpccollect.errors import ArgumentTypeError, ArgumentValueError


def check_int(name: str, value: Any, *, minimum: int | None = None, hint: str = "") -> int:
    """Return ``value`` as an int, or raise naming ``name`` if it is not an integer >= minimum."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(
            f"{name} must be an int, got {value!r} of type {type(value).__name__}. {hint}".rstrip()
        )
    value = int(value)
    if minimum is not None and value < minimum:
        raise ArgumentValueError(f"{name} must be >= {minimum}, got {value}. {hint}".rstrip())
    return value


def check_float(name: str, value: Any, *, minimum: float | None = None) -> float:
    """Return ``value`` as a float, or raise naming ``name`` if it is not a number >= minimum."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(
            f"{name} must be a number, got {value!r} of type {type(value).__name__}."
        )
    value = float(value)
    if minimum is not None and not value >= minimum:
        raise ArgumentValueError(f"{name} must be >= {minimum:g}, got {value:g}.")
    return value


def check_seconds(name: str, value: Any) -> float:
    """Return ``value`` as a float, or raise naming ``name`` if it is not a number of seconds
    > 0 (a timeout)."""
    seconds = check_float(name, value)
    if not seconds > 0:
        raise ArgumentValueError(f"{name} must be > 0 seconds, got {value}.")
    return seconds


def check_bool(name: str, value: Any) -> bool:
    """Return ``value`` if it is a bool, or raise naming ``name``."""
    if not isinstance(value, bool):
        raise ArgumentTypeError(
            f"{name} must be True or False, got {value!r} of type {type(value).__name__}."
        )
    return value


def check_callable(name: str, value: Any, *, optional: bool = True) -> Any:
    """Return ``value`` if it is callable (or None when optional), or raise naming ``name``."""
    if value is None and optional:
        return None
    if not callable(value):
        raise ArgumentTypeError(
            f"{name} must be callable{' or None' if optional else ''}, "
            f"got {value!r} of type {type(value).__name__}."
        )
    return value
