"""Starting collector ranks (``hpccollect.launchers.rank``): what a start-up timeout says."""

from __future__ import annotations

import re

import pytest

from hpccollect.errors import CollectorTimeoutError
from hpccollect.launchers.rank import start_ranks
from hpccollect.transport.control import connect

pytestmark = pytest.mark.timeout(60)


class _OnlyTheSecond:
    """A launcher whose second of three ranks connects, the others never come."""

    mpi_world = False

    def __init__(self, named: list[int] | None) -> None:
        self.world_ranks = named
        self.links: list = []
        self.closed = False

    def address(self) -> str:
        return "127.0.0.1"

    def start(self, ranks: list) -> list:
        second = ranks[1]
        self.links.append(connect(second.control, second.rank, second.token, 5.0, None))
        return [None] * len(ranks)

    def close(self) -> None:
        self.closed = True
        for link in self.links:
            link.close()


@pytest.mark.parametrize(
    ("named", "late"), [(None, "[1, 3]"), ([0, 5, 6, 7], "[5, 7]")], ids=["job", "gathered"]
)
def test_ranks_that_do_not_join_are_named_as_the_job_numbers_them(named, late):
    """In a gathered MPI job a group numbers its ranks from 1; the message uses MPI's numbers,
    as every later message does. The launcher is closed."""
    launcher = _OnlyTheSecond(named)
    with pytest.raises(
        CollectorTimeoutError, match=re.escape(f"collector ranks {late} did not join ")
    ):
        start_ranks(
            launcher, [b""] * 3, port=0, backend="gloo", start_timeout=0.5, send_timeout=5.0
        )
    assert launcher.closed
