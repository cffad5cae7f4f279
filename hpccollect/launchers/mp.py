"""``launcher="mp"``: collector ranks as local processes, rendezvous on loopback."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from hpccollect.collectors.workers.fork_server import JobForkServer
from hpccollect.collectors.workers.processes import start_local_workers
from hpccollect.launchers.base import Launcher
from hpccollect.launchers.rank import RankArgs, serve_rank
from hpccollect.transport.base import PeerLife
from hpccollect.transport.pipe import PipeChannel

__all__ = ["LocalRank", "MPLauncher"]


class LocalRank(PeerLife):
    """A rank in a child process: its sentinel tells its end at once; SIGKILL ends it."""

    def __init__(self, pipe: PipeChannel) -> None:
        self._pipe = pipe
        self.host, self.pid, self.sentinel = pipe.host, pipe.pid, pipe.life.sentinel

    def death(self, wait: float = 0.0) -> str | None:
        return self._pipe.life.death(wait)

    def join(self, timeout: float) -> bool:
        return self._pipe.life.join(timeout)

    def kill(self) -> None:
        self._pipe.life.kill()

    def close(self) -> None:
        self._pipe.close()


class MPLauncher(Launcher):
    """Collector ranks as local processes, on loopback, that exit when this process ends.

    Args:
        start_method: ``"forkserver"`` (default): the ranks fork from a job's server that
            imported torch and hpccollect once; ``"spawn"``: each rank is a fresh interpreter.
        daemon: whether the ranks are daemonic. Not by default, as TorchRL's: a rank's collector
            or env may start processes (a ``ParallelEnv``), which a daemonic process cannot.
            The collector ends its ranks at shutdown and at exit either way.
    """

    def __init__(self, start_method: str = "forkserver", daemon: bool = False) -> None:
        self.start_method, self.daemon = start_method, daemon
        self._server: JobForkServer | None = None

    def address(self) -> str:
        return "127.0.0.1"

    def start(self, ranks: Sequence[RankArgs]) -> list[PeerLife | None]:
        if self.start_method == "forkserver":
            self.close()
            self._server = JobForkServer()
            self._server.start()
        pipes = start_local_workers(
            _rank_process,
            [(args,) for args in ranks],
            self.start_method,
            name="hpccollect-rank",
            daemon=self.daemon,
            fork_server=self._server,
        )
        return [LocalRank(pipe) for pipe in pipes]

    def close(self) -> None:
        """End the job's fork server (once its ranks have ended)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()


def _rank_process(index: int, conn: Connection, args: RankArgs) -> None:
    # the pipe carries nothing: its end tells that rank 0 is gone, even before the groups exist
    threading.Thread(target=_exit_with_parent, args=(conn,), daemon=True).start()
    serve_rank(args)


def _exit_with_parent(conn: Connection) -> Any:
    with contextlib.suppress(EOFError, OSError):
        conn.recv()
    os._exit(0)
