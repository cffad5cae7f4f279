"""``DataCollectorBase``: iteration, weight updates, background start/stop, context management.

Subclasses implement ``iterator()``, ``set_seed()``, ``state_dict()``/``load_state_dict()``,
``shutdown()`` and, where they support it, ``start()``/``async_shutdown()``.
"""

from __future__ import annotations

import abc
import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch
from tensordict import TensorDictBase

from hpccollect.collectors.loops.buffers import store
from hpccollect.collectors.loops.whole_trajs import TrajectoryAssembler
from hpccollect.collectors.weights import (
    LocalWeightsUpdaterBase,
    RemoteWeightsUpdaterBase,
    WeightUpdaterBase,
    given_weights,
)
from hpccollect.collectors.workers.remote import Call, calls_here, resolve_attr
from hpccollect.errors import ArgumentTypeError

__all__ = ["DataCollectorBase", "Interruptor", "SharedInterruptor"]


class Interruptor:
    """Lets other code cut the batch being collected short (TorchRL's ``_Interruptor``).

    After ``stop_collection()`` the collector finishes the step it is in and yields the batch at
    full length, the steps not taken zeroed with trajectory id -1 (as TorchRL's); a worker hands
    its collector the steps taken. ``start_collection()`` lets the next batches run in full.
    """

    def __init__(self) -> None:
        self._stopped = threading.Event()

    def start_collection(self) -> None:
        self._stopped.clear()

    def stop_collection(self) -> None:
        self._stopped.set()

    def collection_stopped(self) -> bool:
        return self._stopped.is_set()


class SharedInterruptor(Interruptor):
    """An ``Interruptor`` whose flag is one byte of shared memory, for worker processes.

    The parent process writes it, workers read it after every env step. It reaches a worker
    only when the worker process is created (it is one of the process's arguments).
    """

    def __init__(self) -> None:
        self._flag = torch.zeros(1, dtype=torch.uint8).share_memory_()
        self._view = self._flag.numpy()

    def start_collection(self) -> None:
        self._view[0] = 0

    def stop_collection(self) -> None:
        self._view[0] = 1

    def collection_stopped(self) -> bool:
        return bool(self._view[0])

    def __getstate__(self) -> dict:
        return {"_flag": self._flag}

    def __setstate__(self, state: dict) -> None:
        self._flag = state["_flag"]
        self._view = self._flag.numpy()


