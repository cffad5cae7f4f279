"""TorchRL 0.14.1's collector names that hpccollect does not provide: Ray's collectors and
workers, the batched-inference collector and the evaluator. Each is importable where TorchRL
has it, so code written for TorchRL loads with only its imports changed; building one raises
``NotProvidedError``, which says what to use instead."""

from __future__ import annotations

from typing import Any, NoReturn

from hpccollect.errors import NotProvidedError

__all__ = [
    "AsyncBatchedCollector",
    "Evaluator",
    "RayCollector",
    "RayEvalWorker",
    "RayWeightUpdater",
]


class _Elsewhere:
    """A TorchRL class hpccollect does not provide; ``instead`` says what to use."""

    instead = ""

    def __init__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotProvidedError(
            f"hpccollect does not provide TorchRL's {type(self).__name__}: {self.instead}"
        )


class RayCollector(_Elsewhere):
    """TorchRL's collector over Ray actors (not provided)."""

    instead = (
        "use DistributedDataCollector (hpccollect.collectors.distributed), which runs the "
        'same collector ranks with launcher="mp" (local processes), "mpi" (mpiexec, srun) or '
        '"submitit" (SLURM jobs).'
    )


class RayEvalWorker(_Elsewhere):
    """TorchRL's evaluation actor on Ray (not provided)."""

    instead = (
        "evaluate in a process of your own: a SyncDataCollector over the evaluation env, given "
        "the trainer's weights with update_policy_weights_(weights)."
    )


class RayWeightUpdater(_Elsewhere):
    """TorchRL's weight updater for Ray collectors (not provided)."""

    instead = (
        "DistributedDataCollector sends the policy's weights itself "
        "(update_policy_weights_(), update_after_each_batch, update_interval)."
    )


class AsyncBatchedCollector(_Elsewhere):
    """TorchRL's collector that batches many envs' policy calls in one server (not provided)."""

    instead = (
        "step many envs with one policy call per step with SyncDataCollector over a vector env "
        "(a list of env constructors, or a gymnasium vector env), or run them in worker "
        "processes with MultiaSyncDataCollector."
    )


class Evaluator(_Elsewhere):
    """TorchRL's evaluator (not provided)."""

    instead = (
        "run a SyncDataCollector over the evaluation env (total_frames, max_frames_per_traj) "
        "and read the returns from its batches."
    )
