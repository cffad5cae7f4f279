"""Seeds, resets and state of a collector whose envs live in its workers (TorchRL's
``set_seed``, ``reset``, ``state_dict``, ``load_state_dict`` of a multi-process collector):
each is a request to every worker still collecting, in worker order."""

from __future__ import annotations

import abc
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from tensordict import TensorDictBase

from hpccollect._checks import check_int
from hpccollect.collectors.loops.whole_trajs import TrajectoryAssembler
from hpccollect.collectors.torchrl_api.options import CollectorArgs
from hpccollect.collectors.workers.pool import WorkerPool
from hpccollect.errors import ArgumentValueError
from hpccollect.protocol import Command, Reply, Seed

__all__ = ["WorkerState"]


class WorkerState(abc.ABC):
    """Seeds and state over the workers; what it uses of the collector is declared here."""

    num_workers: int
    worker_timeout: float
    options: CollectorArgs
    _pool: WorkerPool | None
    _active: list[int]
    _layouts: list[TensorDictBase]
    _filling: bool
    _frames: int
    _iter: int
    _assembler: TrajectoryAssembler | None
    #: drops what is kept of the running trajectories (``traj_ids``; all by default)
    _forget_trajectories: Callable[..., None]

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed every worker's envs: env ``j`` of worker ``i`` gets a distinct seed.

        Args:
            seed: the first seed.
            static_seed: every env gets ``seed`` itself.

        Returns:
            The last seed used, as TorchRL returns it.
        """
        first = seed = check_int("seed", seed)
        last = seed
        for i, layout in enumerate(self._layouts):
            if i not in self._active:  # a lost worker's envs keep their share of the seeds
                seed += layout.batch_size[0] if layout.batch_dims == 2 else 1
                continue
            last = self._pool.request(
                i,
                Command.SEED,
                Seed(first if static_seed else seed, static_seed),
                self.worker_timeout,
            )
            if not static_seed:
                seed = last + 1  # a worker knows how many envs it has (its own workers' too)
        return last

    def reset(self, reset_idx: Sequence[bool] | None = None) -> None:
        """Reset the envs of every worker (or of those ``reset_idx`` flags True) before their
        next batch: new trajectories, with new ids, start there. Returns when they have noted it.

        Args:
            reset_idx: one flag per worker; None resets them all.
        """
        if self._filling:
            raise RuntimeError(
                "reset() while the workers fill the replay buffer: call async_shutdown(close_env="
                "False) first."
            )
        flags = [True] * self.num_workers if reset_idx is None else list(reset_idx)
        if len(flags) != self.num_workers:
            raise ArgumentValueError(
                f"reset_idx has {len(flags)} entries; give one bool per worker "
                f"({self.num_workers})."
            )
        chosen = [i for i, flag in enumerate(flags) if flag and i in self._active]
        for i in chosen:
            self._pool.send(i, Command.RESET)
        for i in chosen:
            self._pool.recv(i, Reply.ACK, self.worker_timeout)
        if len(chosen) == self.num_workers:
            self._forget_trajectories()
        elif self._assembler is not None:
            stride = self.options.traj_id_stride * self.num_workers
            shares = {self.options.traj_id_offset + i * self.options.traj_id_stride for i in chosen}
            self._forget_trajectories(
                [t for t in self._assembler.in_flight() if t % stride in shares]
            )

    def state_dict(self) -> OrderedDict:
        """The collector's state, laid out as TorchRL's.

        Returns:
            ``worker{i}``: each worker's collector state; ``frames``, ``iter``, and
            ``traj_pool`` (the next trajectory id, past every worker's).
        """
        state: OrderedDict = OrderedDict()
        pools = []
        for i in self._active:
            worker = self._pool.request(i, Command.STATE_DICT, None, self.worker_timeout)
            if "traj_pool" in worker:
                pools.append(worker.pop("traj_pool"))
            state[f"worker{i}"] = worker
        state.update(frames=self._frames, iter=self._iter)
        if pools:
            state["traj_pool"] = max(pools, key=lambda p: int(p["traj_id"]))
        return state

    def load_state_dict(self, state_dict: OrderedDict, **kwargs: Any) -> None:
        """Load each ``worker{i}`` state into its worker.

        Args:
            state_dict: what ``state_dict()`` returned; with ``traj_pool``, every worker's
                trajectories (the running ones too) get ids from its ``traj_id`` on.
            **kwargs: accepted for TorchRL's signature.
        """
        pool = state_dict.get("traj_pool")
        for i in self._active:
            worker = state_dict.get(f"worker{i}")
            if pool is not None:
                worker = {**(worker or {}), "traj_pool": pool}
            if worker is not None:
                self._pool.request(i, Command.LOAD_STATE_DICT, worker, self.worker_timeout)
        self._frames = int(state_dict.get("frames", self._frames))
        self._iter = int(state_dict.get("iter", self._iter))
