"""TorchRL 0.14.1 keywords that hpccollect takes by name but whose feature it does not offer.

A TorchRL script passes them with their defaults (so they are accepted); any other value is
refused at construction with what the keyword does in TorchRL and what to use here instead, never
with Python's "unexpected keyword argument".
"""

from __future__ import annotations

from typing import Any

from hpccollect.errors import ArgumentValueError

__all__ = ["refuse_unoffered"]

#: keyword -> (values that ask for nothing, what TorchRL would do and the way here)
_UNOFFERED: dict[str, tuple[tuple[Any, ...], str]] = {
    "weight_sync_schemes": (
        (None,),
        "TorchRL's weight transports; hpccollect sends weights over its own channels "
        "(update_policy_weights_(weights, worker_ids=...))",
    ),
    "weight_recv_schemes": (
        (None,),
        "TorchRL's weight transports; hpccollect's workers receive weights from their collector",
    ),
}


def refuse_unoffered(owner: str, arguments: dict[str, Any]) -> None:
    """Raise for the first keyword of ``arguments`` (a constructor's ``locals()``) that asks for a
    feature not offered: one of those above, given a value other than TorchRL's default."""
    for name, (defaults, why) in _UNOFFERED.items():
        if name not in arguments:
            continue
        value = arguments[name]
        if any(value is d or (type(value) is type(d) and value == d) for d in defaults):
            continue
        raise ArgumentValueError(
            f"{owner}: {name}={value!r} is TorchRL's, and hpccollect does not offer it: it "
            f"{why}. Leave {name} at its default ({defaults[0]!r})."
        )
