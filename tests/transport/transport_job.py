"""The script both ranks of ``mpiexec -n 2`` run in tests/transport/test_mpi_transport.py: the
mpi4py transport as the rank channels use it (``MPIGroup.send``/``recv``/``broadcast``, each
transfer announced first, a batch's receive posted before it is sent) and its goodbye.

Each rank writes its pid to ``OUT.pid<rank>``; rank 0 prints one ``ok ...`` line per check.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path

import torch

from hpccollect.errors import CollectorTimeoutError
from hpccollect.launchers.rendezvous import on_one_node
from hpccollect.transport.mpi4py_group import MPIGroup, _world_ranks, mpi4py_comm, quiesce

SIZES = (40, 59_000, 3_000_000)  # a small message, a CartPole batch, a transfer that takes a while
TAG = 0
WAIT = datetime.timedelta(seconds=30)


def payload(size: int, seed: int) -> torch.Tensor:
    return torch.randint(
        0, 256, (size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )


def main() -> None:
    out = sys.argv[1]
    comm = mpi4py_comm(on_one_node())
    rank = comm.Get_rank()
    Path(f"{out}.pid{rank}").write_text(str(os.getpid()))
    group = MPIGroup(comm, "test-transport")
    assert group.world_ranks == [0, 1], group.world_ranks
    reversed_comm = comm.Split(0, -rank)  # a gathered job's kind of group: its own numbering
    assert _world_ranks(reversed_comm) == [1, 0], _world_ranks(reversed_comm)
    reversed_comm.Free()
    try:
        group.send([torch.zeros(4, 4)[:, 0]], 1 - rank, TAG)
    except ValueError as err:
        assert "contiguous" in str(err), err
    else:
        raise AssertionError("a non-contiguous tensor was taken")
    weights = torch.zeros(1000, dtype=torch.uint8)
    if rank == 1:
        for seed, size in enumerate(SIZES * 3):
            group.send([payload(size, seed)], 0, TAG).wait(WAIT)
        group.broadcast(weights, 0).wait(WAIT)
        assert torch.equal(weights, payload(1000, 99)), "the broadcast's weights differ"
        group.abort()  # says goodbye
    else:
        start = time.monotonic()
        try:  # a wait for what never comes is bounded
            group.recv([torch.empty(8, dtype=torch.uint8)], 1, TAG + 1).wait(
                datetime.timedelta(seconds=0.2)
            )
        except CollectorTimeoutError:
            assert time.monotonic() - start < 5.0
            print("ok a wait for nothing is bounded", flush=True)
        for seed, size in enumerate(SIZES * 3):
            buf = torch.zeros(size, dtype=torch.uint8)
            posted = group.recv([buf], 1, TAG)  # posted first, as a rank channel keeps it
            posted.wait(WAIT)
            assert torch.equal(buf, payload(size, seed)), f"message {seed} ({size} B) differs"
        print("ok messages", flush=True)
        weights.copy_(payload(1000, 99))
        group.broadcast(weights, 0).wait(WAIT)
        print("ok broadcast", flush=True)
        deadline = time.monotonic() + 30
        while group.stopped(1) is None:
            assert time.monotonic() < deadline, "rank 1's goodbye never came"
            time.sleep(1e-3)
        try:
            group.recv([torch.empty(8, dtype=torch.uint8)], 1, TAG).wait(WAIT)
        except RuntimeError as err:
            assert "rank 1 closed its end" in str(err), err
            print("ok goodbye", flush=True)
        group.abort()
    quiesce(timeout=5.0)
    assert not group.calls, "a call is still counted inside the group"
    if rank == 0:
        print("ok quiesced", flush=True)


if __name__ == "__main__":
    main()
