"""Continuing a run that stopped early (preemption, the time limit, a crash): ``collect --resume``.

A run is known by its dataset path (``run.h5``, or the run directory holding it). Each resumed
attempt collects what the run still lacks into new files under ``run.shards/`` and then writes
``run.h5`` as a merged view over the files of every attempt, so nothing on disk is rewritten and
no episode is counted twice:

* the resume first repairs unfinished files (``.partial``: the committed rows of an attempt that
  crashed) and moves a first attempt's single file to ``run.shards/attempt-0.h5``; ``run.h5`` is
  then at once a view over everything kept so far;
* attempt k writes ``run.shards/attempt-k.h5`` (one writer) or ``attempt-k.rank-NNNN.h5`` per
  collector rank (``--shards``); its budget is the run's ``--total-frames`` less the committed
  frames on disk, in whole batches (a crash loses the rows of its unfinished episodes, so the
  last batch may pass the total by less than one batch);
* env, env kwargs, imports, policy, episode length and seed are the run's, read from its files
  (given again on the command line they must match); attempt k seeds its envs and sampling with
  the run's seed plus ``k * SEED_STRIDE`` so that no attempt replays another's episodes, while
  the default policy's weights keep the run's seed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpccollect.app.config import MAX_SEED, RUN_OPTIONS, RunConfig, current_spelling
from hpccollect.errors import ArgumentValueError, HpcCollectError, StorageError
from hpccollect.storage import (
    drop_staging,
    final_path,
    merge_datasets,
    read_dataset,
    repair_dataset,
    staging_path,
)

__all__ = [
    "RUN_OPTIONS",
    "SEED_STRIDE",
    "Attempt",
    "RunComplete",
    "find_run",
    "remove_run_files",
    "resumed_config",
    "run_files",
    "start_attempt",
]

SEED_STRIDE = 1_000_003
#: options a resumed run takes from its record; the others (launcher, backend, addresses, the
#: worker timeout, gathering) describe the new allocation and come from the command line
_RECORDED = (
    "env",
    "env_kwargs",
    "imports",
    "num_envs",
    "num_workers",
    "collector",
    "frames_per_batch",
    "total_frames",
    "max_steps",
    "seed",
    "policy",
    "compression",
)
#: what the data is: given again, they must equal the record
_FIXED = ("env", "env_kwargs", "imports", "policy", "max_steps", "seed")
#: a file of an attempt: finished, unfinished (``.partial``) or being made (``.partial.new``,
#: see ``staging_path``)
_PIECE = re.compile(r"^(?:attempt-(\d+)(?:\.rank-(\d+))?|rank-(\d+))\.h5(\.partial(?:\.new)?)?$")


class RunComplete(HpcCollectError):
    """The run already holds every frame it was asked for: nothing to collect."""


@dataclass
class Attempt:
    """One resumed attempt: what it collects (``cfg``) and where, and the run's earlier files."""

    run: Path
    number: int
    cfg: RunConfig
    run_seed: int
    run_total: int
    frames_before: int
    pieces: list[Path]

    @property
    def folder(self) -> Path:
        return self.cfg.shards_dir

    @property
    def output(self) -> Path:
        """The file one writer (the process, or rank 0) fills in this attempt."""
        return self.folder / f"attempt-{self.number}.h5"

    def shard_name(self, rank: int) -> str:
        """The file collector rank ``rank`` fills in this attempt (``--shards``)."""
        return f"attempt-{self.number}.rank-{rank:04d}.h5"

    def record(self) -> dict[str, Any]:
        """What the attempt's files record of it, next to the options."""
        return {
            "attempt": self.number,
            "run_seed": self.run_seed,
            "run_total_frames": self.run_total,
            "frames_before": self.frames_before,
        }

    def publish(self, new: Sequence[Path]) -> Path:
        """Write the run's view over the earlier files and ``new`` (this attempt's finished
        files; those without rows are left out)."""
        return _publish(self.run, [*self.pieces, *new])

    def held(self) -> str:
        """What the run holds now, for the summary."""
        if not self.run.exists():
            return f"attempt {self.number}: nothing kept yet"
        with read_dataset(self.run) as ds:
            files = len(json.loads(ds.file.attrs.get("merged_from", "[]")))
            return (
                f"attempt {self.number}: {self.run.name} holds {len(ds)} of {self.run_total} "
                f"frames, {ds.committed_episodes} episodes, from {files} file(s) in "
                f"{self.folder.name}/"
            )

    def describe(self) -> str:
        return (
            f"resuming {self.run}: {self.frames_before} of {self.run_total} frames on disk, "
            f"attempt {self.number} collects {self.cfg.total_frames} more (seed {self.cfg.seed})"
        )


