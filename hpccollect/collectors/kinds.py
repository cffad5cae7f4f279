"""The collector kinds by name, the one list of them: ``python -m hpccollect collect
--collector KIND``, the config file's ``collector`` and ``collector_class="KIND"`` of the
distributed collector all use these words, each meaning one class."""

from __future__ import annotations

from hpccollect._lazy import load_target
from hpccollect.errors import ArgumentValueError

__all__ = ["COLLECTOR_KINDS", "TORCHRL_KINDS", "collector_kind"]

#: kind -> the class, loaded on first use
COLLECTOR_KINDS = {
    "single": "hpccollect.collectors.sync:SyncDataCollector",
    "multi-sync": "hpccollect.collectors.multi:MultiSyncDataCollector",
    "multi-async": "hpccollect.collectors.multi:MultiaSyncDataCollector",
}
#: TorchRL's ``collector_class`` strings for the multi-process kinds; accepted there only, where
#: a TorchRL user writes them (on the command line ``sync`` once meant ``single``)
TORCHRL_KINDS = {"sync": "multi-sync", "async": "multi-async"}


def collector_kind(name: str, *, torchrl_names: bool = False) -> type:
    """The collector class of kind ``name`` (with ``torchrl_names``, TorchRL's words too)."""
    kind = TORCHRL_KINDS.get(name, name) if torchrl_names else name
    if kind not in COLLECTOR_KINDS:
        known = [*COLLECTOR_KINDS, *(TORCHRL_KINDS if torchrl_names else ())]
        raise ArgumentValueError(f"collector kind must be one of {known}, got {name!r}.")
    return load_target(COLLECTOR_KINDS[kind])
