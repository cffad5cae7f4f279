"""Starting collector ranks (``hpccollect.launchers.rank``): what a start-up timeout says."""

from __future__ import annotations

import re

import pytest

from hpccollect.errors import CollectorTimeoutError
from hpccollect.launchers.rank import _await_ranks, ready_key
from hpccollect.transport.groups import open_store

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("named", "late"), [(None, "[1, 3]"), ([0, 5, 6, 7], "[5, 7]")], ids=["job", "gathered"]
)
def test_ranks_that_do_not_join_are_named_as_the_job_numbers_them(named, late):
    """In a gathered MPI job a group numbers its ranks from 1; the message uses MPI's numbers,
    as every later message does."""
    store = open_store("127.0.0.1", 0, 4, True, 10)
    store.set(ready_key(2), "1")  # the second of three ranks is ready, the others never come
    with pytest.raises(
        CollectorTimeoutError, match=re.escape(f"collector ranks {late} did not join ")
    ):
        _await_ranks(store, [None, None, None], 0.2, "127.0.0.1:0", named)
