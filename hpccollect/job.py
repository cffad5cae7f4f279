"""The collection job behind ``python -m hpccollect collect``: env, policy, collector, dataset.

Signals. SLURM (preemption, ``scancel``, the time limit), ``timeout`` and Ctrl-C signal every
process of the job. The workers ignore SIGTERM and SIGINT; this process decides:

* during start-up (env probe, worker start, before the first batch) nothing is worth finishing:
  the workers are stopped at once and no dataset is written;
* while collecting, SIGTERM and a first SIGINT stop the run after the current batch: the batch
  is committed, the episodes in progress are written as truncated, and the summary names the
  signal. A second SIGINT interrupts at once; committed data is still kept.

Either way the run ends normally (exit code 0 on the command line).

Reproducibility: ``seed`` seeds the envs, the random policy, torch's generator before the default
MLP is built (its weights) and during sampling (in this process for ``sync``, in each worker for
the multi-process collectors).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import multiprocessing
import os
import signal
import statistics
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from hpccollect.collectors import MultiaSyncDataCollector, MultiSyncDataCollector, SyncDataCollector
from hpccollect.config import RunConfig
from hpccollect.envs.gym import GymEnv
from hpccollect.errors import ArgumentValueError, CollectorTimeoutError
from hpccollect.policy_option import build_policy
from hpccollect.progress import show_warning_line
from hpccollect.resume import Attempt, remove_run_files, run_files, start_attempt
from hpccollect.storage.hdf5_writer import HDF5Writer, partial_path

__all__ = ["Summary", "build_policy", "resolve_env", "run_collect"]


@dataclass
class Summary:
    """What a run did and kept.

    ``collecting`` runs from the first batch request to the last batch written (the progress
    line's clock); ``elapsed`` is the whole run, start-up (env probe, worker start) and shutdown
    included. ``path`` is None when nothing was written (stopped during start-up).
    """

    frames: int
    episodes: int
    committed_steps: int
    returns: list[float]
    collecting: float
    elapsed: float
    path: Path | None
    stopped_by: str | None
    resumed: str | None = None  # a resumed run: what the run now holds

    @property
    def frames_per_second(self) -> float:
        """Frames per second while collecting (start-up and shutdown excluded)."""
        return self.frames / max(self.collecting, 1e-9)

    def lines(self) -> list[str]:
        if self.path is None:
            return [
                f"stopped by {self.stopped_by} during start-up, before the first batch: "
                "nothing was collected and no dataset was written"
            ]
        overall = self.frames / max(self.elapsed, 1e-9)
        out = [
            f"frames collected  {self.frames}  ({self.frames_per_second:,.0f} frames/s while "
            f"collecting, {self.collecting:.1f} s; {overall:,.0f} frames/s incl. start-up and "
            f"shutdown, {self.elapsed:.1f} s)"
        ]
        out.append(f"episodes kept     {self.episodes}  ({self.committed_steps} steps)")
        if self.returns:
            std = statistics.pstdev(self.returns) if len(self.returns) > 1 else 0.0
            out.append(
                f"episode return    mean {statistics.fmean(self.returns):.2f}  std {std:.2f}  "
                f"min {min(self.returns):.2f}  max {max(self.returns):.2f}  "
                f"(all {len(self.returns)} kept episodes)"
            )
        out.append(f"dataset           {self.path}")
        if self.resumed:
            out.append(f"resumed run       {self.resumed}")
        if self.stopped_by:
            out.append(
                f"stopped early by {self.stopped_by}: every committed episode was kept, "
                "episodes in progress were written as truncated"
            )
        return out


# ---------------------------------------------------------------------------------- env
def _import(module: str, option: str) -> None:
    try:
        importlib.import_module(module)
    except Exception as err:
        raise ArgumentValueError(
            f"{option}: cannot import module {module!r} ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); check the name and that its "
            "directory is on PYTHONPATH."
        ) from err


def resolve_env(env: str, imports: tuple[str, ...] = ()) -> str:
    """Import ``imports`` and, for gymnasium's ``module:EnvName-v0``, the module; check that the
    env id is registered. Returns the bare env id."""
    for module in imports:
        _import(module, f"--import {module}")
    module, _, name = env.rpartition(":")
    if module:
        _import(module, f"--env {env}")
    if name not in gym.registry:
        where = f" (module {module!r} was imported but did not register it)" if module else ""
        raise ArgumentValueError(
            f"--env: unknown gymnasium env {name!r}{where}; list ids with "
            "python -c 'import gymnasium; gymnasium.pprint_registry()', and for envs that a "
            "module registers use --env module:EnvName-v0 or --import module."
        )
    return name


def _make_env(env_id: str, kwargs: dict, num_envs: int, imports: tuple[str, ...] = ()) -> gym.Env:
    # a worker process starts fresh: it imports the modules (and gymnasium the ``module:`` of
    # ``module:EnvName-v0``) to register the envs there too
    if multiprocessing.parent_process() is not None:  # a worker: its warnings as the job's
        warnings.showwarning = show_warning_line
    for module in imports:
        importlib.import_module(module)
    if num_envs == 1:
        return gym.make(env_id, **kwargs)
    return gym.vector.SyncVectorEnv([functools.partial(gym.make, env_id, **kwargs)] * num_envs)


def env_maker(cfg: RunConfig) -> Callable[[], gym.Env]:
    """The env constructor every worker (or collector rank) calls: picklable, imports first."""
    return functools.partial(
        _make_env, cfg.env, dict(cfg.env_kwargs), cfg.num_envs, tuple(cfg.imports)
    )


def probe_policy(cfg: RunConfig, make: Callable[[], gym.Env], seed: int | None = None) -> Any:
    """Build one env to learn its spaces, and the policy ``--policy`` names for them (the
    default MLP's weights drawn with ``seed``, by default ``cfg.seed``)."""
    try:
        probe = GymEnv(make())
    except Exception as err:
        raise ArgumentValueError(
            f"--env {cfg.env} with --env-kwargs {cfg.env_kwargs}: {err}"
        ) from err
    try:
        torch.manual_seed(cfg.seed if seed is None else seed)  # the default MLP's weights
        policy = build_policy(cfg.policy, probe)
        if seed is not None:
            torch.manual_seed(cfg.seed)  # sync's sampling: this run's own stream
        return policy
    finally:
        probe.close()


def check_output(out: Path, overwrite: bool) -> None:
    """Refuse an existing output, or an earlier run's files beside it (unless ``overwrite``),
    and an output that cannot be written."""
    earlier = [p for p in (out, partial_path(out)) if p.exists()] + run_files(out)
    if earlier and not overwrite:
        raise ArgumentValueError(
            f"{earlier[0]} already exists; pass --overwrite to replace it (or --resume {out} to "
            "continue that run) or --out elsewhere."
        )
    _check_writable(out)


def _check_writable(out: Path) -> None:
    """Refuse an output that cannot be written before any worker starts."""
    probe = out.parent / f".{out.name}.{os.getpid()}.write-test"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        os.unlink(probe)
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ArgumentValueError(
            f"--out {out}: cannot write in {out.parent} ({reason}); choose a writable "
            "directory with --out (or $HPCCOLLECT_DATA_DIR)."
        ) from err


# ---------------------------------------------------------------------------------- signals
class Stopped(BaseException):
    """A stop signal during start-up (a BaseException, so ``except Exception`` lets it pass)."""


class StopSignals:
    """SIGTERM/SIGINT: raise ``Stopped`` during start-up, set ``signal`` while collecting; a
    second SIGINT while collecting raises ``KeyboardInterrupt``. Each raises at most once, so
    the shutdown that follows is not interrupted."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self.collecting = False
        self._raised = self._deferred = False

    def _handle(self, signum: int, frame: Any) -> None:
        first = self.signal is None
        self.signal = self.signal or signal.Signals(signum).name
        if self._raised or self._deferred or (first and self.collecting):
            return
        if not self.collecting:
            self._raised = True
            raise Stopped
        if signum == signal.SIGINT:
            self._raised = True
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A start-up step that must not be cut in half: a signal stops after it."""
        self._deferred = True
        try:
            yield
        finally:
            self._deferred = False
        if self.signal is not None and not self.collecting and not self._raised:
            self._raised = True
            raise Stopped

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A step during which a signal is only recorded in ``signal``: the caller decides."""
        self._deferred = True
        try:
            yield
        finally:
            self._deferred = False

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopSignals]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)


# ---------------------------------------------------------------------------------- the run
class _Run:
    """One collection: ``prepare()`` (checks, probe, policy, workers), ``collect()``,
    ``close()``."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = self.run_cfg = cfg
        self.attempt: Attempt | None = None
        self.published = False
        self.collector: Any = None
        self.writer: HDF5Writer | None = None
        self.frames = 0
        self.start = time.perf_counter()
        self.collect_start = self.last_batch = self.start

    def prepare(self, on_resume: Callable[[Attempt], None] | None = None) -> None:
        cfg = self.cfg
        resolve_env(cfg.env, cfg.imports)
        if cfg.resume is None:
            check_output(cfg.output, cfg.overwrite)
            if cfg.overwrite:
                remove_run_files(cfg.output)
        else:
            self.attempt = start_attempt(cfg)
            self.cfg = cfg = self.attempt.cfg
            if on_resume is not None:
                on_resume(self.attempt)
        make = env_maker(cfg)
        policy = probe_policy(cfg, make, seed=self.run_cfg.seed)
        self.collector = _collector(cfg, make, policy)
        self.collector.set_seed(cfg.seed)

    def collect(self, stop: StopSignals, on_progress: Callable | None) -> None:
        cfg, attempt = self.cfg, self.attempt
        with stop.deferred():
            self.writer = HDF5Writer(
                cfg.output if attempt is None else attempt.output,
                env=cfg.env,
                env_kwargs=dict(cfg.env_kwargs),
                config=record(self.run_cfg, attempt),
                seed=cfg.seed,
                compression=None if cfg.compression == "none" else cfg.compression,
                expected_rows=cfg.total_frames,
                overwrite=cfg.overwrite,
            )
        stop.collecting = True
        self.collect_start = self.last_batch = time.perf_counter()
        if on_progress is not None:
            on_progress(0, 0, None)
        for batch in self.collector:
            self.writer.extend(batch)
            self.frames += batch.numel()
            self.last_batch = time.perf_counter()
            if on_progress is not None:
                returns = self.writer.returns
                mean = statistics.fmean(returns[-100:]) if returns else None
                on_progress(self.frames, self.writer.committed_episodes, mean)
            if stop.signal is not None:
                break

    def close(self, discard: bool = False) -> None:
        """Stop the workers and close the dataset; ``discard`` removes a dataset that has
        received no batch (a stop during start-up)."""
        if self.collector is not None:
            self.collector.shutdown()
            self.collector = None
        if self.writer is not None:
            path = self.writer.close()
            if discard and self.frames == 0:
                path.unlink(missing_ok=True)
                self.writer = None
            elif self.attempt is not None and not self.published and self.writer.failed is None:
                self.published = True  # a failed file stays out: the next --resume repairs it
                self.attempt.publish([path])

    def summary(self, stopped_by: str | None) -> Summary:
        w, attempt = self.writer, self.attempt
        return Summary(
            self.frames,
            w.committed_episodes if w else 0,
            w.committed_steps if w else 0,
            list(w.returns) if w else [],
            self.last_batch - self.collect_start,
            time.perf_counter() - self.start,
            (w.path if attempt is None else attempt.run) if w else None,
            stopped_by,
            None if attempt is None or w is None else attempt.held(),
        )


def run_collect(
    cfg: RunConfig,
    on_progress: Callable[[int, int, float | None], None] | None = None,
    on_resume: Callable[[Attempt], None] | None = None,
) -> Summary:
    """Collect ``cfg.total_frames`` frames into ``cfg.output``, or continue the run
    ``cfg.resume`` (see ``hpccollect.resume``); see the module docstring.

    ``on_progress(frames, episodes, mean return of the last 100 episodes)`` is called with
    ``frames == 0`` when collection starts, then after every batch; ``on_resume(attempt)`` once
    a resumed run's attempt is planned.
    """
    run, stop = _Run(cfg), StopSignals()
    with stop.installed():
        try:
            run.prepare(on_resume)
            run.collect(stop, on_progress)
        except Stopped:
            run.close(discard=True)
        except KeyboardInterrupt:
            stop.signal = stop.signal or "SIGINT"
        except CollectorTimeoutError as err:
            if run.writer is None:  # start-up: its message names start_timeout already
                raise
            run.close()
            kept = run.writer.committed_episodes
            raise CollectorTimeoutError(
                f"a worker stopped answering: {str(err).split(';')[0]} (--worker-timeout "
                f"{cfg.worker_timeout:g}); it was killed, {kept} committed episodes were kept in "
                f"{cfg.output}. Raise --worker-timeout for slow envs or large batches."
            ) from err
        finally:
            run.close()
    return run.summary(stop.signal)


def record(cfg: RunConfig, attempt: Attempt | None) -> dict[str, Any]:
    """The options a dataset file records: the run's (so that ``--resume`` finds them), and
    for a resumed attempt which one it is."""
    out = cfg.as_dict()
    if attempt is not None:
        out["resume"] = attempt.record()
    return out


def _collector(cfg: RunConfig, make: Callable, policy: Any) -> Any:
    common = dict(
        frames_per_batch=cfg.frames_per_batch,
        total_frames=cfg.total_frames,
        max_frames_per_traj=cfg.max_steps,
    )
    if cfg.collector == "sync":
        return SyncDataCollector(make, policy, **common)
    cls = MultiSyncDataCollector if cfg.collector == "multi-sync" else MultiaSyncDataCollector
    return cls([make] * cfg.num_workers, policy, worker_timeout=cfg.worker_timeout, **common)
