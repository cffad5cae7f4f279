"""``enable_profile()``: torch.profiler around a collector's first rollouts, a Chrome trace per
worker (TorchRL's ``ProfileConfig``). The profiler rides on ``post_collect_hook``, so it runs
where the rollouts run: in this process or in each named worker."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hpccollect.errors import ArgumentValueError

__all__ = ["ProfileConfig", "ProfilerHook", "Profiling"]

_ACTIVITIES = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU"}


@dataclass
class ProfileConfig:
    """What to profile: ``workers`` (indices), ``num_rollouts`` in all of which the first
    ``warmup_rollouts`` are discarded, and where the trace goes (``{worker_idx}`` is filled in)."""

    workers: list[int] = field(default_factory=lambda: [0])
    num_rollouts: int = 3
    warmup_rollouts: int = 1
    save_path: str | Path | None = None
    activities: list[str] = field(default_factory=lambda: ["cpu"])
    record_shapes: bool = True
    profile_memory: bool = False
    with_stack: bool = True
    with_flops: bool = False
    on_trace_ready: Callable | None = None

    def __post_init__(self) -> None:
        if self.warmup_rollouts < 0:
            raise ArgumentValueError(f"warmup_rollouts must be >= 0, got {self.warmup_rollouts}.")
        if self.num_rollouts <= self.warmup_rollouts:
            raise ArgumentValueError(
                f"num_rollouts ({self.num_rollouts}) must be greater than warmup_rollouts "
                f"({self.warmup_rollouts}): at least one rollout is profiled after the warm-up."
            )
        unknown = sorted(set(self.activities) - set(_ACTIVITIES))
        if unknown:
            raise ArgumentValueError(
                f"activities {unknown} are not profiler activities; use some of "
                f"{sorted(_ACTIVITIES)}."
            )

    def get_save_path(self, worker_idx: int) -> Path:
        """Where worker ``worker_idx``'s trace is written."""
        if self.save_path is None:
            return Path(f"./collector_profile_{worker_idx}.json")
        return Path(str(self.save_path).format(worker_idx=worker_idx))

    def should_profile_worker(self, worker_idx: int) -> bool:
        return worker_idx in self.workers

    def get_activities(self) -> list:
        return [getattr(torch.profiler.ProfilerActivity, _ACTIVITIES[a]) for a in self.activities]


class ProfilerHook:
    """A ``post_collect_hook`` that profiles the rollouts between its calls: it starts the
    profiler at once, steps it after each rollout, and stops and saves after
    ``num_rollouts``; the hook it replaced still runs after it."""

    def __init__(self, config: ProfileConfig, worker_idx: int, inner: Callable | None) -> None:
        self.config, self.worker_idx, self.inner = config, worker_idx, inner
        self.rollouts = 0
        self._profiler: Any = torch.profiler.profile(
            activities=config.get_activities(),
            schedule=torch.profiler.schedule(
                wait=0,
                warmup=config.warmup_rollouts,
                active=config.num_rollouts - config.warmup_rollouts,
                repeat=1,
            ),
            on_trace_ready=config.on_trace_ready or self._save,
            record_shapes=config.record_shapes,
            profile_memory=config.profile_memory,
            with_stack=config.with_stack,
            with_flops=config.with_flops,
        )
        self._profiler.start()

    def _save(self, profiler: Any) -> None:
        path = self.config.get_save_path(self.worker_idx)
        path.parent.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(path))

    @property
    def running(self) -> bool:
        return self._profiler is not None

    def __call__(self, batch: Any) -> None:
        if self._profiler is not None:
            self.rollouts += 1
            self._profiler.step()
            if self.rollouts >= self.config.num_rollouts:
                self.stop()
        if self.inner is not None:
            self.inner(batch)

    def stop(self) -> None:
        """Stop the profiler (saving what it recorded); later calls only run the inner hook."""
        profiler, self._profiler = self._profiler, None
        if profiler is not None:
            with contextlib.suppress(Exception):
                profiler.stop()

    def __getstate__(self) -> dict:
        raise TypeError("a running profiler cannot be pickled; enable profiling in the worker")


class Profiling:
    """``enable_profile``/``disable_profile``/``profile_config`` for a collector that runs its
    rollouts in this process; multi-process collectors forward to their workers instead."""

    _profile_config: ProfileConfig | None = None
    _frames: int = 0

    @property
    def profile_config(self) -> ProfileConfig | None:
        return self._profile_config

    def enable_profile(self, *, workers: list[int] | None = None, **options: Any) -> None:
        """Profile the next ``num_rollouts`` rollouts (see ``ProfileConfig``); before iterating."""
        config = ProfileConfig(workers=[0] if workers is None else list(workers), **options)
        if self._frames > 0:
            raise RuntimeError(
                "Cannot enable profiling after iteration has started: call enable_profile() "
                "right after building the collector."
            )
        self._install_profile(config)
        self._profile_config = config

    def disable_profile(self) -> None:
        """Stop the profiler, if any, and put back the ``post_collect_hook`` it wrapped."""
        if self._profile_config is None:
            return
        try:
            self._uninstall_profile()
        finally:
            self._profile_config = None

    def _install_profile(self, config: ProfileConfig) -> None:
        idx = getattr(self, "worker_idx", None)
        self.post_collect_hook = ProfilerHook(
            config, 0 if idx is None else idx, self.post_collect_hook
        )

    def _uninstall_profile(self) -> None:
        hook = self.post_collect_hook
        if isinstance(hook, ProfilerHook):
            hook.stop()
            self.post_collect_hook = hook.inner