def find_run(path: str | os.PathLike) -> Path:
    """The dataset path of the run ``path`` names: the file (``run.h5``, also while only
    ``run.h5.partial`` or ``run.shards/`` exist) or a directory holding exactly one run."""
    path = Path(path)
    if path.is_dir() and not path.name.endswith(".shards"):
        runs = sorted(
            {final_path(p) for p in path.iterdir() if _is_run_file(p)}
            | {p.with_suffix(".h5") for p in path.glob("*.shards") if p.is_dir()}
        )
        if len(runs) != 1:
            found = ", ".join(p.name for p in runs) or "none"
            raise ArgumentValueError(
                f"--resume {path}: a run directory must hold exactly one dataset (found: "
                f"{found}); pass the dataset file instead."
            )
        return runs[0]
    run = final_path(path)
    if run.name.endswith(".shards"):
        run = run.with_name(run.name.removesuffix(".shards") + ".h5")
    if not _files_of(run):
        raise ArgumentValueError(
            f"--resume {path}: no run there (neither {run.name}, {run.name}.partial nor "
            f"{run.stem}.shards/); pass the --out of the run to continue."
        )
    return run


def resumed_config(resume: str, sources: Sequence[dict[str, Any]]) -> RunConfig:
    """The run's recorded options with ``sources`` (the config file's, then the command
    line's) on top; an option that defines the data and differs from the record is refused."""
    run = find_run(resume)
    recorded = _recorded_options(run)
    values = {k: current_spelling(k, recorded[k]) for k in _RECORDED if k in recorded}
    values["imports"] = tuple(values.get("imports", ()))
    for source in sources:
        for key, value in source.items():
            name = "imports" if key == "import" else key.replace("-", "_")
            if value is None or name == "resume":
                continue
            if name in ("out", "overwrite"):
                raise ArgumentValueError(
                    f"--{name} cannot be combined with --resume: a resumed run adds to {run} "
                    "and never replaces it; drop it."
                )
            if name == "imports":
                value = tuple(value)
            if name in _FIXED and name in values and value != values[name]:
                raise ArgumentValueError(
                    f"--{name.replace('_', '-')} {value!r} differs from the run's "
                    f"{values[name]!r} (recorded in {run}); a resumed run keeps its "
                    "env, policy and seed: drop the option or start a new run."
                )
            values[name] = value
    return RunConfig.from_sources({}, {**values, "out": str(run), "resume": str(resume)})


def start_attempt(cfg: RunConfig) -> Attempt:
    """Get the run ready for its next attempt (called by the one process that writes: the
    job, or rank 0): repair and gather its files, publish the view, plan the attempt.
    ``RunComplete`` when nothing is left to collect."""
    run = cfg.output
    folder = cfg.shards_dir
    try:
        for final in {run, *_final_names(folder)}:
            drop_staging(final)  # a writer killed while it made its file: not one row in it
        for partial in [run.with_name(run.name + ".partial"), *folder.glob("*.h5.partial")]:
            if partial.exists():
                repair_dataset(partial)
        if run.exists() and not _is_view(run):
            if not _pieces(folder):  # a finished run of one file stays as it is
                _frames_left(run, _frames_in([run]), cfg)
            folder.mkdir(exist_ok=True)
            target = folder / "attempt-0.h5"
            if target.exists():
                raise ArgumentValueError(
                    f"--resume: both {run} and {target} hold a first attempt; move one away."
                )
            os.replace(run, target)
    except OSError as err:
        raise StorageError(
            f"--resume {run}: cannot prepare the run's files ({err}); is another job still "
            "writing them?"
        ) from err
    pieces = _pieces(folder)
    if pieces:
        _publish(run, pieces)
    before = _frames_in(pieces)
    left = _frames_left(run, before, cfg)
    number = 1 + max((_attempt_of(p) for p in pieces), default=0)
    seed = (cfg.seed + number * SEED_STRIDE) % (MAX_SEED + 1)  # a valid --seed still
    attempt_cfg = dataclasses.replace(cfg, total_frames=left, seed=seed)
    return Attempt(run, number, attempt_cfg, cfg.seed, cfg.total_frames, before, pieces)


