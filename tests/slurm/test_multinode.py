"""SLURM over two simulated nodes (``slurm/up.sh --nodes 2``: node1 and node2 are network and
UTS namespaces on a bridge, each with its own slurmd; slurmctld runs here, on the bridge):
``sbatch -N 2 jobs/collect.sh`` with each node writing its own shards, ``sbatch -N 2
jobs/train.sh``, and ``launcher="submitit"`` from this host with the ranks on the nodes. No
address flag anywhere. The fixture checks that no daemon, namespace, link or /etc/hosts line
is left."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hpccollect.distributed.collector import DistributedDataCollector
from hpccollect.storage import open_dataset

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.nodes,
    pytest.mark.mpi,
    pytest.mark.slow,
    pytest.mark.usefixtures("no_mpich_segments_left"),
]
if shutil.which("ip") is None:
    pytestmark.append(pytest.mark.skip(reason="needs ip (simulated nodes)"))

REPO = Path(__file__).resolve().parents[2]
Cluster = Any  # slurm_cluster.Cluster
# MPI between the nodes over libfabric's tcp provider, on each node's own link. Not UCX: its
# addresses are long, and under srun's PMI2 (SLURM 22.05 with MPICH's wheel) long values get
# mangled on a busy machine: "mpi/pmi2: value not properly terminated", then a hang in MPI_Init.
OFI = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}


def sbatch(cluster: Cluster, cwd: Path, name: str, job: Path, *args: str, **env: str):
    """``sbatch --wait -N 2 --ntasks 3 JOB ARGS`` from ``cwd``: (job id, exit code, log text)."""
    return cluster.sbatch_wait(
        cwd, name, job, *args, options=("-N", "2", "--ntasks", "3"), **OFI, **env
    )


@pytest.mark.timeout(300)
def test_sbatch_collect_over_two_nodes_each_node_writes_its_shard(
    slurm_nodes_cluster: Cluster, tmp_path: Path
) -> None:
    """Rank 0 and rank 1 on node1, rank 2 on node2: each collector rank writes its shard on
    its node (the file says which), and rank 0's view reads them whole."""
    total = 2000
    args = ["--collector", "single", "--frames-per-batch", "200", "--seed", "3"]
    job, code, text = sbatch(
        slurm_nodes_cluster, tmp_path, "t-nodes", REPO / "jobs" / "collect.sh",
        *args, "--total-frames", str(total), "--shards", "--quiet",
    )  # fmt: skip
    assert code == 0, text
    assert f"hpccollect job {job} on node[1-2]: 3 ranks" in text, text
    assert "rank 0 on node1" in text, text
    run = tmp_path / "runs" / f"t-nodes-{job}"
    hosts, episodes = {}, []
    for rank in (1, 2):
        with open_dataset(run / "data.shards" / f"rank-{rank:04d}.h5") as shard:
            assert shard.complete and shard.written_steps > 0
            hosts[rank] = shard.metadata["host"]
            episodes.append(set(np.unique(shard.episode_ids).tolist()))
    assert hosts == {1: "node1", 2: "node2"}
    with open_dataset(run / "data.h5") as merged:
        assert merged.complete and len(merged) == total
        assert set(np.unique(merged.episode_ids).tolist()) == episodes[0] | episodes[1]
    assert not episodes[0] & episodes[1]
    inspect = subprocess.run(
        [sys.executable, "-m", "hpccollect", "inspect", str(run / "data.h5")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert inspect.returncode == 0, inspect.stderr
    assert "written on        - (per shard: node1, node2)" in inspect.stdout, inspect.stdout
    slurm_nodes_cluster.assert_job_gone(job)


@pytest.mark.timeout(300)
def test_sbatch_train_over_two_nodes_learns(slurm_nodes_cluster: Cluster, tmp_path: Path) -> None:
    args = ["--total-frames", "24000", "--frames-per-batch", "2000", "--seed", "0"]
    job, code, text = sbatch(
        slurm_nodes_cluster, tmp_path, "t-ntrain", REPO / "jobs" / "train.sh", *args,
        HPCCOLLECT_TRAIN_SCRIPT=str(REPO / "examples" / "ppo_distributed.py"),
    )  # fmt: skip
    assert code == 0, text
    assert f"hpccollect train job {job} on node[1-2]: 3 ranks" in text, text
    finals = re.findall(r"^final mean return (\d+\.\d) over (\d+) frames$", text, re.M)
    assert len(finals) == 1 and finals[0][1] == "24000" and float(finals[0][0]) > 80, text
    assert (tmp_path / "runs" / f"t-ntrain-{job}" / "curve.csv").exists()
    slurm_nodes_cluster.assert_job_gone(job)


@pytest.mark.timeout(240)
def test_submitit_ranks_on_the_nodes_reach_rank_0_here(
    slurm_nodes_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 is this process, on neither node: it listens on its address on the bridge that
    reaches them, found from the nodes' addresses with no flag."""
    monkeypatch.setenv("SLURM_CONF", slurm_nodes_cluster.env["SLURM_CONF"])
    monkeypatch.delenv("HPCCOLLECT_SUBMITIT_CLUSTER", raising=False)
    collector = DistributedDataCollector(
        ["CartPole-v1", "CartPole-v1"],
        None,
        frames_per_batch=100,
        total_frames=1000,
        launcher="submitit",
        slurm_kwargs={"folder": str(tmp_path), "slurm_nodes": 1},
        start_timeout=120.0,
    )
    try:
        ids = [str(job.job_id) for job in collector.launcher.jobs]
        frames = sum(batch.numel() for batch in collector)
        hosts = {channel.host for channel in collector._pool.channels}
    finally:
        collector.shutdown()
    assert frames == 1000
    assert hosts <= {"node1", "node2"} and socket.gethostname() not in hosts, hosts
    for job in ids:
        slurm_nodes_cluster.wait_gone(job, 20)
        assert slurm_nodes_cluster.job_processes(job) == []
