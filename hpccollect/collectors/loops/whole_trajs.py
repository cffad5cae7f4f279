"""Whole trajectories out of fixed-frame batches (TorchRL's ``trajs_per_batch``).

A collector polls its envs ``frames_per_batch`` frames at a time; ``TrajectoryAssembler`` keeps
each trajectory's pieces until its last step is done, then hands out complete trajectories:
``trajs_per_batch`` of them per yielded batch (``"padded"``: ``[n, max_len]`` with a
``("collector", "mask")``; ``"cat"``: one flat ``[sum of lengths]`` batch), or, with a replay
buffer, written to it flat, ``trajs_per_write`` per ``extend``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from tensordict import TensorDictBase, pad

from hpccollect._checks import check_int
from hpccollect.collectors.loops.buffers import store
from hpccollect.collectors.loops.trajectories import flatten_unnamed
from hpccollect.errors import ArgumentValueError

__all__ = ["TRAJ_FORMATS", "TrajectoryAssembler", "check_traj_options"]

TRAJ_FORMATS = ("padded", "cat")
_IDS = ("collector", "traj_ids")
_MASK = ("collector", "mask")
_DONE_KEYS = (("next", "done"), ("next", "terminated"), ("next", "truncated"))


def check_traj_options(
    trajs_per_batch: Any, trajs_per_write: Any, traj_format: Any, has_buffer: bool
) -> tuple[int | None, int | None, str]:
    """The checked ``(trajs_per_batch, trajs_per_write, traj_format)``; ``traj_format=None``
    resolves to ``"padded"`` with TorchRL's FutureWarning when whole-trajectory batches are
    yielded (its default becomes ``"cat"`` in torchrl 0.16)."""
    if trajs_per_batch is not None:
        trajs_per_batch = check_int(
            "trajs_per_batch",
            trajs_per_batch,
            minimum=1,
            hint="It is the number of complete trajectories in each yielded batch.",
        )
    if trajs_per_write is not None:
        trajs_per_write = max(check_int("trajs_per_write", trajs_per_write), 1)
    if traj_format is None:
        if trajs_per_batch is not None and not has_buffer:
            warnings.warn(
                "trajs_per_batch is set but traj_format is not: batches are 'padded' "
                "([trajs_per_batch, max_len] with a ('collector', 'mask')); as TorchRL's, the "
                "default will change to 'cat' in torchrl v0.16. Pass traj_format='padded' or "
                "traj_format='cat' to choose.",
                FutureWarning,
                stacklevel=4,
            )
        return trajs_per_batch, trajs_per_write, "padded"
    if traj_format not in TRAJ_FORMATS:
        raise ArgumentValueError(f"traj_format must be 'padded' or 'cat', got {traj_format!r}.")
    if traj_format != "padded" and trajs_per_batch is None:
        raise ArgumentValueError(
            f"traj_format={traj_format!r} only applies to whole-trajectory batches: set "
            "trajs_per_batch to the number of complete trajectories per batch, or drop "
            "traj_format."
        )
    return trajs_per_batch, trajs_per_write, traj_format


class TrajectoryAssembler:
    """Collects the pieces of each trajectory (by ``("collector", "traj_ids")``) until it is
    done; completed trajectories queue up in the order they finished."""

    def __init__(
        self, trajs_per_batch: int, traj_format: str = "padded", trajs_per_write: int | None = None
    ) -> None:
        self.trajs_per_batch = trajs_per_batch
        self.traj_format = traj_format
        self.trajs_per_write = trajs_per_write
        self._partial: dict[int, list[TensorDictBase]] = {}
        self._complete: list[TensorDictBase] = []

    # ------------------------------------------------------------------ feeding
    def ingest(self, batch: TensorDictBase) -> None:
        """Sort a batch's frames into their trajectories (frames with id -1, the padding of a
        preempted worker, belong to none)."""
        if _IDS not in batch.keys(True):
            raise ArgumentValueError(
                "trajs_per_batch needs ('collector', 'traj_ids') in every batch: leave "
                "track_traj_ids=True and split_trajs=False."
            )
        flat = _flat(batch)
        ids = flat.get(_IDS)
        keep = ids != -1
        if not bool(keep.all()):
            flat, ids = flat[keep], ids[keep]
        order = torch.argsort(ids, stable=True)  # env-major then time: each id's steps in order
        flat, ids = flat[order], ids[order]
        uniq, counts = torch.unique_consecutive(ids, return_counts=True)
        start = 0
        for tid, count in zip(uniq.tolist(), counts.tolist(), strict=True):
            chunk = flat[start : start + count]
            start += count
            pieces = self._partial.setdefault(tid, [])
            pieces.append(chunk)
            if _ends_done(chunk):
                del self._partial[tid]
                self._complete.append(torch.cat(pieces, 0) if len(pieces) > 1 else chunk)

    def drop_in_flight(self, traj_ids: Iterable[int] | None = None) -> None:
        """Forget unfinished trajectories (all, or those ``traj_ids``): their envs were reset."""
        if traj_ids is None:
            self._partial.clear()
            return
        for tid in traj_ids:
            self._partial.pop(tid, None)

    def in_flight(self) -> list[int]:
        """The ids of unfinished trajectories."""
        return list(self._partial)

    def clear(self) -> None:
        """Forget everything held, complete or not (after a reset of every env)."""
        self._partial.clear()
        self._complete.clear()

    # ------------------------------------------------------------------ output
    def ready(self) -> Iterator[TensorDictBase]:
        """Each batch of ``trajs_per_batch`` complete trajectories that can be made now."""
        while len(self._complete) >= self.trajs_per_batch:
            trajs = self._complete[: self.trajs_per_batch]
            del self._complete[: self.trajs_per_batch]
            yield _cat(trajs) if self.traj_format == "cat" else _padded(trajs)

    def writes(self) -> Iterator[TensorDictBase]:
        """The complete trajectories, flat, ``trajs_per_write`` at a time (all at once when
        None): what goes into a replay buffer."""
        while self._complete:
            n = self.trajs_per_write or len(self._complete)
            trajs = self._complete[:n]
            del self._complete[:n]
            yield _cat(trajs)

    def run(
        self,
        batches: Iterable[TensorDictBase | None],
        buffer: Any = None,
        drop_in_flight_each_batch: bool = False,
    ) -> Iterator[TensorDictBase | None]:
        """A collector's iteration in whole trajectories: yields a batch whenever one is
        complete; with a ``buffer``, extends it with the trajectories and yields None per batch."""
        for batch in batches:
            if batch is None:
                continue
            self.ingest(batch)
            if drop_in_flight_each_batch:
                self.drop_in_flight()
            if buffer is not None:
                for trajs in self.writes():
                    store(buffer, trajs, True)
                yield None
            else:
                yield from self.ready()


def _flat(batch: TensorDictBase) -> TensorDictBase:
    """The batch as one ``[frames]`` dim, env-major then time; a ``[T]`` batch keeps its name
    (reshaping it changes nothing: TorchRL's trajectories keep "time" then too)."""
    return batch if batch.ndim == 1 else flatten_unnamed(batch)


def _ends_done(chunk: TensorDictBase) -> bool:
    for key in _DONE_KEYS:
        done = chunk.get(key, None)
        if done is not None and bool(done[-1].any()):
            return True
    return False


def _cat(trajs: list[TensorDictBase]) -> TensorDictBase:
    return torch.cat(trajs, 0) if len(trajs) > 1 else trajs[0]


def _padded(trajs: list[TensorDictBase]) -> TensorDictBase:
    """Zero-padded along time to the longest, stacked ``[n, max_len]``, with the mask."""
    longest = max(t.shape[0] for t in trajs)
    rows = []
    for traj in trajs:
        traj = traj.copy()
        traj.set(_MASK, torch.ones(traj.shape[0], dtype=torch.bool, device=traj.device))
        missing = longest - traj.shape[0]
        rows.append(pad(traj, [0, missing]) if missing else traj)
    return torch.stack(rows, 0)