def _frames_in(files: list[Path]) -> int:
    """The frames committed in ``files``."""
    frames = 0
    for file in files:
        with read_dataset(file) as ds:
            frames += ds.committed_steps
    return frames


def _frames_left(run: Path, before: int, cfg: RunConfig) -> int:
    """The frames the next attempt collects (whole batches) when ``before`` are on disk;
    ``RunComplete`` when none is left."""
    fpb = cfg.frames_per_batch
    left = -(-(cfg.total_frames - before) // fpb) * fpb
    if left <= 0:
        raise RunComplete(
            f"{run} is complete: {before} of {cfg.total_frames} frames are on disk, nothing "
            "to collect (raise --total-frames to collect more)."
        )
    return left


def run_files(run: Path) -> list[Path]:
    """The files of the attempts of a run at ``run`` under ``run.shards/`` (unfinished ones
    too): a fresh run there must replace them, or a later ``--resume`` would take them in."""
    folder = run.with_name(run.stem + ".shards")
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _PIECE.match(p.name))


def remove_run_files(run: Path) -> None:
    """``--overwrite``: an earlier run's files at ``run`` go."""
    for path in run_files(run):
        path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------- helpers
def _files_of(run: Path) -> bool:
    folder = run.with_name(run.stem + ".shards")
    return (
        run.exists()
        or run.with_name(run.name + ".partial").exists()
        or (folder.is_dir() and any(_PIECE.match(p.name) for p in folder.iterdir()))
    )


def _is_view(path: Path) -> bool:
    with read_dataset(path) as ds:
        return "merged_from" in ds.file.attrs


def _attempt_of(piece: Path) -> int:
    match = _PIECE.match(piece.name)
    return int(match.group(1)) if match and match.group(1) else 0


def _is_run_file(path: Path) -> bool:
    """A dataset, finished or unfinished (not a staging file: it holds no row)."""
    final = final_path(path)
    return final.suffix == ".h5" and path != staging_path(final)


def _final_names(folder: Path) -> set[Path]:
    """The final name of each file of the run's attempts, whatever stage it is at."""
    if not folder.is_dir():
        return set()
    return {final_path(path) for path in folder.iterdir() if _PIECE.match(path.name)}


def _pieces(folder: Path) -> list[Path]:
    """The run's finished files, by attempt then rank."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = _PIECE.match(path.name)
        if match and not match.group(4):
            rank = match.group(2) or match.group(3) or "0"
            found.append((_attempt_of(path), int(rank), path))
    return [path for *_, path in sorted(found)]


def _publish(run: Path, files: Sequence[Path]) -> Path:
    kept = []
    for path in files:
        with read_dataset(path) as ds:
            if ds.keymap:  # a rank stopped before its first batch has no columns
                kept.append(path)
    if kept:
        merge_datasets(kept, run, overwrite=True)
    return run


def _recorded_options(run: Path) -> dict[str, Any]:
    """The options the run's latest file recorded (read only: the collector ranks of a
    distributed job may be starting)."""
    folder = run.with_name(run.stem + ".shards")
    partials = sorted(folder.glob("*.h5.partial"), key=_attempt_of) if folder.is_dir() else []
    candidates = [*partials[::-1], *_pieces(folder)[::-1], run.with_name(run.name + ".partial")]
    candidates.append(run)
    for path in candidates:
        if not path.exists() or (path == run and _is_view(run)):
            continue
        with read_dataset(path) as ds:
            config = ds.metadata.get("collector_config")
        if isinstance(config, dict) and "env" in config:
            return config
        if isinstance(config, str):
            return json.loads(config)
    if not any(path.exists() for path in candidates):  # only files a kill left being made
        raise ArgumentValueError(
            f"--resume {run}: the run was stopped before any of its files held a row; start it "
            "again (--out, with --overwrite)."
        )
    raise ArgumentValueError(
        f"--resume {run}: its files record no collect options (not written by "
        "python -m hpccollect collect); start a new run instead."
    )
