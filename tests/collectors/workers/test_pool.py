"""The pool's own bookkeeping of replies that a wait took in for a later one (no channel is
touched: a reply kept in the pool is found without a look at any worker)."""

from __future__ import annotations

import pytest

from hpccollect.collectors.workers.pool import WorkerPool
from hpccollect.protocol import Reply


@pytest.fixture
def pool():
    pool = WorkerPool([None] * 6)  # the waits below are served from what the pool keeps
    yield pool
    pool._closed = True  # it holds no channel to shut down


def test_a_wait_takes_the_oldest_kept_reply_of_the_workers_it_waits_on(pool):
    pool._keep(4, (Reply.BATCH, "4a"))
    pool._keep(1, (Reply.ACK, "1 ack"))
    pool._keep(1, (Reply.BATCH, "1a"))
    pool._keep(2, (Reply.BATCH, "2a"))
    pool._keep(4, (Reply.BATCH, "4b"))
    # worker 4 is not waited on: its batches stay; worker 1's acknowledgement is passed over
    assert pool.wait_any({1, 2}, Reply.BATCH, 1.0) == (1, "1a")
    assert pool.wait_any({1, 2}, Reply.BATCH, 1.0) == (2, "2a")
    assert pool.wait_any({0, 4}, Reply.BATCH, 1.0) == (4, "4a")
    assert pool.recv(1, Reply.ACK, 1.0) == "1 ack"
    assert pool.wait_any(range(6), Reply.BATCH, 1.0) == (4, "4b")
    assert not pool._stocked and not any(pool._inbox)


def test_a_reply_put_back_first_is_taken_first(pool):
    pool._keep(3, (Reply.BATCH, "later"))
    pool._keep(3, (Reply.BATCH, "first"), first=True)
    assert [pool.recv(3, Reply.BATCH, 1.0) for _ in range(2)] == ["first", "later"]
