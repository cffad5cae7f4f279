"""Trajectory ids and ``split_trajectories``."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from hpccollect._compat import pad_keeps_names
from hpccollect.errors import ArgumentValueError

__all__ = ["TrajIdPool", "flatten_unnamed", "split_trajectories"]


class TrajIdPool:
    """Hands out trajectory ids, increasing in the order trajectories start.

    Ids are ``offset + stride * k`` for ``k = 0, 1, ...``, so collectors given distinct offsets
    under a common stride (one per worker or rank) never share an id.
    """

    def __init__(self, offset: int = 0, stride: int = 1) -> None:
        if stride < 1 or not 0 <= offset < stride:
            raise ArgumentValueError(
                f"TrajIdPool needs 0 <= offset < stride, got offset={offset}, stride={stride}."
            )
        self.offset, self.stride, self.count = offset, stride, 0

    def take(self, n: int) -> np.ndarray:
        """The next ``n`` ids."""
        ids = self.offset + self.stride * np.arange(self.count, self.count + n, dtype=np.int64)
        self.count += n
        return ids

    @property
    def next_id(self) -> int:
        """The id the next trajectory gets."""
        return self.offset + self.stride * self.count

    def state_dict(self) -> dict[str, torch.Tensor]:
        """TorchRL's layout: ``{"traj_id": next id}``."""
        return {"traj_id": torch.tensor(self.next_id)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Hand out only ids from ``state["traj_id"]`` on (this pool's own offset and stride)."""
        first = int(state["traj_id"])
        self.count = max(self.count, -(-(first - self.offset) // self.stride))


def split_trajectories(
    rollout: TensorDictBase,
    *,
    prefix: Any = None,
    traj_key: str = "traj_ids",
    trajectory_key: Any = None,
    done_key: Any = None,
    as_nested: bool = False,
) -> TensorDictBase:
    """Regroup a ``[..., T]`` batch as ``[n_traj, max_len]``, one row per trajectory.

    Rows are in order of first appearance (env by env, then time); each row is zero-padded and
    ``(prefix, "mask")`` is True on real steps. Frames whose id is -1 (padding of a preempted
    worker) belong to no trajectory and are left out.

    Names and shapes are TorchRL 0.14.1's: when every trajectory spans the whole time dim the
    batch keeps its shape and names (only the mask is added; a ``[T]`` batch becomes
    ``[1, T]`` named ``[None, "time"]``); otherwise a padded ``[N, T]`` split is unnamed and a
    padded ``[T]`` split is named as TorchRL's padding names it (``pad_keeps_names``).

    Args:
        rollout: a collector's batch, ``[T]`` or ``[..., T]``, with trajectory ids.
        prefix: the entry that holds the trajectory ids, and the mask beside them (default
            ``"collector"`` when the batch has one, else none).
        traj_key: the trajectory ids' key under ``prefix``.
        trajectory_key: the ids' full key instead (TorchRL's keyword); the mask goes beside it.
        done_key: the done flag that ends a trajectory, when ids are not tracked.
        as_nested: TorchRL's experimental nested output; refused (the padded rows and their
            mask hold the same data).

    Returns:
        The batch as ``[n_traj, max_len]``, with its mask.

    Raises:
        ArgumentValueError: ``as_nested=True``.
    """
    if as_nested:
        raise ArgumentValueError(
            "split_trajectories(as_nested=True) is not offered: the padded output with its mask "
            "holds the same data (TorchRL's as_nested is experimental); drop as_nested."
        )
    ids_key, mask_key = _split_keys(rollout, prefix, traj_key, trajectory_key)
    if ids_key not in rollout.keys(True):
        rollout = _with_ids_from_done(rollout, ids_key, done_key)
    names = rollout.names if rollout.ndim else []
    flat = flatten_unnamed(rollout)
    ids = flat.get(ids_key)
    valid = ids != -1
    if not bool(valid.all()):
        flat, ids = flat[valid], ids[valid]
    n = ids.shape[0]
    starts = torch.ones(n, dtype=torch.bool)
    starts[1:] = ids[1:] != ids[:-1]
    start_idx = torch.nonzero(starts).squeeze(-1)
    lengths = torch.diff(torch.cat([start_idx, torch.tensor([n])]))
    if n == rollout.numel() and bool((lengths == rollout.shape[-1]).all()):
        whole = rollout.clone(False)
        whole.set(mask_key, torch.ones(whole.shape, dtype=torch.bool, device=ids.device))
        return whole.unsqueeze(0) if whole.ndim == 1 else whole
    max_len = int(lengths.max()) if lengths.numel() else 0
    steps = torch.arange(max_len)
    mask = steps.unsqueeze(0) < lengths.unsqueeze(1)
    index = torch.where(mask, start_idx.unsqueeze(1) + steps, torch.zeros((), dtype=torch.long))
    out = flat[index]

    def _pad(x: torch.Tensor) -> torch.Tensor:
        m = mask.reshape(*mask.shape, *([1] * (x.ndim - 2)))
        return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))

    out = out.apply(_pad)
    out.set(mask_key, mask)
    if rollout.ndim == 1 and names[0] is not None and pad_keeps_names():
        out.names = [None, names[0]]
    return out


def _as_tuple(key: Any) -> tuple:
    return (key,) if isinstance(key, str) else tuple(key)


def _split_keys(
    rollout: TensorDictBase, prefix: Any, traj_key: str, trajectory_key: Any
) -> tuple[tuple, tuple]:
    """The trajectory ids' key and the mask's (beside it), as TorchRL picks them: the
    ``trajectory_key`` given, else ``prefix`` (default ``"collector"`` when the batch has such
    an entry, no prefix otherwise) + ``traj_key``."""
    if trajectory_key is not None:
        ids_key = _as_tuple(trajectory_key)
        return ids_key, (*ids_key[:-1], "mask")
    if prefix is None:
        prefix = "collector" if "collector" in rollout.keys() else ()
    prefix = _as_tuple(prefix)
    return (*prefix, traj_key), (*prefix, "mask")


def _with_ids_from_done(rollout: TensorDictBase, ids_key: tuple, done_key: Any) -> TensorDictBase:
    """A batch without trajectory ids gets them from its done flags (a new id after each done
    step, distinct across envs), as TorchRL does; without done flags it is refused."""
    done_key = _as_tuple(done_key) if done_key is not None else ("next", "done")
    if done_key not in rollout.keys(True) and len(done_key) > 1:
        done_key = done_key[-1:]
    done = rollout.get(done_key, None)
    if done is None:
        raise ArgumentValueError(
            f"split_trajectories needs trajectory ids at {ids_key} or done flags at {done_key}; "
            "the batch has neither (pass trajectory_key=... or done_key=...)."
        )
    done = done.reshape(*rollout.shape, -1).any(-1)
    starts = torch.zeros_like(done, dtype=torch.int64)
    starts[..., 1:] = done[..., :-1].long()
    per_row = starts.cumsum(-1)
    rows = per_row.reshape(-1, rollout.shape[-1])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), (rows[:, -1] + 1).cumsum(0)[:-1]])
    ids = (rows + offsets.unsqueeze(1)).reshape(rollout.shape)
    out = rollout.clone(False)
    out.set(ids_key, ids)
    return out


def flatten_unnamed(batch: TensorDictBase) -> TensorDictBase:
    """A shallow copy of ``batch`` as one unnamed ``[frames]`` dim, env-major then time."""
    flat = batch.clone(False)
    flat.names = None
    for node in flat.values(True):  # tensordict 0.14 leaves names two levels down
        if isinstance(node, TensorDictBase) and node.names != [None] * node.batch_dims:
            node.names = None
    return flat.reshape(-1)
