"""A collector rank's life as rank 0 sees it: through the process its launcher started, where
there is one, else through the connection alone (ranks that mpiexec or srun started)."""

from __future__ import annotations

from typing import Protocol

from hpccollect.transport.base import PeerLife

__all__ = ["Connection", "RankLife"]


class Connection(Protocol):
    """What a rank's connection tells of the rank (``RankChannel`` fulfils it)."""

    def gone(self) -> str | None:
        """How the connection ended, once nothing more can arrive on it; None while open."""

    def join_peer(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the peer's end, seen through the connection."""


class RankLife(PeerLife):
    """A collector rank's life as rank 0 sees it: what the launcher's process tells (when it
    has one), else the connection (a rank that closed it, or whose groups failed, is gone)."""

    def __init__(self, channel: Connection, process: PeerLife | None) -> None:
        self._channel, self._process = channel, process
        self.host = getattr(process, "host", "") or "?"
        self.pid = getattr(process, "pid", None)
        self.sentinel = getattr(process, "sentinel", None)
        self.where = getattr(process, "where", "")
        self.can_end = process is not None and process.can_end

    def death(self, wait: float = 0.0) -> str | None:
        if self._process is not None:
            how = self._process.death(wait)
            if how is not None:
                return how
        return self._channel.gone()

    def join(self, timeout: float) -> bool:
        if self._process is not None:
            return self._process.join(timeout)
        return self._channel.join_peer(timeout)

    def kill(self) -> None:
        if self._process is not None:
            self._process.kill()

    def close(self) -> None:
        if self._process is not None:
            self._process.close()
