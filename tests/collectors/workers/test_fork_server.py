"""A job's own fork server (``collectors/workers/fork_server.py``), on this Python's real
``multiprocessing``: the one place the package reaches into it, so these tests fail when a
Python release changes what it reaches (the fork-server ``Popen``'s launch, the server's state)."""

from __future__ import annotations

import os
import sys
from multiprocessing import forkserver
from multiprocessing.connection import Connection

import pytest

from hpccollect.collectors.workers.fork_server import JobForkServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rpartition(")")[2].split()[1])


def test_processes_fork_from_the_jobs_server_with_their_descriptors_and_exit_codes():
    """A process started in ``forking()`` is the server's child, gets the pipe ends it was
    given (descriptors passed through the server), and its exit code comes back; Python's own
    fork-server entry point is left as it was, nothing starts through the server outside
    ``forking()``, and ``close`` ends the server."""
    python_s = forkserver.connect_to_new_process
    server = JobForkServer(preload=())
    server.start()
    pid = None
    try:
        with server.forking() as ctx:
            assert ctx.get_start_method() == "forkserver"
            there, here = ctx.Pipe()
            waiter = ctx.Process(target=Connection.recv_bytes, args=(there,))
            talker = ctx.Process(target=Connection.send_bytes, args=(there, b"through it"))
            ender = ctx.Process(target=sys.exit, args=(3,))
            for process in (waiter, talker, ender):
                process.start()
            assert forkserver.connect_to_new_process is python_s
        pid = server.pid
        assert pid is not None and _parent_of(waiter.pid) == pid
        assert here.poll(60) and here.recv_bytes() == b"through it"
        here.send_bytes(b"go")
        for process in (waiter, talker, ender):
            process.join(60)
        assert (waiter.exitcode, talker.exitcode, ender.exitcode) == (0, 0, 3)
        later = server.context.Process(target=sys.exit, args=(0,))
        with pytest.raises(RuntimeError, match="only inside JobForkServer.forking"):
            later.start()
    finally:
        server.close()
    assert server.pid is None and not os.path.exists(f"/proc/{pid}")