class DataCollectorBase(abc.ABC):
    """Base class of the collectors, with TorchRL's methods: iteration, weight updates,
    background collection, seeds, state and shutdown.

    Example:
        A collector is an iterable of batches; shut it down when done (or use ``with``)::

            with SyncDataCollector("CartPole-v1", None, frames_per_batch=100,
                                   total_frames=1000) as collector:
                for batch in collector:  # TensorDict [100] named ["time"]
                    ...
    """

    local_weight_updater: LocalWeightsUpdaterBase | None = None
    remote_weight_updater: RemoteWeightsUpdaterBase | None = None
    total_frames: int = -1
    frames_per_batch: int = 0
    _iterator: Iterator | None = None
    _assembler: TrajectoryAssembler | None = None
    _sends_weights = True  # False: TorchRL's NoWeightSyncScheme (workers keep their weights)
    replay_buffer: Any = None
    options: Any = None

    # ------------------------------------------------------------------ iteration
    @abc.abstractmethod
    def iterator(self) -> Iterator[TensorDictBase | None]:
        """Yield batches until ``total_frames`` have been collected (forever if endless).

        Yields:
            Each batch, or ``None`` with a ``replay_buffer`` (the batch went into the buffer).
        """

    def __iter__(self) -> Iterator[TensorDictBase | None]:
        """``iterator()``'s batches, or whole trajectories out of them (``trajs_per_batch``)."""
        opts = getattr(self, "options", None)
        if opts is None or opts.trajs_per_batch is None:
            return self.iterator()
        self._assembler = TrajectoryAssembler(
            opts.trajs_per_batch, opts.traj_format, opts.trajs_per_write
        )
        return self._assembler.run(
            self.iterator(),
            self.replay_buffer,
            drop_in_flight_each_batch=opts.reset_at_each_iter,
        )

    def _sink(self, batch: TensorDictBase) -> TensorDictBase | None:
        """What ``iterator()`` yields for a finished batch: the batch, or None once it is in
        the ``replay_buffer`` (with ``trajs_per_batch`` whole trajectories go there instead)."""
        opts = self.options
        if self.replay_buffer is None or opts.trajs_per_batch is not None:
            return batch
        for part in self._buffer_parts(batch):
            store(self.replay_buffer, part, opts.extend_buffer)
        return None

    def _buffer_parts(self, batch: TensorDictBase) -> tuple[TensorDictBase, ...]:
        """What goes into the replay buffer, one ``extend`` each: the batch (a collector with
        workers gives each worker's part, as TorchRL's workers write their own)."""
        return (batch,)

    def _forget_trajectories(self, traj_ids: Any = None) -> None:
        """After a reset, drop the pieces of the trajectories it ended (all when None); with all
        envs reset, the queued complete ones too (they were collected before the reset)."""
        assembler = self._assembler
        if assembler is None:
            return
        if traj_ids is None:
            assembler.clear()
        else:
            assembler.drop_in_flight(traj_ids)

    def next(self) -> TensorDictBase | None:
        """The next batch, from an iterator kept across calls (TorchRL's ``next()``).

        Returns:
            The batch, or None once ``total_frames`` are collected.
        """
        if self._iterator is None:
            self._iterator = iter(self)
        try:
            return next(self._iterator)
        except StopIteration:
            self._iterator = None
            return None

    def stats(self) -> dict[str, int | float | bool]:
        """A snapshot of progress, cheap and picklable (TorchRL's).

        Returns:
            ``frames``, ``batches``, ``total_frames`` and ``completed`` (not for an endless
            collector), ``requested_frames_per_batch``, ``policy_version`` (when tracked).
        """
        frames = int(getattr(self, "_frames", 0))
        out: dict[str, int | float | bool] = {
            "frames": frames,
            "batches": int(getattr(self, "_iter", -1)) + 1,
        }
        if self.total_frames >= 0:
            out["total_frames"] = int(self.total_frames)
            out["completed"] = frames >= self.total_frames
        out["requested_frames_per_batch"] = int(
            getattr(self, "requested_frames_per_batch", self.frames_per_batch)
        )
        version = getattr(self, "policy_version", None)
        if isinstance(version, int):
            out["policy_version"] = version
        return out

    # ------------------------------------------------------------------ reaching in
    def get_distant_attr(self, attr: str) -> Any:
        """Reach into the collector (TorchRL's ``get_distant_attr``).

        Args:
            attr: an attribute path, such as ``"env.unwrapped"`` or ``"a.b['k']"``.

        Returns:
            The object at that path; for a collector with workers, one per worker, in a list.
        """
        return resolve_attr(self, attr)

    def map_fn(
        self,
        method_name: str,
        list_of_args: list[tuple] | None = None,
        list_of_kwargs: list[dict] | None = None,
    ) -> list[Any]:
        """Call a method of the collector once per (args, kwargs) pair (TorchRL's ``map_fn``).

        Args:
            method_name: the method's attribute path, such as ``"env.reset"``.
            list_of_args: the positional arguments of each call (none by default).
            list_of_kwargs: the keyword arguments of each call (none by default).

        Returns:
            The calls' results, in order.
        """
        args, kwargs = calls_here(list_of_args, list_of_kwargs)
        return [
            Call("call", method_name, a, k).apply(self) for a, k in zip(args, kwargs, strict=True)
        ]

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Nothing is written to the ``replay_buffer`` inside this block (after ``start()``).

        Yields:
            None, once the background collection has stopped writing; it writes again on exit.
        """
        yield

    def __len__(self) -> int:
        if self.total_frames < 0:
            raise TypeError("an endless collector (total_frames=-1) has no length")
        return -(-self.total_frames // self.frames_per_batch)

    # ------------------------------------------------------------------ weights
    def _set_weight_updaters(
        self,
        local: LocalWeightsUpdaterBase | None,
        remote: RemoteWeightsUpdaterBase | None,
        any_updater: WeightUpdaterBase | None = None,
    ) -> None:
        """Keep the weight updaters: ``local``/``remote`` as given, and ``any_updater`` (the
        ``weight_updater`` keyword, an instance: see ``built_updater``) in the slot its kind
        fills where that one was not given."""
        if any_updater is not None:
            if isinstance(any_updater, RemoteWeightsUpdaterBase):
                remote = remote or any_updater
            elif isinstance(any_updater, WeightUpdaterBase):
                local = local or any_updater  # type: ignore[assignment]
            else:
                raise ArgumentTypeError(
                    f"weight_updater must be a WeightUpdaterBase, got {type(any_updater).__name__}."
                )
        for name, updater, cls in (
            ("local_weight_updater", local, WeightUpdaterBase),
            ("remote_weight_updater", remote, RemoteWeightsUpdaterBase),
        ):
            if updater is not None and not isinstance(updater, cls):
                raise ArgumentTypeError(
                    f"{name} must be a {cls.__name__} instance, got {type(updater).__name__}."
                )
            if updater is not None:
                updater.register_collector(self)
        self.local_weight_updater, self.remote_weight_updater = local, remote

    def update_policy_weights_(
        self, policy_or_weights: Any = None, *, worker_ids: Any = None, **kwargs: Any
    ) -> None:
        """Bring the collector's policy up to date: local (download) update, then remote (upload).

        Args:
            policy_or_weights: a policy module, a TensorDict of weights, a state_dict, or None
                to fetch the weights from where the updaters keep them. TorchRL's other spellings
                are taken too: ``weights=``, ``policy=``, ``policy_weights=``,
                ``weights_dict={"policy": ...}`` and ``model_id="policy"``.
            worker_ids: workers to update (collectors with workers only); all by default.

        Raises:
            TypeError: ``worker_ids`` was given but this collector has no remote weight updater.
        """
        policy_or_weights = given_weights(policy_or_weights, kwargs)
        if worker_ids is not None and self.remote_weight_updater is None:
            raise ArgumentTypeError(
                f"worker_ids={worker_ids!r} was given, but {type(self).__name__} has no remote "
                "weight updater to reach workers; call update_policy_weights_() without worker_ids."
            )
        if self.local_weight_updater is not None:
            self.local_weight_updater(policy_or_weights, **kwargs)
        if self.remote_weight_updater is not None and self._sends_weights:
            self.remote_weight_updater(policy_or_weights, worker_ids=worker_ids, **kwargs)

    def init_updater(self, *args: Any, **kwargs: Any) -> None:
        """Pass arguments to the weight updaters' ``init``; a no-op when there are none."""
        for updater in (self.local_weight_updater, self.remote_weight_updater):
            if updater is not None:
                updater.init(*args, **kwargs)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Collect in the background into the ``replay_buffer``; stop with ``async_shutdown()``.

        Raises:
            NotImplementedError: this collector cannot run in the background.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot run in the background")

    def async_shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop background collection started by ``start()``.

        Args:
            timeout: seconds to wait for the background collection to stop (None: the
                collector's own deadline).
            close_env: then shut the collector down (its envs, threads and processes).

        Raises:
            NotImplementedError: this collector cannot run in the background.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot run in the background")

    @abc.abstractmethod
    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed every env, each with its own seed drawn from ``seed``.

        Args:
            seed: the first seed.
            static_seed: give every env ``seed`` itself.

        Returns:
            The seed of the last env, from which a next collector's seeds can go on.
        """

    @abc.abstractmethod
    def state_dict(self) -> OrderedDict:
        """The collector's state, to resume from.

        Returns:
            The policy's and the envs' state and the collection's progress.
        """

    @abc.abstractmethod
    def load_state_dict(self, state_dict: OrderedDict, **kwargs: Any) -> None:
        """Restore what ``state_dict()`` returned.

        Args:
            state_dict: a ``state_dict()`` of a collector built alike.
            **kwargs: passed on to the policy's ``load_state_dict``.
        """

    @abc.abstractmethod
    def shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop everything and release envs, threads and processes; safe to call twice.

        Args:
            timeout: seconds each worker or rank gets to stop before it is killed (None: the
                collector's own deadline).
            close_env: close the envs too.
        """

    def __enter__(self) -> DataCollectorBase:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.shutdown()
