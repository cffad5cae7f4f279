"""``HDF5Writer``: collector batches -> an HDF5 shard of whole episodes, safe against crashes.

Rows are transitions grouped by episode, in time order. Steps of an episode that has not ended
wait in memory; when it ends, the whole episode is appended, then ``committed_steps`` and
``committed_episodes`` are updated, then the file is flushed (and fsync'ed every few appends).
A reader trusts only the committed rows, so a ``kill -9`` loses at most the episodes in flight.
The file is ``<path>.partial`` while open and renamed to ``<path>`` when closed.
"""

from __future__ import annotations

import datetime
import os
import uuid
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from tensordict import TensorDictBase

from hpccollect._version import __version__
from hpccollect.errors import ArgumentTypeError, ArgumentValueError, StorageError
from hpccollect.storage.diskspace import describe_os_error
from hpccollect.storage.h5append import DEFAULT_EXPECTED_ROWS, RowAppender, chunk_rows
from hpccollect.storage.layout import (
    EPISODE,
    SQUEEZED,
    Key,
    keymap_for,
    keymap_to_json,
)
from hpccollect.storage.metadata import env_metadata
from hpccollect.storage.sink import Sink
from hpccollect.storage.spaces_json import describe

__all__ = ["DEFAULT_EXPECTED_ROWS", "FORMAT_VERSION", "HDF5Writer", "chunk_rows", "partial_path"]

FORMAT_VERSION = 1
_TRAJ: Key = ("collector", "traj_ids")
_MASK: Key = ("collector", "mask")
_COMPRESSIONS = (None, "gzip", "lzf")


def partial_path(path: str | os.PathLike) -> Path:
    """Where a file is written until it is closed."""
    path = Path(path)
    return path.with_name(path.name + ".partial")


