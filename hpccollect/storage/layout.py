"""Where each TensorDict key goes in an HDF5 dataset file, and back.

D4RL's names at the root (``observations``, ``actions``, ``rewards``, ``terminals``,
``timeouts``, ``next_observations``), ``episode`` for episode ids, and every other key under its
own path: ``("next", "done")`` -> ``next_done``, ``("collector", "traj_ids")`` ->
``collector/traj_ids``. Nothing goes under a root ``next`` or ``metadata`` group.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from hpccollect.errors import ArgumentValueError

__all__ = ["EPISODE", "SQUEEZED", "dataset_path", "keymap_from_json", "keymap_to_json"]

Key = tuple[str, ...]

D4RL: dict[Key, str] = {
    ("observation",): "observations",
    ("action",): "actions",
    ("next", "reward"): "rewards",
    ("next", "terminated"): "terminals",
    ("next", "truncated"): "timeouts",
    ("next", "observation"): "next_observations",
}
#: stored as (N,) as D4RL does; the reader gives them back their trailing dim of 1
SQUEEZED = frozenset({"rewards", "terminals", "timeouts"})
EPISODE = "episode"
_RESERVED_ROOTS = ("next", "metadata")


def dataset_path(key: Key) -> str:
    """The HDF5 path of a TensorDict key."""
    if key in D4RL:
        return D4RL[key]
    if key[0] == "next":
        key = (f"next_{key[1]}", *key[2:])
    elif key[0] == "metadata":
        key = ("metadata_", *key[1:])
    return "/".join(key)


def keymap_for(keys: Iterable[Key]) -> dict[str, Key]:
    """Dataset path -> TensorDict key for ``keys``; two keys landing on one path is an error."""
    out: dict[str, Key] = {}
    for key in keys:
        path = dataset_path(key)
        if path in out or path == EPISODE or path.split("/")[0] in _RESERVED_ROOTS:
            raise ArgumentValueError(
                f"TensorDict keys {out.get(path)} and {key} both map to dataset {path!r} "
                "(or use a reserved name); rename one of them before writing."
            )
        out[path] = key
    return out


def keymap_to_json(keymap: dict[str, Key]) -> str:
    return json.dumps({path: list(key) for path, key in keymap.items()})


def keymap_from_json(text: str) -> dict[str, Key]:
    return {path: tuple(key) for path, key in json.loads(text).items()}
