"""What a collector with workers forwards to them by attribute path: ``get_distant_attr``,
``map_fn``, per-worker ``stats``, the collect hooks and profiling (TorchRL's API). Everything
goes through one method of the host, ``_call_workers``."""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, Literal

from hpccollect.collectors.profiling import ProfileConfig
from hpccollect.collectors.workers.remote import Call, calls_per_worker
from hpccollect.errors import ArgumentValueError

__all__ = ["WorkerCalls"]


class _Forwarded:
    """An attribute of every worker's collector, set from here (``pre_collect_hook``...)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        if self.name in obj.__dict__:
            return obj.__dict__[self.name]
        return getattr(obj.options, self.name, None)

    def __set__(self, obj: Any, value: Any) -> None:
        obj._call_workers({i: Call("set", self.name, (value,)) for i in obj._active})
        obj.__dict__[self.name] = value


class WorkerCalls(abc.ABC):
    """TorchRL's remote helpers for a collector whose rollouts run in its workers."""

    num_workers: int
    _active: list[int]
    _profile_config: ProfileConfig | None = None
    pre_collect_hook = _Forwarded()
    post_collect_hook = _Forwarded()

    @abc.abstractmethod
    def _call_workers(self, calls: dict[int, Call]) -> list[Any]:
        """Run ``calls[i]`` in worker ``i`` (all at once); their results in that order."""

    def get_distant_attr(self, attr: str) -> list[Any]:
        """The object at attribute path ``attr`` of each worker's collector."""
        return self._call_workers({i: Call("get", attr) for i in self._active})

    def map_fn(
        self,
        method_name: str,
        list_of_args: list[tuple] | None = None,
        list_of_kwargs: list[dict] | None = None,
    ) -> list[Any]:
        """Call the method at path ``method_name`` of worker ``i``'s collector with
        ``list_of_args[i]`` and ``list_of_kwargs[i]``; the results in worker order."""
        args, kwargs = calls_per_worker(self.num_workers, list_of_args, list_of_kwargs)
        return self._call_workers(
            {i: Call("call", method_name, args[i], kwargs[i]) for i in self._active}
        )

    def stats(
        self, workers: Literal["aggregate", "per_worker", "both"] = "aggregate"
    ) -> dict[str, int | float | bool]:
        """Progress here (``"aggregate"``, no worker is asked), each worker's as
        ``worker_<i>/<name>`` (``"per_worker"``), or both; plus ``workers``/``workers_alive``."""
        if workers not in ("aggregate", "per_worker", "both"):
            raise ArgumentValueError(
                f"workers must be one of 'aggregate', 'per_worker' or 'both', got {workers!r}."
            )
        out: dict[str, int | float | bool] = {}
        if workers != "per_worker":
            out.update(super().stats())  # type: ignore[misc]
        out["workers"] = self.num_workers
        out["workers_alive"] = len(self._active)
        if workers != "aggregate":
            for i, worker in zip(self._active, self.map_fn("stats"), strict=True):
                out.update({f"worker_{i}/{k}": v for k, v in worker.items()})
        return out

    def fake_tensordict(self) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__}.fake_tensordict() is not offered: its workers' batches are "
            "laid out by their own collectors; call fake_tensordict() on a SyncDataCollector "
            "built like one worker."
        )

    # ------------------------------------------------------------------ profiling
    @property
    def profile_config(self) -> ProfileConfig | None:
        return self._profile_config

    def enable_profile(self, *, workers: list[int] | None = None, **options: Any) -> None:
        """Profile the first rollouts of the named workers (default: worker 0), each writing
        its own trace (see ``ProfileConfig``); before iterating."""
        config = ProfileConfig(workers=[0] if workers is None else list(workers), **options)
        bad = [w for w in config.workers if w not in self._active]
        if bad:
            raise ArgumentValueError(
                f"enable_profile: workers {bad} do not exist here; give indices among "
                f"{self._active}."
            )
        if getattr(self, "_frames", 0) > 0:
            raise RuntimeError(
                "Cannot enable profiling after iteration has started: call enable_profile() "
                "right after building the collector."
            )
        self._each_profiled(config, lambda i: Call("call", "enable_profile", (), _one(options, i)))
        self._profile_config = config

    def disable_profile(self) -> None:
        """Stop the workers' profilers and restore their ``post_collect_hook``."""
        config, self._profile_config = self._profile_config, None
        if config is not None:
            self._each_profiled(config, lambda i: Call("call", "disable_profile"))

    def _each_profiled(self, config: ProfileConfig, call: Callable[[int], Call]) -> None:
        self._call_workers({i: call(i) for i in config.workers if i in self._active})


def _one(options: dict, worker: int) -> dict:
    return {**options, "workers": [worker]}
