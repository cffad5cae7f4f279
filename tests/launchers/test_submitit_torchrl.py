"""``launcher="submitit"`` side by side with TorchRL's own, on the project's SLURM cluster: the
same ``DistributedSyncCollector`` call, torchrl's and hpccollect's, each rank a SLURM job.

In the second test environment (torchrl 0.14.1); without torchrl it skips, unless
HPCCOLLECT_REQUIRE_TORCHRL=1 (CI's torchrl run), where it fails.
"""

from __future__ import annotations

import os
import socket
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

if os.environ.get("HPCCOLLECT_REQUIRE_TORCHRL") != "1":
    pytest.importorskip("torchrl")

from layouts import leaves
from torchrl.envs import GymEnv

Cluster = Any  # slurm_cluster.Cluster

pytestmark = [
    pytest.mark.torchrl,
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning"),
]

#: what both collectors' rank jobs ask of the cluster (TorchRL's defaults name a "train"
#: partition of 32-CPU nodes, which the project's cluster has not)
SLURM_KWARGS = {"timeout_min": 5, "slurm_partition": "debug", "slurm_cpus_per_task": 1}


def _batches(cls: type, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> tuple[list, set]:
    """Every batch of a 2-rank sync collection over SLURM jobs, the collector shut down, and
    the jobs that ran while it collected."""
    for name, value in cluster.env.items():  # rank 0 submits to this cluster
        monkeypatch.setenv(name, value)
    with socket.socket() as probe:  # TorchRL's ranks are told the port in advance
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = partial(GymEnv, "CartPole-v1")  # importable in the jobs, as a user's would be
    before = set(cluster.queued())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collector = cls(
            [env, env], None, frames_per_batch=40, total_frames=120, launcher="submitit",
            slurm_kwargs=SLURM_KWARGS, tcp_port=port,
        )  # fmt: skip
        batches, running = [], set()
        try:
            for batch in collector:
                batches.append(batch.clone())
                running |= set(cluster.queued()) - before
        finally:
            collector.shutdown()
    return batches, running


@pytest.mark.timeout(300)
def test_distributed_sync_collector_over_submitit_as_torchrls(
    slurm_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TorchRL's ``DistributedSyncCollector`` and hpccollect's, the same call with
    ``launcher="submitit"`` on the project's SLURM cluster: the same batches (keys, shapes,
    dtypes, ``[2, 20]`` stacked over the ranks), each rank's row its own CartPole steps, and
    every rank job gone from the queue, with no process of it left, after ``shutdown()``."""
    from torchrl.collectors.distributed import DistributedSyncCollector as Theirs

    from hpccollect.collectors.distributed import DistributedSyncCollector as Ours

    monkeypatch.chdir(tmp_path)  # TorchRL's executor writes its logs to ./log_test
    before = set(slurm_cluster.queued())
    results = {}
    for name, cls in (("theirs", Theirs), ("ours", Ours)):
        results[name], jobs = _batches(cls, slurm_cluster, monkeypatch)
        assert len(jobs) == 2, f"{name}: expected one SLURM job per rank, saw {jobs}"
        for job in jobs:
            slurm_cluster.wait_gone(job, 60)
            slurm_cluster.assert_job_gone(job)
    theirs, ours = results["theirs"], results["ours"]
    assert len(ours) == len(theirs) == 3
    for mine, their in zip(ours, theirs, strict=True):
        assert leaves(mine) == leaves(their)
        assert mine.batch_size == their.batch_size == torch.Size([2, 20])
        for row in mine.unbind(0):  # one rank's steps: an episode's observations follow on
            same = ~row["next", "done"].squeeze(-1)[:-1]
            assert torch.equal(row["next", "observation"][:-1][same], row["observation"][1:][same])
    assert set(slurm_cluster.queued()) == before