class HDF5Writer(Sink):
    """Writes collector batches to one HDF5 file (one shard per writing process).

    Use it as a collector's ``replay_buffer`` (so ``start()`` streams to disk), or call
    ``extend(batch)`` on each batch a collector yields. Close it (or use ``with``) to write the
    episodes still open as truncated and to give the file its final name.

    Args:
        path: the final file name (``.h5``).
        env: the env id, ``EnvSpec``, gymnasium env or ``GymEnv`` the data comes from: its id,
            spec (kwargs, ``max_episode_steps``, wrappers) and spaces are recorded.
        env_kwargs: with an env id, the keyword arguments it was made with (``--env-kwargs``).
        run_id: the run this shard belongs to; the shards of one run share it (default: new).
        shard: this shard's index within its run (a distributed job's rank).
        config: the collector configuration to record (any JSON-able mapping).
        seed: the seed of the run.
        compression: None (default, fastest), ``"gzip"`` or ``"lzf"``.
        chunk_bytes: the largest chunk per dataset.
        expected_rows: about how many rows the file will hold (``total_frames``): chunks are
            sized from it and each dataset's row size, so a small run makes a small file.
            Default: a few thousand rows' worth (small chunks).
        fsync_every: fsync the file every this many appends (flush happens at every append).
        overwrite: replace an existing file of that name.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        env: Any = None,
        env_kwargs: dict | None = None,
        run_id: str | None = None,
        shard: int = 0,
        config: dict | None = None,
        seed: int | None = None,
        compression: str | None = None,
        chunk_bytes: int = 1 << 20,
        expected_rows: int | None = None,
        fsync_every: int = 8,
        overwrite: bool = False,
    ) -> None:
        if expected_rows is not None and (
            isinstance(expected_rows, bool)
            or not isinstance(expected_rows, int)
            or expected_rows < 1
        ):
            raise ArgumentValueError(
                f"expected_rows must be a positive integer (or None), got {expected_rows!r}."
            )
        if compression not in _COMPRESSIONS:
            raise ArgumentValueError(
                f"compression={compression!r} is not supported; use one of {_COMPRESSIONS}."
            )
        self.path = Path(path)
        self.partial = partial_path(self.path)
        for existing in (self.path, self.partial):
            if existing.exists() and not overwrite:
                raise ArgumentValueError(
                    f"{existing} already exists; pass overwrite=True (--overwrite) to replace it"
                    + (
                        ", or repair it with hpccollect.storage.repair()"
                        if existing == self.partial
                        else ""
                    )
                    + "."
                )
        self.compression, self.chunk_bytes, self.fsync_every = compression, chunk_bytes, fsync_every
        self.expected_rows = expected_rows
        self.failed: StorageError | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = h5py.File(self.partial, "w")
            self._rows = RowAppender(
                self._file,
                self.partial,
                compression=compression,
                chunk_bytes=chunk_bytes,
                expected_rows=expected_rows,
            )
        except (OSError, RuntimeError) as err:
            raise StorageError(f"cannot create {self.partial}: {describe_os_error(err)}") from err
        self._pending: dict[int, list[dict[str, np.ndarray]]] = {}
        self._keymap: dict[str, Key] | None = None
        self.committed_steps = self.committed_episodes = 0
        self.returns: list[float] = []
        self._appends = 0
        self._closed = False
        self._write_metadata(env, env_kwargs, config, seed, run_id, shard)
        try:  # a reader can open the file from now on
            self._file.flush()
        except (OSError, RuntimeError) as err:
            self.failed = StorageError(f"cannot write {self.partial}: {describe_os_error(err)}")
            self._closed = True
            self._close_file()
            raise self.failed from err

    def _write_metadata(
        self,
        env: Any,
        env_kwargs: dict | None,
        config: dict | None,
        seed: int | None,
        run_id: str | None,
        shard: int,
    ) -> None:
        try:
            env_attrs = env_metadata(env, env_kwargs)
            if isinstance(shard, bool) or not isinstance(shard, int) or shard < 0:
                raise ArgumentValueError(f"shard must be an integer >= 0, got {shard!r}.")
        except Exception:  # a bad argument leaves no file behind
            self._file.close()
            self.partial.unlink()
            raise
        attrs = self._file.attrs
        attrs["format_version"] = FORMAT_VERSION
        attrs["hpccollect_version"] = __version__
        attrs["created"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
        attrs["committed_steps"] = np.int64(0)
        attrs["committed_episodes"] = np.int64(0)
        attrs["collector_config"] = describe(config or {})
        attrs["run_id"] = str(run_id) if run_id is not None else uuid.uuid4().hex
        attrs["shard"] = shard
        if seed is not None:
            attrs["seed"] = int(seed)
        for key, value in env_attrs.items():
            attrs[key] = value

    # ------------------------------------------------------------------ input
    def extend(self, batch: TensorDictBase) -> None:
        """Take a collector batch (``[T]``, ``[N, T]``, ``[W, N, T]`` or split trajectories)."""
        if self.failed is not None:
            raise StorageError(
                f"{self.partial}: no more writes after an earlier error: {self.failed}"
            )
        if self._closed:
            raise ArgumentValueError(f"{self.path} is closed; open a new HDF5Writer to write more.")
        if not isinstance(batch, TensorDictBase):
            raise ArgumentTypeError(f"extend() takes a TensorDict, got {type(batch).__name__}.")
        if _TRAJ not in batch.keys(True, True):
            raise ArgumentValueError(
                "the batch has no ('collector', 'traj_ids'): HDF5Writer needs a collector's output "
                "to group steps into episodes."
            )
        keys = [k if isinstance(k, tuple) else (k,) for k in batch.keys(True, True)]
        keys = [k for k in keys if k != _MASK]
        if self._keymap is None:
            self._keymap = keymap_for(keys)
        arrays, ids, done, row_end = self._flatten(batch, keys)
        if not len(ids):
            return
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
        episodes: list[tuple[int, dict[str, Any]]] = []
        for k in special:
            tid = int(ids[starts[k]])
            if tid in self._pending or not closes[k]:
                fresh[k] = False
                view = {p: a[starts[k] : stops[k]] for p, a in arrays.items()}
                if closes[k]:  # the episode ends here: join its earlier parts, no extra copy
                    self._pending[tid].append(view)
                    episodes.append(self._episode(tid, not ended[k]))
                else:  # still open: keep a copy (the batch's buffers may be reused)
                    self._pending.setdefault(tid, []).append({p: v.copy() for p, v in view.items()})
        if fresh.any():
            episodes += self._gather(arrays, ids, starts[fresh], stops[fresh], ended[fresh])
        if episodes:
            self._commit(episodes)

    def _flatten(self, batch: TensorDictBase, keys: list[Key]):
        """Row-major arrays over every env row: {path: [R*T, ...]}, ids, done, row ends."""
        paths = self._keymap
        if set(paths.values()) != set(keys):
            raise ArgumentValueError(
                "this batch's keys differ from the first batch's: "
                f"{sorted(map(str, set(keys) ^ set(paths.values())))}; one writer takes one layout."
            )
        time_len = batch.shape[-1]
        flat = batch.reshape(-1, time_len) if batch.batch_dims != 1 else batch.unsqueeze(0)
        rows = flat.shape[0]
        keep = None
        if _MASK in batch.keys(True, True):
            keep = flat.get(_MASK).numpy().reshape(-1)
        row_end = np.zeros((rows, time_len), dtype=bool)
        row_end[:, -1] = True
        row_end = row_end.reshape(-1)
        arrays = {}
        for p, k in paths.items():
            value = flat.get(k).detach().cpu().numpy()
            arrays[p] = value.reshape(rows * time_len, *value.shape[2:])
        ids = flat.get(_TRAJ).numpy().reshape(-1)
        done = flat.get(("next", "done")).numpy().reshape(-1)
        if keep is not None:  # split trajectories: drop padding, a row ends at its last real step
            last = np.zeros_like(keep)
            counts = keep.reshape(rows, time_len).sum(1)
            ends = np.flatnonzero(counts) * time_len + counts[counts > 0] - 1
            last[ends] = True
            arrays = {p: a[keep] for p, a in arrays.items()}
            ids, done, row_end = ids[keep], done[keep], last[keep]
        return arrays, ids, done, row_end

    def _gather(self, arrays, ids, starts, stops, ended):
        """Whole episodes that lie inside this batch, taken with one index per dataset."""
        lengths = stops - starts
        index = np.repeat(starts - np.cumsum(np.concatenate([[0], lengths[:-1]])), lengths)
        index += np.arange(lengths.sum())
        block = {p: a[index] for p, a in arrays.items()}
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        for k in np.flatnonzero(~ended):  # cut short (a reset): record as truncated
            self._mark_truncated(block, offsets[k + 1] - 1)
        return [(-1, {"__block__": block, "__ids__": ids[starts], "__lengths__": lengths})]

    def _episode(self, tid: int, cut: bool) -> tuple[int, dict[str, np.ndarray]]:
        """The pending segments of ``tid`` as one episode (truncated at its end if ``cut``)."""
        segments = self._pending.pop(tid)
        episode = {p: np.concatenate([s[p] for s in segments]) for p in segments[0]}
        if cut:  # ended without done (end of run, or a reset): record it as truncated
            self._mark_truncated(episode, -1)
        return tid, episode

    def _mark_truncated(self, data: dict[str, np.ndarray], row: int) -> None:
        for path, key in self._keymap.items():
            if key in (("next", "truncated"), ("next", "done")):
                data[path][row] = True

    # ------------------------------------------------------------------ output
    def _commit(self, episodes: list[tuple[int, dict[str, Any]]]) -> None:
        """Append whole episodes, flush, then move the committed counters and flush again.

        Each item is (traj id, arrays) for one episode, or a block of several episodes
        (``__block__`` arrays with their ``__ids__`` and ``__lengths__``).
        """
        parts, tids, lengths = [], [], []
        for tid, episode in episodes:
            if "__block__" in episode:
                parts.append(episode["__block__"])
                tids.append(episode["__ids__"])
                lengths.append(episode["__lengths__"])
            else:
                parts.append(episode)
                tids.append(np.array([tid]))
                lengths.append(np.array([len(next(iter(episode.values())))]))
        if len(parts) == 1:
            data = dict(parts[0])
        else:
            data = {p: np.concatenate([part[p] for part in parts]) for p in parts[0]}
        data = {p: (a.reshape(len(a)) if p in SQUEEZED else a) for p, a in data.items()}
        tids, lengths = np.concatenate(tids), np.concatenate(lengths)
        data[EPISODE] = np.repeat(tids.astype(np.int64), lengths)
        start, n = self.committed_steps, len(data[EPISODE])
        try:
            if "keymap" not in self._file.attrs:
                self._file.attrs["keymap"] = keymap_to_json(self._keymap)
                self._file.attrs["squeezed"] = sorted(SQUEEZED & set(self._keymap))
            self._rows.append(data, start)  # raises before writing when the disk is too full
            self._file.flush()  # the rows are written before any counter covers them
            self._appends += 1
            if self._appends % self.fsync_every == 0:
                self._rows.fsync()
            self._rows.write_counters(start + n, self.committed_episodes + len(tids))
            self._file.flush()
        except (OSError, RuntimeError) as err:
            raise self._fail(err) from err
        self.committed_steps += n
        self.committed_episodes += len(tids)
        if "rewards" in data:
            starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
            self.returns += np.add.reduceat(data["rewards"].astype(np.float64), starts).tolist()

    def _fail(self, err: BaseException) -> StorageError:
        """Remember the first write error; the file keeps its committed rows and stays partial."""
        if self.failed is None:
            self.failed = StorageError(
                f"cannot write {self.partial}: {describe_os_error(err)}; its "
                f"{self.committed_steps} committed rows ({self.committed_episodes} episodes) are "
                f"kept: free space, then run `python -m hpccollect repair {self.partial}`."
            )
            self.failed.errno = getattr(err, "errno", None)
        return self.failed

    @property
    def open_episodes(self) -> int:
        """Episodes started but not ended yet (written as truncated at close)."""
        return len(self._pending)

    def close(self) -> Path:
        """Write open episodes as truncated, fsync, close, and rename to the final name.

        After a write error (``self.failed``) nothing more is written: the file stays
        ``.partial`` with its committed rows, and its path is returned.
        """
        if self._closed:
            return self.path if self.failed is None else self.partial
        try:
            if self.failed is None:
                if self._pending:
                    self._commit([self._episode(tid, True) for tid in list(self._pending)])
                try:
                    self._file.attrs["complete"] = True
                    self._file.flush()
                    self._rows.fsync()
                except (OSError, RuntimeError) as err:
                    raise self._fail(err) from err
        finally:
            self._closed = True
            self._close_file()
        if self.failed is not None:
            return self.partial
        os.replace(self.partial, self.path)
        return self.path

    def _close_file(self) -> None:
        """Close the HDF5 file (after an error, without writing more), then give back the space
        reserved past its end."""
        if self.failed is not None:
            self._rows.freeze()
        self._rows.forget()
        try:
            self._file.close()
        except (OSError, RuntimeError) as err:
            self._fail(err)
        self._rows.release()

    def __enter__(self) -> HDF5Writer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __len__(self) -> int:
        return self.committed_steps

    def __repr__(self) -> str:
        return (
            f"HDF5Writer({str(self.path)!r}, committed_steps={self.committed_steps}, "
            f"committed_episodes={self.committed_episodes}, open_episodes={self.open_episodes})"
        )
