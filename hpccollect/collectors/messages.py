"""Every message between a multi-process collector and its workers, declared once.

Parent -> worker: ``(Command, argument)``; worker -> parent: ``(Reply, payload)``. Batches never
travel as messages: a worker writes them into shared memory and replies ``BATCH`` with the number
of frames written.
"""

from __future__ import annotations

import enum

__all__ = ["Command", "Reply"]


class Command(enum.Enum):
    """What the parent asks a worker to do (the argument each takes)."""

    COLLECT = "collect"  # None: write one batch into the shared buffers, reply BATCH
    UPDATE_WEIGHTS = "update_weights"  # None: load the shared weights buffer, reply ACK
    SEED = "seed"  # (seed, static_seed): reply SEEDED with the last seed used
    RESET = "reset"  # None: reset every env before the next batch, reply ACK
    STATE_DICT = "state_dict"  # None: reply STATE with the worker collector's state_dict
    LOAD_STATE_DICT = "load_state_dict"  # state dict: reply ACK
    FILL_BUFFER = "fill_buffer"  # replay buffer: extend it until STOP_FILLING, then reply ACK
    STOP_FILLING = "stop_filling"  # None: sent while filling; answered by FILL_BUFFER's ACK
    SHUTDOWN = "shutdown"  # close_env (bool): close, reply ACK, exit


class Reply(enum.Enum):
    """What a worker sends back (its payload)."""

    LAYOUT = "layout"  # TensorDict over the shared batch buffers, sent once at start
    BATCH = "batch"  # frames written into the shared buffers
    SEEDED = "seeded"  # last seed used
    STATE = "state"  # state dict
    ACK = "ack"  # None
    ERROR = "error"  # (exception type name, message, formatted traceback)
