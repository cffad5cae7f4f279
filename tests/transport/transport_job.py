"""The script both ranks of ``mpiexec -n 2`` run in tests/transport/test_mpi_transport.py: the
mpi4py transport's hot path (``MPIGroup.wire``/``send_now``/``try_recv``) and its goodbye.

Each rank writes its pid to ``OUT.pid<rank>``; rank 0 prints one ``ok ...`` line per check.
"""

from __future__ import annotations

import datetime
import functools
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from hpccollect.transport.mpi4py_group import MPIGroup, _world_ranks, mpi4py_comm, quiesce
from hpccollect.transport.rank_channel import RankChannel

SIZES = (40, 59_000, 3_000_000)  # a header, a CartPole batch, a transfer that takes a while
TAG = 3


def payload(size: int, seed: int) -> torch.Tensor:
    return torch.randint(
        0, 256, (size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )


def main() -> None:
    out = sys.argv[1]
    comm = mpi4py_comm()
    rank = comm.Get_rank()
    Path(f"{out}.pid{rank}").write_text(str(os.getpid()))
    group = MPIGroup(comm, "test-transport")
    assert group.world_ranks == [0, 1], group.world_ranks
    reversed_comm = comm.Split(0, -rank)  # a gathered job's kind of group: its own numbering
    assert _world_ranks(reversed_comm) == [1, 0], _world_ranks(reversed_comm)
    reversed_comm.Free()
    try:
        group.wire(torch.zeros(4, 4)[:, 0])
    except ValueError as err:
        assert "contiguous" in str(err), err
    else:
        raise AssertionError("a non-contiguous tensor was taken")
    if rank == 1:
        for seed, size in enumerate(SIZES * 3):
            group.send_now(group.wire(payload(size, seed)), 0, TAG, 30.0)
        group.abort()  # says goodbye
    else:
        start = time.monotonic()
        assert not group.try_recv(group.wire(torch.empty(8, dtype=torch.uint8)), 1, TAG + 1, 0.05)
        assert time.monotonic() - start < 2.0
        print("ok nothing to receive", flush=True)
        # the rest of a message that never comes (its sender stopped mid-message): the wait is
        # bounded like a send, and the link fails, named (RankChannel._await_rest)
        link = SimpleNamespace(
            _send_timeout=datetime.timedelta(seconds=0.3),
            _failure=None,
            _posted=[],
            peer=1,
            _group=lambda: group,
        )
        link._wait = functools.partial(RankChannel._wait, link)
        link._post_receive = functools.partial(RankChannel._post_receive, link)
        start = time.monotonic()
        try:
            RankChannel._await_rest(link, torch.empty(64), TAG + 2)
        except ConnectionError as err:
            assert "stopped mid-message" in str(err) and link._failure == str(err), err
            assert len(link._posted) == 1, "the receive never seen complete is kept"
            assert time.monotonic() - start < 5.0
            print("ok a message cut short fails its link", flush=True)
        for seed, size in enumerate(SIZES * 3):
            buf = torch.zeros(size, dtype=torch.uint8)
            wire = group.wire(buf)
            deadline = time.monotonic() + 30
            while not group.try_recv(wire, 1, TAG, 0.01):
                assert time.monotonic() < deadline, f"message {seed} never came"
            assert torch.equal(buf, payload(size, seed)), f"message {seed} ({size} B) differs"
        print("ok messages", flush=True)
        # a wire array is the caller's: dropped, it leaves its buffer free to be received into
        # again (``Spares``); one the group kept would make every large batch a new buffer
        buf = torch.zeros(SIZES[-1], dtype=torch.uint8)
        holds = torch._C._storage_Use_Count
        before = holds(buf.untyped_storage()._cdata)
        wire = group.wire(buf)
        assert holds(buf.untyped_storage()._cdata) > before
        del wire
        assert holds(buf.untyped_storage()._cdata) == before, "the group keeps the wire array"
        print("ok wire arrays are the caller's", flush=True)
        deadline = time.monotonic() + 30
        while group.stopped(1) is None:
            assert time.monotonic() < deadline, "rank 1's goodbye never came"
            time.sleep(1e-3)
        try:
            group.try_recv(group.wire(torch.empty(8, dtype=torch.uint8)), 1, TAG)
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
