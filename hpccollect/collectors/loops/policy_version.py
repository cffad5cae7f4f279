"""``track_policy_version``: every frame tagged with the version of the policy that chose it.

The version starts at 0 and goes up by one with each weight update the collector applies (in a
worker process: each update that reached it). As TorchRL's ``PolicyVersion`` transform does,
``("next", "policy_version")`` is the version at the step and ``"policy_version"`` the one the
observation was made under: at a batch's first step, the version of the step before it.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from hpccollect.errors import ArgumentTypeError

__all__ = ["KEY", "PolicyVersionStamp", "make_stamp", "version_keys"]

KEY = "policy_version"


def version_keys(track_policy_version: Any) -> tuple[tuple[str, ...], ...]:
    """The per-frame int64 entries a collector with this setting writes (its loops leave room
    for them in shared batch buffers)."""
    if track_policy_version is False or track_policy_version is None:
        return ()
    return ((KEY,), ("next", KEY))


class PolicyVersionStamp:
    """Counts weight updates and writes the version into each batch."""

    def __init__(self, tracker: Any = None) -> None:
        self._tracker = tracker  # a TorchRL PolicyVersion the user passed, kept in step
        self._version = 0 if tracker is None else int(tracker.version)
        self._previous = self._version
        self._fresh = True  # the envs were (re)set under the current version

    @property
    def version(self) -> int:
        return self._version

    @version.setter
    def version(self, value: int) -> None:
        self._version = self._previous = int(value)
        if self._tracker is not None:
            self._tracker.version = self._version

    def increment(self) -> None:
        """One more weight update applied."""
        if self._tracker is not None:
            self._tracker.increment_version()
            self._version = int(self._tracker.version)
        else:
            self._version += 1

    def envs_reset(self) -> None:
        """The envs start over before the next batch: its first observations are new."""
        self._fresh = True

    def stamp(self, batch: TensorDictBase) -> None:
        """Write ``policy_version`` (and ``("next", "policy_version")``) into a ``[..., T]``
        batch collected under the current version."""
        now = torch.full(batch.shape, self._version, dtype=torch.int64, device=batch.device)
        before = now.clone()
        if not self._fresh and batch.shape[-1]:
            before[..., 0] = self._previous
        _write(batch, KEY, before)
        if "next" in batch.keys():
            _write(batch, ("next", KEY), now)
        self._previous, self._fresh = self._version, False


def _write(batch: TensorDictBase, key: Any, value: torch.Tensor) -> None:
    """Into the batch's own tensor when it has one (shared buffers a worker reuses)."""
    current = batch.get(key, None)
    if current is None:
        batch.set(key, value)
    else:
        current.copy_(value)


def make_stamp(track_policy_version: Any) -> PolicyVersionStamp | None:
    """None for ``False``; a stamp for ``True`` or for a TorchRL ``PolicyVersion`` (an object
    with ``increment_version()`` and an int ``version``), which is then kept up to date."""
    if track_policy_version is False or track_policy_version is None:
        return None
    if track_policy_version is True:
        return PolicyVersionStamp()
    tracker = track_policy_version
    if not callable(getattr(tracker, "increment_version", None)) or not isinstance(
        getattr(tracker, "version", None), int
    ):
        raise ArgumentTypeError(
            "track_policy_version must be True, False or a PolicyVersion with an int version "
            f"(version_type=int), got {tracker!r}."
        )
    return PolicyVersionStamp(tracker)


class TracksPolicyVersion:
    """TorchRL's policy-version methods for a collector that keeps a ``_versions`` stamp (None
    when ``track_policy_version`` is off): each applied weight update is one more version."""

    _versions: PolicyVersionStamp | None = None

    def update_policy_weights_(self, policy_or_weights: Any = None, **kwargs: Any) -> None:
        super().update_policy_weights_(policy_or_weights, **kwargs)  # type: ignore[misc]
        self.increment_version()

    def increment_version(self) -> None:
        """Count one more policy version (done by each ``update_policy_weights_``)."""
        if self._versions is not None:
            self._versions.increment()

    @property
    def policy_version(self) -> int | None:
        """The current policy version; None when ``track_policy_version`` is off."""
        return None if self._versions is None else self._versions.version

    def get_policy_version(self) -> int | None:
        """``policy_version``, as a method (TorchRL has both)."""
        return self.policy_version
