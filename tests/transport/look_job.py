"""The script every rank of ``mpiexec -n 4`` runs in tests/transport/test_mpi_transport.py:
rank 0 looks at its three links (``wait_ready`` over ``PolledRankChannel``s), as it does each
time it looks for a batch.

Rank 1 sends a reply at once, rank 2 only when rank 0 tells it to, rank 3 sends one and says
goodbye at once. Rank 0 prints one ``ok ...`` line per check.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from hpccollect.protocol import Reply
from hpccollect.transport.base import wait_ready
from hpccollect.transport.mpi4py_group import MPIGroup, mpi4py_comm, quiesce
from hpccollect.transport.polled import PolledRankChannel

GO = 99  # rank 0 to rank 2, on the job's own communicator: send your reply now


def serve(run: Callable[[Any, MPIGroup], None]) -> None:
    """Every rank: ``run(comm, group)`` over a group of the job's communicator, then its end
    (rank 3's ``run`` ends its own); an error ends the whole job (link_look_job.py too)."""
    comm = mpi4py_comm()
    try:
        group = MPIGroup(comm, "test-look")
        run(comm, group)
        if comm.Get_rank() != 3:
            group.abort()
        quiesce(timeout=5.0)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        comm.Abort(1)  # the other ranks wait in a barrier: end them too


def run(comm: Any, group: MPIGroup) -> None:
    rank = comm.Get_rank()
    groups = SimpleNamespace(messages=group, broadcast=None)
    if rank:
        link = PolledRankChannel(groups, 0, send_timeout=30.0)
        if rank == 2:
            comm.recv(source=0, tag=GO)
        link.send((Reply.VALUE, rank))
        if rank == 3:
            group.abort()  # a goodbye right behind its last message
        comm.barrier()
    else:
        links = [PolledRankChannel(groups, peer, send_timeout=30.0) for peer in (1, 2, 3)]
        seen: set[int] = set()
        deadline = time.monotonic() + 30
        while group.stopped(3) is None:  # its goodbye taken before its message is
            assert time.monotonic() < deadline, "rank 3's goodbye never came"
            time.sleep(1e-3)
        while seen != {1, 3}:
            assert time.monotonic() < deadline, f"only {seen} seen"
            seen |= {link.peer for link in wait_ready(links, 1.0)}
        print("ok a look finds the links with something", flush=True)
        assert links[0].recv() == (Reply.VALUE, 1)
        # what rank 3 sent before its goodbye still comes, then the link is closed
        assert links[2].recv() == (Reply.VALUE, 3)
        assert not wait_ready(links[1:2], 0.05)
        while links[2] not in wait_ready(links[2:], 1.0):
            assert time.monotonic() < deadline, "rank 3's goodbye never ended its link"
        try:
            links[2].recv()
        except ConnectionError as err:
            assert "rank 3 closed its end" in str(err), err
        else:
            raise AssertionError("rank 3's link received after its goodbye")
        print("ok a message before a goodbye still comes", flush=True)
        comm.send(None, dest=2, tag=GO)
        while links[1] not in wait_ready(links, 1.0):
            assert time.monotonic() < deadline, "rank 2's reply never came"
        assert links[1].recv() == (Reply.VALUE, 2)
        print("ok the silent link's reply", flush=True)
        comm.barrier()


if __name__ == "__main__":
    serve(run)
