"""Where a job's batches go: the ``Sink`` contract every dataset format's writer fulfils, the
formats registered by name (writer, reader, merge, repair), and ``EpisodeTally``, a sink that
keeps nothing but the episode count and returns.

The application reaches datasets only through this module: a new format (Zarr, Minari's Arrow
layout, Parquet) is one module with a ``Sink`` and a ``StorageFormat``, registered by name:
``register_format("zarr", "my_module:ZARR")`` (or an ``hpccollect.storage_formats`` entry point
of an installed package).
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from hpccollect._lazy import add_object, loaded_objects
from hpccollect.errors import ArgumentValueError, StorageError

if TYPE_CHECKING:
    from tensordict import TensorDictBase

__all__ = [
    "EpisodeReturns",
    "EpisodeTally",
    "Sink",
    "StorageFormat",
    "dataset_format",
    "merge_datasets",
    "open_sink",
    "read_dataset",
    "register_format",
    "repair_dataset",
]

_S = TypeVar("_S", bound="Sink")


class Sink(abc.ABC):
    """Takes a collector's batches and keeps whole episodes, safe against crashes: what it has
    committed stays readable whatever happens to the process. A writer cuts batches into
    episodes with ``storage.episodes.EpisodeAssembler`` and writes what that hands it.

    Attributes:
        path: the dataset's final name (None for a sink that keeps no data).
        failed: the first write error, after which nothing more is written.
        committed_steps: steps written and committed.
        committed_episodes: episodes written and committed.
        returns: each committed episode's return, in commit order.
    """

    path: Path | None = None
    failed: StorageError | None = None
    committed_steps: int = 0
    committed_episodes: int = 0
    returns: list[float]

    @abc.abstractmethod
    def extend(self, batch: TensorDictBase) -> None:
        """Take one collector batch.

        Args:
            batch: ``[T]``, ``[N, T]``, ``[W, N, T]`` or split trajectories, as collectors yield.
        """

    @abc.abstractmethod
    def close(self) -> Path | None:
        """Keep the episodes still open as truncated and finish the dataset.

        Returns:
            Where it is: its final name, or the unfinished file after a write error; None for a
            sink that writes no file.
        """

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class EpisodeReturns:
    """The returns of the episodes that end, batch after batch: each trajectory's reward is
    summed across batches until a ``done`` ends it. Rows with trajectory id -1 (padding) are
    skipped."""

    def __init__(self) -> None:
        self._running: dict[int, float] = {}

    def ended(self, batch: TensorDictBase) -> tuple[list[float], int]:
        """The returns of the episodes ``batch`` ends, in trajectory-id order, and its number of
        real (not padded) frames."""
        ids = batch.get(("collector", "traj_ids")).reshape(-1).numpy()
        rewards = batch.get(("next", "reward")).reshape(ids.shape[0], -1)[:, 0].double().numpy()
        done = batch.get(("next", "done")).reshape(-1).numpy()
        keep = ids >= 0
        ids, rewards, done = ids[keep], rewards[keep], done[keep]
        unique, inverse = np.unique(ids, return_inverse=True)
        sums = np.bincount(inverse, weights=rewards, minlength=len(unique))
        ends = np.zeros(len(unique), dtype=bool)
        ends[inverse[done]] = True
        ended = []
        for tid, total, end in zip(unique.tolist(), sums.tolist(), ends.tolist(), strict=True):
            total += self._running.pop(tid, 0.0)
            if end:
                ended.append(total)
            else:
                self._running[tid] = total
        return ended, int(keep.sum())


class EpisodeTally(Sink):
    """Counts the episodes that end and their returns, keeping no data: where the data is
    written elsewhere (each collector rank writes its own shard) and this process still shows
    progress."""

    def __init__(self) -> None:
        self.returns = []
        self._episodes = EpisodeReturns()

    def extend(self, batch: TensorDictBase) -> None:
        ended, frames = self._episodes.ended(batch)
        self.returns.extend(ended)
        self.committed_episodes = len(self.returns)
        self.committed_steps += frames

    def close(self) -> None:
        return None


@dataclass(frozen=True)
class StorageFormat:
    """One dataset format: how its files are written, read, merged and repaired.

    Attributes:
        name: what ``open_sink(format=...)`` calls it.
        suffixes: the file name endings that are this format (the first one is the default).
        writer: ``writer(path, **options) -> Sink``.
        open: ``open(path)``: a reader of a finished (or partial) dataset.
        merge: ``merge(shards, out, overwrite=...)``: one dataset over several shards.
        repair: ``repair(path)``: a crashed writer's file made readable, its committed part kept.
        partial_path: where a dataset is written until it is closed.
    """

    name: str
    suffixes: tuple[str, ...]
    writer: Callable[..., Sink]
    open: Callable[[Path], Any]
    merge: Callable[..., Any]
    repair: Callable[[Path], Any]
    partial_path: Callable[[str | os.PathLike], Path]


_FORMATS: dict[str, StorageFormat | str] = {}  # a StorageFormat, or "module:attr" naming one


def register_format(name: str | StorageFormat, target: str | None = None) -> None:
    """Offer a dataset format under its name and its file name endings.

    Args:
        name: its name; or a ``StorageFormat``, registered under its own name.
        target: ``"module:attr"`` naming the ``StorageFormat``, imported on first use.
    """
    add_object(_FORMATS, name, target, StorageFormat, "register_format")


def _formats() -> dict[str, StorageFormat]:
    """Every registered format (installed packages' ``hpccollect.storage_formats`` too), loaded."""
    return loaded_objects("storage format", _FORMATS, StorageFormat)


def dataset_format(path: str | os.PathLike | None = None, name: str | None = None) -> StorageFormat:
    """The format called ``name``, or the one whose file name ending ``path`` has (a
    ``.partial`` file is its format's too); HDF5 for a name with no known ending."""
    formats = _formats()
    if name is not None:
        if name not in formats:
            raise ArgumentValueError(f"format must be one of {list(formats)}, got {name!r}.")
        return formats[name]
    file = str(path or "").removesuffix(".partial")
    for fmt in formats.values():
        if file.endswith(fmt.suffixes):
            return fmt
    return formats["hdf5"]


def read_dataset(path: str | os.PathLike) -> Any:
    """Open a dataset for reading, in the format its file name ending says.

    Args:
        path: a finished dataset, a merged view, or a ``.partial`` file still being written.

    Returns:
        The format's reader (for HDF5, an ``H5Dataset``).
    """
    return dataset_format(path).open(Path(path))


def repair_dataset(path: str | os.PathLike) -> Path:
    """Make a crashed or killed writer's file readable, its committed rows kept.

    Args:
        path: the unfinished dataset (its ``.partial`` file).

    Returns:
        Where the repaired dataset now is (its final name).
    """
    return dataset_format(path).repair(Path(path))


def merge_datasets(shards: Any, out: str | os.PathLike, **options: Any) -> Path:
    """Put several shards of one run behind one dataset, in the format ``out``'s ending says.

    Args:
        shards: the shards' paths.
        out: the merged dataset's path.
        **options: the format's merge's (``overwrite=True`` replaces an existing ``out``).

    Returns:
        Where the merged dataset is.
    """
    return dataset_format(out).merge(shards, out, **options)


def open_sink(path: str | os.PathLike, *, format: str | None = None, **options: Any) -> Sink:
    """A sink that writes a new dataset at ``path``: ``extend(batch)`` with each batch, then
    ``close()``.

    Args:
        path: the dataset's final file name (it is written under ``partial_path`` until closed).
        format: a registered format's name (default: the one the file name's ending says;
            HDF5 for an ending no format claims).
        **options: that format's writer's (for HDF5, ``HDF5Writer``'s: ``env``, ``seed``, ...).

    Returns:
        The format's writer."""
    return dataset_format(path, format).writer(path, **options)
