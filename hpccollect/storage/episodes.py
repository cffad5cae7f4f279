"""Collector batches cut into whole episodes, for any dataset format.

A collector's batch holds pieces of episodes: one may have begun in an earlier batch, one may
go on in the next, and with several envs their rows interleave. ``EpisodeAssembler.take`` turns
each batch into the episodes that ended in it (steps in time order, grouped by episode) and
keeps the open ones' steps until they end; ``finish`` gives those as truncated. Writers of every
format (``Sink`` subclasses) write what it hands them and never look at trajectory ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tensordict import TensorDictBase

from hpccollect.errors import ArgumentValueError
from hpccollect.storage.layout import Key, keymap_for

__all__ = ["EpisodeAssembler", "Episodes"]

TRAJ: Key = ("collector", "traj_ids")
MASK: Key = ("collector", "mask")
#: the entries an episode cut short (end of run, a reset before done) has set on its last step
_CUT = (("next", "truncated"), ("next", "done"))


@dataclass
class Episodes:
    """Whole episodes, one after the other: ``data`` maps each dataset name to its rows,
    ``ids`` is each episode's trajectory id and ``lengths`` its number of steps."""

    data: dict[str, np.ndarray]
    ids: np.ndarray
    lengths: np.ndarray

    @property
    def steps(self) -> int:
        return int(self.lengths.sum())

    def returns(self, rewards: str = "rewards") -> list[float]:
        """Each episode's summed reward (empty when there is no ``rewards`` dataset)."""
        if rewards not in self.data or not len(self.lengths):
            return []
        starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]])
        values = self.data[rewards].reshape(self.steps).astype(np.float64)  # one per step
        return np.add.reduceat(values, starts).tolist()


