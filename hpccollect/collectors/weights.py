"""Weight updaters: how trained policy weights reach the policy a collector runs.

``LocalWeightsUpdaterBase`` is the download side (fetch weights from a server, or take the ones
given, and load them into the local policy); ``RemoteWeightsUpdaterBase`` the upload side (push
weights to workers). ``update_policy_weights_`` runs the local updater first, then the remote one.
How a collector takes them is here too: ``built_updater`` (the ``weight_updater`` keyword, as a
class, a constructor or an instance) and ``given_weights`` (TorchRL's keywords for the weights
given to ``update_policy_weights_``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from hpccollect.errors import ArgumentTypeError, ArgumentValueError
from hpccollect.policy import load_weights_, to_weights

__all__ = [
    "LocalWeightsUpdaterBase",
    "PolicyWeightsCopier",
    "RemoteWeightsUpdaterBase",
    "WeightUpdaterBase",
    "built_updater",
    "given_weights",
]


class WeightUpdaterBase(abc.ABC):  # noqa: B024 - the abstract hooks are in the subclasses
    """How weights reach the policy a collector runs, with TorchRL's hooks.

    A subclass written for TorchRL runs here unchanged: ``push_weights`` takes the weights given
    (or ``_get_server_weights()``), maps them with ``_maybe_map_weights``, and hands them to
    ``_sync_weights_with_worker`` once per id of ``all_worker_ids()`` (once, with no id, when
    that is None), skipping the ids ``_skip_update`` names; then it runs the post hooks.

    Pass one as a collector's ``weight_updater``: an instance, or the class itself, which is
    built with ``from_policy(policy)`` when that gives one, and with no argument otherwise.
    """

    _collector: Any = None
    _post_hooks: list[Callable[[], Any]] | None = None

    @classmethod
    def from_policy(cls, policy: Any) -> WeightUpdaterBase | None:
        """An updater for ``policy``, or None to be built with no argument (the default).

        Args:
            policy: the policy of the collector that builds the updater.

        Returns:
            The updater, or None.
        """
        return None

    def register_collector(self, collector: Any) -> None:
        """Called by the collector that owns this updater.

        Args:
            collector: that collector (``self.collector`` from now on).
        """
        self._collector = collector

    @property
    def collector(self) -> Any:
        """The collector that owns this updater (None before one registers it)."""
        return self._collector

    @property
    def collectors(self) -> list[Any] | None:
        """TorchRL's list form of ``collector``."""
        return None if self._collector is None else [self._collector]

    @property
    def post_hooks(self) -> list[Callable[[], Any]]:
        """Callables run, with no argument, after each ``push_weights``."""
        if self._post_hooks is None:
            self._post_hooks = []
        return self._post_hooks

    def register_post_hook(self, hook: Callable[[], Any]) -> None:
        """Run ``hook()`` after each ``push_weights`` from now on.

        Args:
            hook: a callable with no argument.
        """
        self.post_hooks.append(hook)

    def init(self, *args: Any, **kwargs: Any) -> None:  # noqa: B027 - optional hook
        """Optional set-up with user arguments (``collector.init_updater(*args, **kwargs)``)."""

    def __call__(
        self, policy_or_weights: Any = None, *, worker_ids: Any = None, **kwargs: Any
    ) -> None:
        """Move weights: TorchRL's flow over its hooks (``push_weights``); the local and
        remote bases below have their own."""
        self.push_weights(policy_or_weights, worker_ids)

    def push_weights(self, policy_or_weights: Any = None, worker_ids: Any = None) -> None:
        """Send weights to workers through the hooks (see the class).

        Args:
            policy_or_weights: a policy module (its weights are taken), weights, or None for
                ``_get_server_weights()``.
            worker_ids: a worker id, a list of them, or None for ``all_worker_ids()``.
        """
        if policy_or_weights is None:
            weights = self._get_server_weights()
        elif isinstance(policy_or_weights, nn.Module):
            weights = to_weights(policy_or_weights)
        else:
            weights = policy_or_weights
        weights = self._maybe_map_weights(weights)
        if worker_ids is None:
            ids = self.all_worker_ids()
        elif isinstance(worker_ids, Sequence) and not isinstance(worker_ids, str):
            ids = list(worker_ids)
        else:
            ids = [worker_ids]
        if ids is None:
            self._sync_weights_with_worker(server_weights=weights)
        else:
            for worker_id in ids:
                if not self._skip_update(worker_id):
                    self._sync_weights_with_worker(worker_id=worker_id, server_weights=weights)
        for hook in self.post_hooks:
            hook()

    def _skip_update(self, worker_id: Any) -> bool:
        """Whether ``push_weights`` leaves ``worker_id`` out this time (never, by default)."""
        return False

    def _get_server_weights(self) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__}: implement _get_server_weights() (where the trained weights "
            "are) or __call__, or pass the weights to update_policy_weights_."
        )

    def _maybe_map_weights(self, server_weights: Any) -> Any:
        return server_weights

    def all_worker_ids(self) -> Sequence[Any] | None:
        """The ids ``push_weights`` syncs when it is given none.

        Returns:
            The worker ids, or None: one sync with no id.
        """
        return None

    def _sync_weights_with_worker(self, *, worker_id: Any = None, server_weights: Any) -> None:
        raise NotImplementedError(
            f"{type(self).__name__}: implement _sync_weights_with_worker(worker_id=..., "
            "server_weights=...) (how weights reach one worker), or __call__."
        )


