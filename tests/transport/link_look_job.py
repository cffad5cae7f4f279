"""The script every rank of ``mpiexec -n 4`` runs in tests/transport/test_link_look.py: rank 0
waits for its three links through the look they share (``LinkLook``), as its pool does.

Rank 1 sends two replies at once; rank 2 sends one each time rank 0 tells it to (twice); rank 3
sends one when rank 0 tells it to, then says goodbye. Rank 0 prints one ``ok ...`` line per
check.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from look_job import serve

from hpccollect.collectors.workers.pool import WorkerPool
from hpccollect.protocol import Reply
from hpccollect.transport.mpi4py_group import MPIGroup
from hpccollect.transport.polled import PolledRankChannel
from hpccollect.transport.wire import MESSAGES

GO = 99  # rank 0 to rank 2 or 3, on the job's own communicator: send your reply now


def run(comm: Any, group: MPIGroup) -> None:
    rank = comm.Get_rank()
    if rank:
        link = PolledRankChannel(
            SimpleNamespace(messages=group, broadcast=None), 0, send_timeout=30
        )
        if rank == 1:
            link.send((Reply.VALUE, 1))
            link.send((Reply.VALUE, 11))
        else:
            comm.recv(source=0, tag=GO)
            link.send((Reply.VALUE, rank))
            if rank == 3:
                group.abort()  # a goodbye right behind its last message
            else:
                comm.recv(source=0, tag=GO)
                link.send((Reply.VALUE, 22))
    else:
        look_on_rank_0(comm, group)
    comm.barrier()


def look_on_rank_0(comm: Any, group: MPIGroup) -> None:
    groups = SimpleNamespace(messages=group, broadcast=None)
    links = [PolledRankChannel(groups, peer, send_timeout=30.0) for peer in (1, 2, 3)]
    one, two, three = links
    look = one.look
    assert look is not None and look.whole and all(link.look is look for link in links)
    deadline = time.monotonic() + 30

    def wait_for(link: PolledRankChannel) -> None:
        while link not in look.wait(1.0, lambda c: c is link):
            assert time.monotonic() < deadline, f"rank {link.peer}'s link never had anything"

    started = time.monotonic()
    assert look.wait(0.2, lambda c: c is two) == []
    assert 0.2 <= time.monotonic() - started < 1.0, time.monotonic() - started
    print("ok a wait with nothing for it ends empty at its timeout", flush=True)

    wait_for(one)  # rank 1's first reply, taken in and left there
    while group.arrived(MESSAGES) != 1:  # its second, first in line for a probe from any rank
        assert time.monotonic() < deadline, "rank 1's second reply never came"
        time.sleep(1e-3)
    assert look.wait(0.0, lambda c: True) == [one]
    print("ok a link holding a message is found by each wait for it", flush=True)

    comm.send(None, dest=2, tag=GO)
    wait_for(two)  # its reply is behind rank 1's second, which rank 1's link cannot take yet
    assert two.recv() == (Reply.VALUE, 2)
    print("ok a message behind one its link cannot take yet is found", flush=True)
    assert one.recv() == (Reply.VALUE, 1)
    wait_for(one)
    assert one.recv() == (Reply.VALUE, 11)
    assert look.wait(0.05, lambda c: c is one) == []
    print("ok a link's messages come each once, in order", flush=True)

    comm.send(None, dest=3, tag=GO)
    wait_for(three)
    assert three.recv() == (Reply.VALUE, 3)
    while group.stopped(3) is None:  # its goodbye, taken by a look at its link alone
        assert time.monotonic() < deadline, "rank 3's goodbye never came"
        time.sleep(1e-3)
    wait_for(three)
    try:
        three.recv()
    except ConnectionError as err:
        assert "rank 3 closed its end" in str(err), err
    else:
        raise AssertionError("rank 3's link received after its goodbye")
    print("ok a goodbye ends its link, whichever look took it", flush=True)

    assert WorkerPool(links)._look is None  # too few links: the pool looks at each
    look.least = 3
    pool = WorkerPool(links)
    assert pool._look is look
    comm.send(None, dest=2, tag=GO)
    assert pool.wait_any({1}, Reply.VALUE, 10.0) == (1, 22)
    del pool  # not shut down at exit: the links are this job's to end
    print("ok a pool of enough links waits through their look", flush=True)

    two._weights_thread_starts()  # it gets a bell of its own: waits look at each link again
    assert two.look is None and not look.whole
    print("ok a link with a bell of its own leaves the look", flush=True)


if __name__ == "__main__":
    serve(run)
