"""The collection job behind ``python -m hpccollect collect``: env, policy, collector, dataset.

SIGTERM (SLURM preemption) and a first Ctrl-C stop the run after the current batch: the
dataset keeps every committed episode and the episodes in progress are written as truncated.
A second Ctrl-C interrupts at once; committed data is still kept.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from hpccollect.collectors import MultiaSyncDataCollector, MultiSyncDataCollector, SyncDataCollector
from hpccollect.config import RunConfig
from hpccollect.envs.gym import GymEnv
from hpccollect.errors import ArgumentValueError
from hpccollect.policy import MLPActor
from hpccollect.storage.hdf5_writer import HDF5Writer

__all__ = ["Summary", "build_policy", "run_collect"]


@dataclass
class Summary:
    """What a run did and kept."""

    frames: int
    episodes: int
    committed_steps: int
    returns: list[float]
    elapsed: float
    path: Path
    stopped_by: str | None

    @property
    def frames_per_second(self) -> float:
        return self.frames / max(self.elapsed, 1e-9)

    def lines(self) -> list[str]:
        out = [
            f"frames collected  {self.frames}  ({self.frames_per_second:,.0f} frames/s over "
            f"{self.elapsed:.1f} s)"
        ]
        out.append(f"episodes kept     {self.episodes}  ({self.committed_steps} steps)")
        if self.returns:
            std = statistics.pstdev(self.returns) if len(self.returns) > 1 else 0.0
            out.append(
                f"episode return    mean {statistics.fmean(self.returns):.2f}  std {std:.2f}  "
                f"min {min(self.returns):.2f}  max {max(self.returns):.2f}"
            )
        out.append(f"dataset           {self.path}")
        if self.stopped_by:
            out.append(
                f"stopped early by {self.stopped_by}: every committed episode was kept, "
                "episodes in progress were written as truncated"
            )
        return out


def _make_env(env_id: str, kwargs: dict, num_envs: int) -> gym.Env:
    if num_envs == 1:
        return gym.make(env_id, **kwargs)
    return gym.vector.SyncVectorEnv([functools.partial(gym.make, env_id, **kwargs)] * num_envs)


def build_policy(spec: str, env: GymEnv) -> Any:
    """``random``, ``default`` (a small MLP), ``module:function`` (called with the observation
    and action spaces) or a path to a ``state_dict`` checkpoint for the default MLP."""
    if spec == "random":
        return None
    shapes = [tuple(c.spec.shape) for c in env.obs_codecs.values()]
    if spec == "default":
        return MLPActor(shapes, env.action_codec.spec)
    if ":" in spec and not Path(spec).exists():
        module_name, _, attr = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as err:
            raise ArgumentValueError(
                f"--policy {spec}: cannot import {attr} from {module_name}: {err}"
            ) from err
        space = env.env
        return factory(
            getattr(space, "single_observation_space", space.observation_space),
            getattr(space, "single_action_space", space.action_space),
        )
    path = Path(spec)
    if not path.exists():
        raise ArgumentValueError(
            f"--policy {spec!r} is not 'random', 'default', a module:function factory or an "
            "existing checkpoint file."
        )
    policy = MLPActor(shapes, env.action_codec.spec)
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
        policy.load_state_dict(state)
    except Exception as err:
        raise ArgumentValueError(
            f"--policy {path}: not a state_dict of the default policy for this env: "
            f"{str(err).splitlines()[0]}"
        ) from err
    return policy


class _StopFlag:
    """SIGTERM and the first SIGINT set the flag; a second SIGINT interrupts at once."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name

    @contextlib.contextmanager
    def installed(self) -> Iterator[_StopFlag]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)


def run_collect(
    cfg: RunConfig, on_progress: Callable[[int, int, float | None], None] | None = None
) -> Summary:
    """Collect ``cfg.total_frames`` frames into ``cfg.output``; see the module docstring."""
    if cfg.env not in gym.registry:
        raise ArgumentValueError(
            f"--env: unknown gymnasium env {cfg.env!r}; list ids with "
            "python -c 'import gymnasium; gymnasium.pprint_registry()'."
        )
    out = cfg.output
    if (out.exists() or out.with_name(out.name + ".partial").exists()) and not cfg.overwrite:
        raise ArgumentValueError(
            f"{out} already exists; pass --overwrite to replace it or --out elsewhere."
        )
    make = functools.partial(_make_env, cfg.env, dict(cfg.env_kwargs), cfg.num_envs)
    try:
        probe = GymEnv(make())
    except Exception as err:
        raise ArgumentValueError(
            f"--env {cfg.env} with --env-kwargs {cfg.env_kwargs}: {err}"
        ) from err
    try:
        policy = build_policy(cfg.policy, probe)
    finally:
        probe.close()
    collector = _collector(cfg, make, policy)
    collector.set_seed(cfg.seed)
    writer = HDF5Writer(
        out,
        env=cfg.env,
        env_kwargs=dict(cfg.env_kwargs),
        config=cfg.as_dict(),
        seed=cfg.seed,
        compression=None if cfg.compression == "none" else cfg.compression,
        overwrite=cfg.overwrite,
    )
    frames, start, stop = 0, time.perf_counter(), _StopFlag()
    if on_progress is not None:
        on_progress(0, 0, None)
    try:
        with stop.installed():
            for batch in collector:
                writer.extend(batch)
                frames += batch.numel()
                if on_progress is not None:
                    mean = statistics.fmean(writer.returns[-100:]) if writer.returns else None
                    on_progress(frames, writer.committed_episodes, mean)
                if stop.signal is not None:
                    break
    except KeyboardInterrupt:
        stop.signal = stop.signal or "SIGINT"
    finally:
        collector.shutdown()
        path = writer.close()
    return Summary(
        frames,
        writer.committed_episodes,
        writer.committed_steps,
        writer.returns,
        time.perf_counter() - start,
        path,
        stop.signal,
    )


def _collector(cfg: RunConfig, make: Callable, policy: Any) -> Any:
    common = dict(
        frames_per_batch=cfg.frames_per_batch,
        total_frames=cfg.total_frames,
        max_frames_per_traj=cfg.max_steps,
    )
    if cfg.total_frames % cfg.frames_per_batch:
        fixed = math.ceil(cfg.total_frames / cfg.frames_per_batch) * cfg.frames_per_batch
        raise ArgumentValueError(
            f"--total-frames ({cfg.total_frames}) must be a multiple of --frames-per-batch "
            f"({cfg.frames_per_batch}), e.g. {fixed}."
        )
    if cfg.collector == "sync":
        return SyncDataCollector(make, policy, **common)
    cls = MultiSyncDataCollector if cfg.collector == "multi-sync" else MultiaSyncDataCollector
    return cls([make] * cfg.num_workers, policy, **common)
