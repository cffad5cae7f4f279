"""The loop every collector worker runs, over any ``Channel``, around any collector class.

At start the worker builds its collector (``WorkerSpec.collector_class``: a ``SyncDataCollector``
by default, or a multi-process collector whose workers are its own children), asks it for the
buffers its batches are written into (shared memory, or the channel's own buffers, see
``Channel.batch_buffers``) and sends them once (``Reply.LAYOUT``);
after that a batch is announced with ``Reply.BATCH`` and its number of frames, never sent. Each
``Command`` has exactly one handler here. A failure goes back as ``Reply.ERROR`` with the type,
message, traceback and this host, then the worker exits. A worker with a sink whose launcher
kills it soon after SIGTERM (Open MPI's ``mpirun``) closes the sink at the signal, before the
batch under way is done (``kill_warning.py``).

What the collector must offer: ``_shared_batch()`` (the batch buffers, made once),
``_use_batch_buffers()`` (write into the channel's buffers instead, see
``Channel.batch_buffers``),
``_collect_counted()`` (one batch into them, counted), ``update_policy_weights_``, ``set_seed``,
``reset``, ``state_dict``, ``load_state_dict`` and ``shutdown``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import numpy as np
import torch
from tensordict import TensorDictBase

from hpccollect._exit import freeze_survivors
from hpccollect._lazy import load_target
from hpccollect._signals import ignore_stop_signals
from hpccollect.collectors.loops.buffers import store
from hpccollect.collectors.loops.whole_trajs import TrajectoryAssembler
from hpccollect.collectors.sync import SyncDataCollector
from hpccollect.collectors.workers.kill_warning import KillWarning, SinkGuard
from hpccollect.collectors.workers.remote import Call
from hpccollect.collectors.workers.reports import RankReporter, Reporting
from hpccollect.errors import ArgumentValueError
from hpccollect.protocol import Command, Layout, Message, RemoteError, Reply, Seed, message
from hpccollect.transport.base import Channel
from hpccollect.transport.pipe import PipeChannel

__all__ = ["WorkerSpec", "serve", "worker_main"]


@dataclass
class WorkerSpec:
    """What one worker builds (sent once, with cloudpickle, so lambdas and closures work):
    ``collector_class(create_env_fn, policy, **kwargs)`` with ``num_threads`` torch threads;
    ``collector_class`` may be named as ``"module:Class"``, imported in the worker.

    ``sink``: None, or a callable the worker calls once to get an object whose ``extend(batch)``
    takes every batch it collects before announcing it (a per-rank dataset shard, written where
    the batch was collected) and whose ``close()`` is called when the worker ends.
    ``init_fn``: called first, before anything is built (TorchRL's ``init_fn``).
    ``weights_template``: with a policy built by ``policy_factory`` in the worker, a module laid
    out as that policy, for the weights buffer a transport allocates before the policy exists.
    ``live_weights``: the weights buffer is the parent's policy's own (shared) weights, which
    this worker's policy runs on.
    ``reports``: the worker keeps its batches (``sink``) and sends reports of them instead
    (``reports.py``); None: it sends its batches."""

    create_env_fn: Any
    policy: Any
    kwargs: dict
    num_threads: int = 1
    collector_class: type | str = SyncDataCollector
    sink: Any = None
    init_fn: Any = None
    weights_template: Any = None
    live_weights: bool = False
    reports: Reporting | None = None

    def build(self, create_env_fn: Any, **extra: Any) -> Any:
        """The worker's collector over ``create_env_fn``: ``collector_class`` (imported first
        when named as a string) with the policy, ``kwargs`` and ``extra``."""
        cls = self.collector_class
        cls = load_target(cls) if isinstance(cls, str) else cls
        return cls(create_env_fn, self.policy, **self.kwargs, **extra)

    def dumps(self) -> bytes:
        return cloudpickle.dumps(self)

    @staticmethod
    def loads(blob: bytes) -> WorkerSpec:
        return cloudpickle.loads(blob)


class _Shutdown(Exception):
    def __init__(self, close_env: bool) -> None:
        self.close_env = close_env


def worker_main(
    index: int,
    conn: Connection,
    payload: bytes,
    weights: TensorDictBase | None,
    interruptor: Any = None,
    env: Any = None,
    buffer: Any = None,
) -> None:
    """Entry point of local worker process ``index`` (see ``processes.start_local_workers``);
    ``env``: the ``create_env_fn`` passed as a process argument instead of in ``payload``;
    ``buffer``: a replay buffer that reaches workers only that way (see ``inherited_buffer``)."""
    # A scheduler (SLURM, timeout) or Ctrl-C signals the whole process group: the collector
    # decides when to stop and sends SHUTDOWN; if it is gone, recv() ends with EOF.
    ignore_stop_signals()
    serve(PipeChannel(conn), payload, weights, interruptor, env, buffer)
    # at exit: a spawned worker exits through Python's teardown, a forked one skips it
    # (os._exit), and would pay the freeze's collection for nothing
    atexit.register(freeze_survivors)


def serve(
    channel: Channel,
    payload: bytes,
    weights: TensorDictBase | None,
    interruptor: Any = None,
    env: Any = None,
    buffer: Any = None,
) -> None:
    """Build the collector ``payload`` (a pickled ``WorkerSpec``) describes and answer
    ``channel``'s commands until ``SHUTDOWN`` or the collector's end closes.

    ``weights`` is the buffer ``UPDATE_WEIGHTS`` loads (written by the collector beforehand; None:
    the channel's own, see ``Channel.weights_buffer``);
    ``interruptor`` the collector's shared stop flag (``preemptive_threshold``), or None;
    ``buffer`` the replay buffer ``FILL_BUFFER`` without one fills, also the collector's
    ``replay_buffer`` (which its batches do not go to: the parent decides where they go).
    """
    collector = sink = None
    close_env = True
    try:
        spec = WorkerSpec.loads(payload)
        if env is not None:
            spec.create_env_fn = env
        if spec.init_fn is not None:
            spec.init_fn()
        sink = spec.sink() if spec.sink is not None else None
        torch.set_num_threads(spec.num_threads)
        extra = {} if interruptor is None else {"interruptor": interruptor}
        if weights is None:
            template = spec.policy if spec.policy is not None else spec.weights_template
            weights = channel.weights_buffer(template)
        collector = spec.build(spec.create_env_fn, **extra)
        if buffer is not None:
            collector.replay_buffer = buffer
        if spec.live_weights and weights is not None:
            collector._run_on_weights(weights)
        reporter = None
        if spec.reports is not None:
            reporter = RankReporter(spec.reports, sink)
            frames = _batch_frames(collector)
            template = reporter.template
            placed = channel.report_buffers(template.share_memory_() if channel.local else template)
            by_value = False
        else:
            placed, by_value = _place_batches(collector, channel)
            frames = placed.numel()
        made = None
        if weights is None and channel.local and spec.policy is None:
            weights = made = collector._weights_for_workers()
        layout = Layout(placed, socket.gethostname(), os.getpid(), by_value, made, frames)
        channel.send(message(Reply.LAYOUT, layout))
        server = _Server(collector, channel, weights, sink, buffer, by_value, reporter, placed)
        with server.guard.installed() if sink is not None else contextlib.nullcontext():
            server.serve()
    except _Shutdown as stop:
        close_env = stop.close_env
    except ConnectionError:
        pass  # the collector is gone: nothing to report to
    except KillWarning:
        pass  # the launcher kills this process next: the sink is closed first, below
    except BaseException as err:
        with contextlib.suppress(Exception):
            channel.send(message(Reply.ERROR, RemoteError.from_exception(err)))
    finally:
        if sink is not None:  # first: nothing below writes to it, and a kill may come soon
            with contextlib.suppress(Exception):
                sink.close()
        if collector is not None:
            with contextlib.suppress(Exception):
                collector.shutdown(close_env=close_env)
        with contextlib.suppress(Exception):
            channel.close()


def _batch_frames(collector: Any) -> int:
    """The frames of one of ``collector``'s batches."""
    batch = collector._shared_batch()
    return (batch if batch is not None else collector._batch_shell()).numel()


def _place_batches(collector: Any, channel: Channel) -> tuple[TensorDictBase, bool]:
    """Where the worker's batches go, and whether they travel by value: the collector's fixed
    buffers (or the channel's, laid out the same), else a shell of one batch sent each time."""
    batch = collector._shared_batch()
    if batch is None:
        if not channel.local:
            raise ArgumentValueError(
                "this env's batches fit no fixed buffers (dynamic or heterogeneous specs, or "
                "non-tensor entries); collect them with local workers (MultiSyncCollector, "
                "MultiAsyncCollector), not across ranks."
            )
        return collector._batch_shell(), True
    placed = channel.batch_buffers(batch)
    if placed is not batch:
        collector._use_batch_buffers(placed)
    return placed, False


class _Server:
    """Answers one command at a time."""

    def __init__(
        self,
        collector: Any,
        channel: Channel,
        weights: Any,
        sink: Any = None,
        buffer: Any = None,
        by_value: bool = False,
        reporter: RankReporter | None = None,
        placed: TensorDictBase | None = None,
    ) -> None:
        self.collector, self.channel, self.weights, self.sink = collector, channel, weights, sink
        self.buffer, self.by_value = buffer, by_value
        self.reporter, self.placed = reporter, placed
        self.guard = SinkGuard()  # holds a kill warning back while the sink writes
        self.handlers = {
            Command.COLLECT: self.collect,
            Command.UPDATE_WEIGHTS: self.update_weights,
            Command.SEED: self.seed,
            Command.RESET: self.reset,
            Command.STATE_DICT: self.state_dict,
            Command.LOAD_STATE_DICT: self.load_state_dict,
            Command.FILL_BUFFER: self.fill_buffer,
            Command.STOP_FILLING: lambda _: None,
            Command.CALL: self.call,
        }

    def serve(self) -> None:
        while True:
            self._answer(*self._next())

    def _answer(self, command: Command, payload: Any) -> None:
        answer = self.handlers[command](payload)
        self.channel.send(message(command.reply, answer))

    def call(self, blob: bytes) -> Any:
        """The call's result, or its failure as a ``RemoteError`` (raised by the collector;
        this worker goes on)."""
        try:
            return Call.loads(blob).apply(self.collector)
        except Exception as err:
            return RemoteError.from_exception(err)

    def _next(self) -> Message:
        command, payload = self.channel.recv()
        message(command, payload)  # a malformed command fails here, typed, and is reported
        if command.local_only and not self.channel.local:
            raise RuntimeError(f"{command.name} is for local workers only")
        if command is Command.SHUTDOWN:
            raise _Shutdown(payload)
        return command, payload

    def collect(self, batches: int) -> int:
        """One batch into the buffers; with reports, up to ``batches`` and their report (early
        when a message comes meanwhile: a stop, or weights to load before the next batch)."""
        if self.reporter is not None:
            channel = self.channel
            return self.reporter.collect(
                self._collect_one, batches, self.placed, lambda: channel.poll(0)
            )
        if batches != 1:
            raise RuntimeError(f"COLLECT of {batches} batches from a worker that sends batches")
        batch = self._collect_one()
        if self.by_value:
            self.channel.send(message(Reply.DATA, batch))
        return batch.numel()

    def _collect_one(self) -> TensorDictBase:
        batch = self.collector._collect_counted()
        if self.sink is not None:
            with self.guard.writing():
                self.sink.extend(batch)
        return batch

    def update_weights(self, _: None) -> None:
        self.collector.update_policy_weights_(self.weights)

    def seed(self, seed: Seed) -> int:
        # as TorchRL's workers do: the process's own generators too, so stochastic actors and
        # anything else drawing from torch or numpy repeat
        last = self.collector.set_seed(seed.seed, seed.static_seed)
        torch.manual_seed(seed.seed)
        np.random.seed(seed.seed % 2**32)
        return last

    def reset(self, _: None) -> None:
        self.collector.reset()

    def state_dict(self, _: None) -> Any:
        return self.collector.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.collector.load_state_dict(state)

    def fill_buffer(self, buffer: Any) -> None:
        """Extend ``buffer`` (None: the one this worker started with) batch after batch until
        the collector says stop, answering its other commands (a weight update, a call) between
        batches; with ``trajs_per_batch``, with whole trajectories (TorchRL does this too)."""
        buffer = self.buffer if buffer is None else buffer
        self.collector.replay_buffer = buffer  # what the collector's callers see (map_fn)
        opts = self.collector.options
        assembler = None
        if opts.trajs_per_batch is not None:
            assembler = TrajectoryAssembler(opts.trajs_per_batch, "cat", opts.trajs_per_write)
        while True:
            while self.channel.poll(0):
                command, payload = self._next()  # SHUTDOWN is raised
                if command is Command.STOP_FILLING:
                    return
                if command is Command.FILL_BUFFER:
                    raise RuntimeError("FILL_BUFFER while filling: the collector lost count")
                self._answer(command, payload)
            batch = self.collector._collect_counted()
            if assembler is None:
                store(buffer, batch, opts.extend_buffer)
                continue
            assembler.ingest(batch)
            if opts.reset_at_each_iter:
                assembler.drop_in_flight()
            for trajs in assembler.writes():
                store(buffer, trajs, opts.extend_buffer)
