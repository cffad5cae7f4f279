"""The local part of a collection job: this process collects with ``--collector`` (``single``:
here; ``multi-sync``/``multi-async``: over ``--num-workers`` worker processes) and writes the
dataset itself (``lifecycle.py`` runs it).

Reproducibility: ``seed`` seeds the envs, the random policy, torch's generator before the default
MLP is built (its weights) and during sampling (in this process for ``single``, in each worker for
the multi-process collectors).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpccollect.app.config import WORKER_START, RunConfig
from hpccollect.app.lifecycle import Job, Progress
from hpccollect.app.preflight import check_output, env_maker, probe_policy, record, resolve_env
from hpccollect.app.resume import Attempt, remove_run_files, start_attempt
from hpccollect.app.signals import StopSignals
from hpccollect.app.summary import Summary
from hpccollect.collectors.multi_base import MultiCollectorBase
from hpccollect.collectors.torchrl_api.kinds import collector_kind
from hpccollect.storage import Sink, open_sink

__all__ = ["LocalPart", "run_collect"]


class LocalPart:
    """A job whose collectors run in this process and its worker processes."""

    who = "a worker"
    reports = False

    def __init__(self, cfg: RunConfig, on_resume: Callable[[Attempt], None] | None) -> None:
        self.cfg = self.run_cfg = cfg
        self.on_resume = on_resume
        self.attempt: Attempt | None = None

    def build(self, stop: StopSignals) -> Any:
        cfg = self.cfg
        resolve_env(cfg.env, cfg.imports)
        if cfg.resume is None:
            check_output(cfg.output, cfg.overwrite)
            if cfg.overwrite:
                remove_run_files(cfg.output)
        else:
            self.attempt = start_attempt(cfg)
            self.cfg = cfg = self.attempt.cfg
            if self.on_resume is not None:
                self.on_resume(self.attempt)
        make = env_maker(cfg)
        policy = probe_policy(cfg, make, seed=self.run_cfg.seed)
        return _collector(cfg, make, policy)

    def open_sink(self, stop: StopSignals) -> Sink:
        cfg, attempt = self.cfg, self.attempt
        with stop.deferred():
            return open_sink(
                cfg.output if attempt is None else attempt.output,
                env=cfg.env,
                env_kwargs=dict(cfg.env_kwargs),
                config=record(self.run_cfg, attempt),
                seed=cfg.seed,
                compression=None if cfg.compression == "none" else cfg.compression,
                expected_rows=cfg.total_frames,
                overwrite=cfg.overwrite,
            )

    def shut_down(self, collector: Any, discard: bool) -> None:
        collector.shutdown()

    def where(self) -> Path:
        return self.cfg.output

    def kept(self, sink: Sink, frames: int) -> tuple[int, int, list[float], Path]:
        return sink.committed_episodes, sink.committed_steps, list(sink.returns), sink.path


def run_collect(
    cfg: RunConfig,
    on_progress: Progress | None = None,
    on_resume: Callable[[Attempt], None] | None = None,
) -> Summary:
    """Collect ``cfg.total_frames`` frames into ``cfg.output``, or continue the run
    ``cfg.resume`` (see ``hpccollect.app.resume``).

    ``on_progress(frames, episodes, mean return of the last 100 episodes)`` is called with
    ``frames == 0`` when collection starts, then after every batch; ``on_resume(attempt)`` once
    a resumed run's attempt is planned.
    """
    return Job(LocalPart(cfg, on_resume)).run(on_progress)


def _collector(cfg: RunConfig, make: Callable, policy: Any) -> Any:
    common = dict(
        frames_per_batch=cfg.frames_per_batch,
        total_frames=cfg.total_frames,
        max_frames_per_traj=cfg.max_steps,
    )
    cls = collector_kind(cfg.collector)
    if not issubclass(cls, MultiCollectorBase):
        return cls(make, policy, **common)
    return cls(
        [make] * cfg.num_workers,
        policy,
        worker_timeout=cfg.worker_timeout,
        mp_start_method=WORKER_START,
        **common,
    )
