"""The loop every collector worker process runs: a SyncDataCollector driven by ``Command``s.

At start the worker builds its collector, allocates its batch buffers in shared memory and
sends the TensorDict over them to the parent (``Reply.LAYOUT``); after that a batch is announced
with ``Reply.BATCH`` and the number of frames, never sent.
"""

from __future__ import annotations

import contextlib
import signal
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import numpy as np
import torch
from tensordict import TensorDictBase

from hpccollect.collectors.messages import Command, Reply
from hpccollect.collectors.sync import SyncDataCollector
from hpccollect.policy import load_weights_

__all__ = ["WorkerSpec", "worker_main"]


@dataclass
class WorkerSpec:
    """What one worker builds (sent once, with cloudpickle, so lambdas and closures work)."""

    create_env_fn: Any
    policy: Any
    kwargs: dict
    num_threads: int = 1

    def dumps(self) -> bytes:
        return cloudpickle.dumps(self)


class _Shutdown(Exception):
    def __init__(self, close_env: bool) -> None:
        self.close_env = close_env


def worker_main(
    index: int,
    conn: Connection,
    payload: bytes,
    weights: TensorDictBase | None,
    interruptor: Any = None,
) -> None:
    """Entry point of worker ``index``; ``weights`` is its shared-memory weights buffer and
    ``interruptor`` the parent's shared stop flag (``preemptive_threshold``), or None."""
    # A scheduler (SLURM, timeout) or Ctrl-C signals the whole process group: the parent
    # decides when to stop and sends SHUTDOWN; if it is gone, recv() ends with EOF.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    collector = None
    close_env = True
    try:
        spec: WorkerSpec = cloudpickle.loads(payload)
        torch.set_num_threads(spec.num_threads)
        collector = SyncDataCollector(
            spec.create_env_fn, spec.policy, interruptor=interruptor, **spec.kwargs
        )
        conn.send((Reply.LAYOUT, collector._shared_batch()))
        _Server(collector, conn, weights).serve()
    except _Shutdown as stop:
        close_env = stop.close_env
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the parent is gone: nothing to report to
    except BaseException as err:
        with contextlib.suppress(Exception):
            conn.send((Reply.ERROR, (type(err).__name__, str(err), traceback.format_exc())))
    finally:
        if collector is not None:
            with contextlib.suppress(Exception):
                collector.shutdown(close_env=close_env)
        with contextlib.suppress(Exception):
            conn.close()


class _Server:
    """Handles one command at a time; each Command has exactly one handler here."""

    def __init__(self, collector: SyncDataCollector, conn: Connection, weights: Any) -> None:
        self.collector, self.conn, self.weights = collector, conn, weights
        self.handlers = {
            Command.COLLECT: self.collect,
            Command.UPDATE_WEIGHTS: self.update_weights,
            Command.SEED: self.seed,
            Command.RESET: self.reset,
            Command.STATE_DICT: self.state_dict,
            Command.LOAD_STATE_DICT: self.load_state_dict,
            Command.FILL_BUFFER: self.fill_buffer,
            Command.STOP_FILLING: lambda _: (Reply.ACK, None),
        }

    def serve(self) -> None:
        while True:
            command, argument = self.conn.recv()
            if command is Command.SHUTDOWN:
                raise _Shutdown(bool(argument))
            self.conn.send(self.handlers[command](argument))

    def collect(self, _: Any) -> tuple[Reply, int]:
        return Reply.BATCH, self.collector._collect_counted().numel()

    def update_weights(self, _: Any) -> tuple[Reply, None]:
        load_weights_(self.collector._wrapped.weights_module, self.weights)
        return Reply.ACK, None

    def seed(self, argument: tuple[int, bool]) -> tuple[Reply, int]:
        # as TorchRL's workers do: the process's own generators too, so stochastic actors and
        # anything else drawing from torch or numpy repeat
        last = self.collector.set_seed(*argument)
        torch.manual_seed(argument[0])
        np.random.seed(argument[0] % 2**32)
        return Reply.SEEDED, last

    def reset(self, _: Any) -> tuple[Reply, None]:
        self.collector.reset()
        return Reply.ACK, None

    def state_dict(self, _: Any) -> tuple[Reply, Any]:
        return Reply.STATE, self.collector.state_dict()

    def load_state_dict(self, state: Any) -> tuple[Reply, None]:
        self.collector.load_state_dict(state)
        return Reply.ACK, None

    def fill_buffer(self, buffer: Any) -> tuple[Reply, None]:
        """Extend the shared ``buffer`` batch after batch until the parent says stop."""
        while not self.conn.poll():
            buffer.extend(self.collector._collect_counted())
        command, argument = self.conn.recv()
        if command is Command.SHUTDOWN:
            raise _Shutdown(bool(argument))
        return Reply.ACK, None