class LocalWeightsUpdaterBase(WeightUpdaterBase):
    """Download side: server (or given) weights -> mapped -> loaded into the local policy."""

    @abc.abstractmethod
    def _get_server_weights(self) -> TensorDictBase | None:
        """The latest weights from wherever they are kept; None if there is nothing to fetch."""

    @abc.abstractmethod
    def _get_local_weights(self) -> TensorDictBase | None:
        """The weights of the policy the collector runs."""

    @abc.abstractmethod
    def _maybe_map_weights(self, server_weights: TensorDictBase) -> TensorDictBase:
        """Turn server weights into the local layout (devices, names)."""

    @abc.abstractmethod
    def _update_local_weights(
        self, local_weights: TensorDictBase | None, mapped_weights: TensorDictBase
    ) -> None:
        """Load ``mapped_weights`` into the local policy."""

    def __call__(
        self, policy_or_weights: Any = None, *, worker_ids: Any = None, **kwargs: Any
    ) -> None:
        server = (
            self._get_server_weights()
            if policy_or_weights is None
            else to_weights(policy_or_weights)
        )
        if server is None:
            return
        with torch.no_grad():
            self._update_local_weights(self._get_local_weights(), self._maybe_map_weights(server))


class RemoteWeightsUpdaterBase(WeightUpdaterBase):
    """Upload side: the server's weights -> mapped -> sent to each named worker."""

    @abc.abstractmethod
    def _sync_weights_with_worker(self, worker_id: Any, server_weights: TensorDictBase) -> None:
        """Deliver ``server_weights`` to one worker."""

    @abc.abstractmethod
    def _get_server_weights(self) -> TensorDictBase | None:
        """The weights to send when none are given; None when there is nothing to send."""

    @abc.abstractmethod
    def _maybe_map_weights(self, server_weights: TensorDictBase) -> TensorDictBase:
        """Turn server weights into what workers expect."""

    @abc.abstractmethod
    def all_worker_ids(self) -> Sequence[Any]:
        """Every worker id, used when ``worker_ids`` is None.

        Returns:
            The ids, in the order the weights are sent.
        """

    def __call__(
        self, policy_or_weights: Any = None, *, worker_ids: Any = None, **kwargs: Any
    ) -> None:
        weights = (
            self._get_server_weights()
            if policy_or_weights is None
            else to_weights(policy_or_weights)
        )
        if weights is None:
            return  # nothing to send (a policy without parameters)
        mapped = self._maybe_map_weights(weights)
        if worker_ids is None:
            ids: Sequence[Any] = list(self.all_worker_ids())
        elif isinstance(worker_ids, (list, tuple)):
            ids = list(worker_ids)
        else:
            ids = [worker_ids]
        with torch.no_grad():
            self._sync_weights_with_workers(ids, mapped)

    def _sync_weights_with_workers(
        self, worker_ids: Sequence[Any], server_weights: TensorDictBase
    ) -> None:
        """Deliver ``server_weights`` to every worker of ``worker_ids`` (one after another unless
        a transport can reach them at once)."""
        for worker_id in worker_ids:
            self._sync_weights_with_worker(worker_id, server_weights)


