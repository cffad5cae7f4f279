"""The collector kinds by name, the one list of them: ``python -m hpccollect collect
--collector KIND``, the config file's ``collector`` and ``collector_class="KIND"`` of the
distributed collector all use these words, each meaning one class. A new kind is one
``register_collector_kind(name, "module:Class")`` (or an ``hpccollect.collector_kinds`` entry
point of an installed package)."""

from __future__ import annotations

from hpccollect._lazy import check_target, load_target, with_entry_points
from hpccollect.errors import ArgumentValueError

__all__ = [
    "COLLECTOR_KINDS",
    "TORCHRL_KINDS",
    "collector_kind",
    "collector_kinds",
    "register_collector_kind",
]

#: kind -> the class, loaded on first use
COLLECTOR_KINDS = {
    "single": "hpccollect.collectors.sync:SyncDataCollector",
    "multi-sync": "hpccollect.collectors.multi:MultiSyncDataCollector",
    "multi-async": "hpccollect.collectors.multi:MultiaSyncDataCollector",
}
#: TorchRL's ``collector_class`` strings for the multi-process kinds; accepted there only, where
#: a TorchRL user writes them (on the command line ``sync`` once meant ``single``)
TORCHRL_KINDS = {"sync": "multi-sync", "async": "multi-async"}


def register_collector_kind(name: str, target: str) -> None:
    """Offer a collector class as ``--collector name`` and ``collector_class="name"``.

    Args:
        name: the kind's word.
        target: ``"module:Class"`` of a ``SyncDataCollector`` or multi-process collector
            subclass, imported on first use.
    """
    COLLECTOR_KINDS[name] = check_target(target)


def collector_kinds(*, torchrl_names: bool = False) -> tuple[str, ...]:
    """Every collector kind, installed packages' too (``register_collector_kind``).

    Args:
        torchrl_names: add TorchRL's words for them (``"sync"``, ``"async"``).

    Returns:
        The kinds' names, as ``--collector`` and ``collector_class=`` take them.
    """
    kinds = tuple(with_entry_points("collector kind", COLLECTOR_KINDS))
    return (*kinds, *TORCHRL_KINDS) if torchrl_names else kinds


def collector_kind(name: str, *, torchrl_names: bool = False) -> type:
    """The collector class of kind ``name`` (with ``torchrl_names``, TorchRL's words too)."""
    kind = TORCHRL_KINDS.get(name, name) if torchrl_names else name
    if kind not in collector_kinds():
        known = list(collector_kinds(torchrl_names=torchrl_names))
        raise ArgumentValueError(f"collector kind must be one of {known}, got {name!r}.")
    return load_target(COLLECTOR_KINDS[kind])
