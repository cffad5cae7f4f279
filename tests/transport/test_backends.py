"""The registered transports (``transport/backends.py``) as a job opens them: real gloo groups
through a real store."""

from __future__ import annotations

import os

from conftest import native_threads


def test_a_gloo_job_moves_batches_and_broadcasts_on_one_group_on_the_stores_interface():
    """Gloo's point-to-point transfers and broadcasts share one group, listening where rank
    0's store is: one network thread (it wakes every 10 ms, on rank 0 too), released with the
    group; torch's environment switches are set only while it is made."""
    from hpccollect.transport.backends import _gloo_interface
    from hpccollect.transport.groups import RankGroups, open_store

    store = open_store("127.0.0.1", 0, 1, True, 10.0)
    assert _gloo_interface(store) == "lo"
    before = {k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "TORCH_GLOO_LAZY_INIT")}
    loops = native_threads("gloo_tcp_loop")
    groups = RankGroups.open("gloo", store, 0, 1)
    assert groups.messages is not None and groups.broadcast is groups.messages
    assert native_threads("gloo_tcp_loop", loops + 1) == loops + 1
    assert {k: os.environ.get(k) for k in before} == before
    groups.close()
    assert native_threads("gloo_tcp_loop", loops) == loops