class PolicyWeightsCopier(LocalWeightsUpdaterBase):
    """Default local updater of ``SyncDataCollector``.

    With no weights given it copies the user's policy into the collector's copy (made only when
    ``policy_device`` differs from where the policy lives); given weights, it loads them.
    """

    def __init__(self, target: nn.Module | None, source: nn.Module | None = None) -> None:
        self.target = target
        self.source = source

    def _get_server_weights(self) -> TensorDictBase | None:
        if self.source is None or self.source is self.target:
            return None  # the collector runs the user's own module: nothing to copy
        return TensorDict.from_module(self.source)

    def _get_local_weights(self) -> TensorDictBase | None:
        return None if self.target is None else TensorDict.from_module(self.target)

    def _maybe_map_weights(self, server_weights: TensorDictBase) -> TensorDictBase:
        return server_weights

    def _update_local_weights(
        self, local_weights: TensorDictBase | None, mapped_weights: TensorDictBase
    ) -> None:
        if self.target is None or local_weights is None or local_weights.is_empty():
            raise ArgumentValueError(
                "update_policy_weights_ was given weights, but the collector's policy has no "
                "parameters (a random policy or a plain function)."
            )
        load_weights_(self.target, mapped_weights)


def given_weights(policy_or_weights: Any, kwargs: dict) -> Any:
    """The weights given to ``update_policy_weights_``, from whichever of TorchRL's keywords
    carried them (taken out of ``kwargs``); ``model_id`` may only name the policy, the one
    model synced here.

    Args:
        policy_or_weights: the positional argument (weights, a policy, or None).
        kwargs: the call's other keywords; those that carry weights are taken out.

    Returns:
        The weights (or policy) given, or None when none was.

    Raises:
        ArgumentValueError: ``model_id`` or ``weights_dict`` names a model other than the
            policy.
        ArgumentTypeError: the weights were given under more than one keyword.
    """
    model_id = kwargs.pop("model_id", None)
    if model_id not in (None, "policy"):
        raise ArgumentValueError(
            f"update_policy_weights_: model_id={model_id!r}; hpccollect syncs the policy's "
            "weights only (model_id='policy' or none)."
        )
    given = {"policy_or_weights": policy_or_weights} if policy_or_weights is not None else {}
    for name in ("weights", "policy", "policy_weights"):
        if kwargs.get(name) is not None:
            given[name] = kwargs.pop(name)
        kwargs.pop(name, None)
    weights_dict = kwargs.pop("weights_dict", None)
    if weights_dict is not None:
        others = sorted(str(k) for k in weights_dict if k != "policy")
        if others:
            raise ArgumentValueError(
                f"update_policy_weights_: weights_dict has {others}; hpccollect syncs the "
                "policy's weights only ({'policy': weights})."
            )
        if weights_dict.get("policy") is not None:
            given["weights_dict"] = weights_dict["policy"]
    if len(given) > 1:
        raise ArgumentTypeError(
            f"update_policy_weights_ got weights as {sorted(given)}; pass them once."
        )
    return next(iter(given.values()), None)


def built_updater(updater: Any, policy: Any) -> Any:
    """``weight_updater`` as an instance: TorchRL takes the updater, its class (built with
    ``from_policy(policy)`` when that gives one, else with no argument) or a constructor.

    Args:
        updater: the ``weight_updater`` keyword as given.
        policy: the collector's policy (for ``from_policy``).

    Returns:
        The updater instance (``updater`` itself when it is one, or None).
    """
    if isinstance(updater, type) and issubclass(updater, WeightUpdaterBase):
        return updater.from_policy(policy) or updater()
    if callable(updater) and not isinstance(updater, WeightUpdaterBase):
        return updater()
    return updater