class EpisodeAssembler:
    """Cuts batches into whole episodes; ``keymap`` (dataset name -> TensorDict key) is taken
    from the first batch and every later one must have the same keys."""

    def __init__(self) -> None:
        self.keymap: dict[str, Key] | None = None
        self._pending: dict[int, list[dict[str, np.ndarray]]] = {}

    @property
    def open_episodes(self) -> int:
        """Episodes started but not ended yet."""
        return len(self._pending)

    def take(self, batch: TensorDictBase) -> Episodes | None:
        """The episodes that end in ``batch`` (``[T]``, ``[N, T]``, ``[W, N, T]`` or split
        trajectories); None when none does."""
        keys = [k if isinstance(k, tuple) else (k,) for k in batch.keys(True, True)]
        if TRAJ not in keys:
            raise ArgumentValueError(
                "the batch has no ('collector', 'traj_ids'): a dataset writer needs a "
                "collector's output to group steps into episodes."
            )
        keys = [k for k in keys if k != MASK]
        if self.keymap is None:
            self.keymap = keymap_for(keys)
        if not batch.batch_size.numel():
            return None
        arrays, ids, done, row_end = self._flatten(batch, keys)
        if not len(ids):
            return None
        # segments: runs of one trajectory id within one env row
        cut = np.flatnonzero((ids[1:] != ids[:-1]) | row_end[:-1]) + 1
        starts = np.concatenate([[0], cut])
        stops = np.concatenate([cut, [len(ids)]])
        ended = done[stops - 1]
        closes = ended | ~row_end[stops - 1]  # done, or followed by another trajectory in its row
        row_start = np.ones(len(ids), dtype=bool)
        row_start[1:] = row_end[:-1]
        # only a row's first segment (it may continue a pending episode) and a segment that
        # stays open need Python; every other segment is a whole episode inside this batch
        special = np.flatnonzero(row_start[starts] | ~closes)
        fresh = np.ones(len(starts), dtype=bool)
        parts: list[Episodes] = []
        for k in special:
            tid = int(ids[starts[k]])
            if tid in self._pending or not closes[k]:
                fresh[k] = False
                view = {p: a[starts[k] : stops[k]] for p, a in arrays.items()}
                if closes[k]:  # the episode ends here: join its earlier parts, no extra copy
                    self._pending[tid].append(view)
                    parts.append(self._episode(tid, not ended[k]))
                else:  # still open: keep a copy (the batch's buffers may be reused)
                    self._pending.setdefault(tid, []).append({p: v.copy() for p, v in view.items()})
        if fresh.any():
            parts.append(self._gather(arrays, ids, starts[fresh], stops[fresh], ended[fresh]))
        return _joined(parts)

    def finish(self) -> Episodes | None:
        """The episodes still open, each ended as truncated; None when there are none."""
        return _joined([self._episode(tid, True) for tid in list(self._pending)])

    def _flatten(self, batch: TensorDictBase, keys: list[Key]):
        """Row-major arrays over every env row: {path: [R*T, ...]}, ids, done, row ends."""
        paths = self.keymap
        if set(paths.values()) != set(keys):
            raise ArgumentValueError(
                "this batch's keys differ from the first batch's: "
                f"{sorted(map(str, set(keys) ^ set(paths.values())))}; one writer takes one layout."
            )
        time_len = batch.shape[-1]
        flat = batch.reshape(-1, time_len) if batch.batch_dims != 1 else batch.unsqueeze(0)
        rows = flat.shape[0]
        keep = None
        if MASK in batch.keys(True, True):
            keep = flat.get(MASK).numpy().reshape(-1)
        row_end = np.zeros((rows, time_len), dtype=bool)
        row_end[:, -1] = True
        row_end = row_end.reshape(-1)
        arrays = {}
        for p, k in paths.items():
            value = flat.get(k).detach().cpu().numpy()
            arrays[p] = value.reshape(rows * time_len, *value.shape[2:])
        ids = flat.get(TRAJ).numpy().reshape(-1)
        done = flat.get(("next", "done")).numpy().reshape(-1)
        if keep is not None:  # split trajectories: drop padding, a row ends at its last real step
            last = np.zeros_like(keep)
            counts = keep.reshape(rows, time_len).sum(1)
            ends = np.flatnonzero(counts) * time_len + counts[counts > 0] - 1
            last[ends] = True
            arrays = {p: a[keep] for p, a in arrays.items()}
            ids, done, row_end = ids[keep], done[keep], last[keep]
        return arrays, ids, done, row_end

    def _gather(self, arrays, ids, starts, stops, ended) -> Episodes:
        """Whole episodes that lie inside this batch, taken with one index per dataset."""
        lengths = stops - starts
        index = np.repeat(starts - np.cumsum(np.concatenate([[0], lengths[:-1]])), lengths)
        index += np.arange(lengths.sum())
        block = {p: a[index] for p, a in arrays.items()}
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        for k in np.flatnonzero(~ended):  # cut short (a reset): record as truncated
            self._mark_truncated(block, offsets[k + 1] - 1)
        return Episodes(block, ids[starts], lengths)

    def _episode(self, tid: int, cut: bool) -> Episodes:
        """The pending segments of ``tid`` as one episode (truncated at its end if ``cut``)."""
        segments = self._pending.pop(tid)
        episode = {p: np.concatenate([s[p] for s in segments]) for p in segments[0]}
        if cut:  # ended without done (end of run, or a reset): record it as truncated
            self._mark_truncated(episode, -1)
        length = len(next(iter(episode.values())))
        return Episodes(episode, np.array([tid]), np.array([length]))

    def _mark_truncated(self, data: dict[str, np.ndarray], row: int) -> None:
        for path, key in self.keymap.items():
            if key in _CUT:
                data[path][row] = True


def _joined(parts: list[Episodes]) -> Episodes | None:
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    data = {p: np.concatenate([part.data[p] for part in parts]) for p in parts[0].data}
    return Episodes(
        data,
        np.concatenate([part.ids for part in parts]),
        np.concatenate([part.lengths for part in parts]),
    )
