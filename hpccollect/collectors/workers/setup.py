"""What a multi-process collector decides before its local workers start: the class each runs,
its share of a batch, the weights buffers it loads, what reaches it as a process argument, and
a zeroed batch laid out as its own (to lay out a TorchRL replay buffer's storage)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from hpccollect._checks import check_int
from hpccollect.collectors.sync import SyncDataCollector
from hpccollect.collectors.workers.worker import WorkerSpec
from hpccollect.envs import envbase
from hpccollect.errors import ArgumentTypeError, ArgumentValueError

__all__ = [
    "fake_worker_batch",
    "per_worker_frames",
    "shares_state",
    "weight_buffers",
    "worker_class",
]


def shares_state(create_env_fn: Any) -> bool:
    """A TorchRL env or ``EnvCreator`` instance: what may hold shared memory and locks that
    only a process argument passes on (a cloudpickled copy would lose them, or fail on a lock).
    A class holds no such state and is cloudpickled: one defined in ``__main__`` (a notebook,
    ``python -c``) cannot be found by name in a spawned worker."""
    if isinstance(create_env_fn, type):
        return False
    return envbase.is_torchrl_env(create_env_fn) or envbase.from_torchrl(create_env_fn)


def worker_class(value: Any) -> type:
    """TorchRL's ``collector_class`` of a multi-process collector: what each worker runs (None:
    ``SyncDataCollector``, or a subclass of it)."""
    if value is None:
        return SyncDataCollector
    if isinstance(value, type) and issubclass(value, SyncDataCollector):
        return value
    raise ArgumentTypeError(
        f"collector_class must be None or a SyncDataCollector (TorchRL's Collector) subclass, "
        f"each worker running one; got {value!r}."
    )


def per_worker_frames(frames_per_batch: Any, num_workers: int) -> list[int] | None:
    """TorchRL's ``frames_per_batch`` given as one value per worker, checked; None for an int."""
    if isinstance(frames_per_batch, int) or not isinstance(frames_per_batch, Sequence):
        return None
    if len(frames_per_batch) != num_workers:
        raise ArgumentValueError(
            "If `frames_per_batch` is provided as a sequence, it should contain exactly one value "
            f"per worker. Got {len(frames_per_batch)} values for {num_workers} workers."
        )
    return [
        check_int(f"frames_per_batch[{i}]", f, minimum=1) for i, f in enumerate(frames_per_batch)
    ]


def runs_on_cpu(module: nn.Module, policy_devices: Sequence[torch.device | None]) -> bool:
    """Whether ``module`` lives on CPU and every worker runs its policy there."""
    tensors = [*module.parameters(), *module.buffers()]
    return all(t.device.type == "cpu" for t in tensors) and all(
        d is None or d.type == "cpu" for d in policy_devices
    )


def weight_buffers(module: nn.Module | None, num_workers: int, live: bool) -> list:
    """One buffer per worker that ``UPDATE_WEIGHTS`` loads, in shared memory; ``live``: the
    module's own weights, moved to shared memory, which the workers' policies then run on (a
    change made here in place is seen there at once, as with TorchRL's CPU workers)."""
    if module is None:
        return [None] * num_workers
    if live:
        module.share_memory()
        return [TensorDict.from_module(module)] * num_workers
    return [TensorDict.from_module(module).data.clone().share_memory_() for _ in range(num_workers)]


def fake_worker_batch(args: list, whole_trajectories: bool) -> TensorDictBase:
    """A zeroed batch as the worker started with ``args`` writes it, from a collector built here
    as that worker builds its own (flat, one frame, for whole trajectories)."""
    spec = WorkerSpec.loads(args[0])
    env = args[3] if args[3] is not None else spec.create_env_fn
    probe = spec.build(env)
    try:
        fake = probe.fake_tensordict()
    finally:
        probe.shutdown(close_env=not envbase.is_torchrl_env(env))  # not the user's
    return fake.reshape(-1)[:1] if whole_trajectories else fake
