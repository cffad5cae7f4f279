"""Gathering among an MPI job's ranks (``MPILauncher(gather=...)``): the groups, the arguments it
refuses, and real ``mpiexec`` jobs (``gather_job.py``) whose rank 0 takes one batch per group and
yields them laid out as without gathering."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import mpirun
import pytest
import torch
from mpirun import assert_gone, job_pids
from tensordict import TensorDict

from hpccollect.distributed.collector import GroupGatherer
from hpccollect.distributed.gathered import Gathered
from hpccollect.errors import ArgumentTypeError, ArgumentValueError
from hpccollect.launchers.mpi_gather import check_gather, gather_groups

JOB = Path(__file__).with_name("gather_job.py")
MPI_JOB = [
    pytest.mark.mpi,
    pytest.mark.slow,
    pytest.mark.usefixtures("no_mpich_segments_left"),
    mpirun.needs(),
]


def mpi_job(test):
    """The marks of a test that runs ``mpiexec``."""
    for mark in MPI_JOB:
        test = mark(test)
    return test


def test_groups_are_a_hosts_ranks_or_blocks_of_consecutive_ranks():
    hosts = ["a", "a", "b", "a", "b", "c", "c"]  # rank 0 on a; a group per host, in rank order
    assert gather_groups("node", hosts) == [[1, 3], [2, 4], [5, 6]]
    assert gather_groups(3, ["h"] * 9) == [[1, 2, 3], [4, 5, 6], [7, 8]]
    assert gather_groups(4, ["h"] * 9) == [[1, 2, 3, 4], [5, 6, 7, 8]]


def test_a_gatherer_left_alone_or_a_bad_gather_is_refused_with_the_fix():
    with pytest.raises(ArgumentValueError, match=r"rank 4 on b alone .* 2 collector ranks"):
        gather_groups("node", ["a", "a", "a", "a", "b"])
    with pytest.raises(ArgumentValueError, match=r"rank 5 alone .* group size"):
        gather_groups(2, ["h"] * 6)
    with pytest.raises(ArgumentValueError, match="at least 2"):
        check_gather(1)
    with pytest.raises(ArgumentTypeError, match="'node' or a number"):
        check_gather("nodes")
    assert check_gather(None) is None and check_gather("node") == "node"


def arguments(**given) -> dict:
    """Rank 0's DistributedDataCollector arguments as ``Gathered`` reads them."""
    base = dict.fromkeys(
        (
            "rank_sink",
            "trajs_per_batch",
            "policy_factory",
            "device",
            "env_device",
            "policy_device",
            "exploration_mode",
            "weight_sync_schemes",
            "weight_recv_schemes",
        )
    )
    base |= {
        "sync": True,
        "rank_reports": False,
        "track_policy_version": False,
        "frames_per_batch": 64,
        "on_worker_failure": "raise",
        "init_random_frames": -1,
        "worker_timeout": 100.0,
        "start_timeout": 50.0,
        "liveness_timeout": 30.0,
        "max_frames_per_traj": -1,
        "reset_at_each_iter": False,
        "exploration_type": "random",
        "collector_class": "single",
        "num_workers_per_collector": 1,
        "backend": "mpi",
    }
    return base | given


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("rank_sink", print),
        ("rank_reports", True),
        ("track_policy_version", True),
        ("on_worker_failure", "continue"),
    ],
)
def test_what_gathering_cannot_honour_is_named(name, value):
    with pytest.raises(ArgumentValueError, match=f"{name}.* cannot be used with gathering"):
        Gathered([[2, 3]], arguments(**{name: value}))


def test_a_per_rank_frames_per_batch_is_refused():
    with pytest.raises(ArgumentValueError, match="frames_per_batch is a list"):
        Gathered([[2, 3]], arguments(frames_per_batch=[8, 8]))


def test_ranks_not_in_blocks_get_their_own_envs_and_their_rows_come_back_in_rank_order():
    """``gather="node"`` with ranks placed round-robin over two nodes (``--map-by node``):
    groups [1, 3, 5] and [2, 4, 6] gather [3, 5] and [4, 6]. Each rank gets the env listed at
    its place in rank order; rank 0 puts the rows of a round (3, 5, 4, 6) back in rank order;
    each gatherer's share of the random frames is its ranks'."""
    gathered = Gathered([[3, 5], [4, 6]], arguments(init_random_frames=10))
    fns, kwargs, fpb = gathered.split(
        ["env3", "env4", "env5", "env6"], [{"r": 3}, {"r": 4}, {"r": 5}, {"r": 6}], 64, True
    )
    assert fns == ["env3", "env4"] and kwargs == [{}, {}] and fpb == [32, 32]
    spec = gathered.spec(1, None, {"frames_per_batch": 32}, 1, GroupGatherer)
    assert spec.collector_class is GroupGatherer
    assert spec.create_env_fn == ["env4", "env6"]
    assert spec.kwargs["collector_kwargs"] == [{"r": 4}, {"r": 6}]
    assert spec.kwargs["init_random_frames"] == 6  # 3 a rank, as 10 over 4 ranks would be
    assert spec.kwargs["worker_timeout"] == 90.0  # the gatherer names a stuck rank first
    rows = TensorDict({"rank": torch.tensor([3, 5, 4, 6])}, [4])
    assert gathered.in_rank_order(rows)["rank"].tolist() == [3, 4, 5, 6]
    blocks = Gathered([[2, 3], [5, 6]], arguments())
    assert blocks.order is None  # mpiexec's default placement: nothing to reorder


def run(tmp_path: Path, *args: str, ranks: int = 7, timeout: float = 100) -> tuple:
    out = tmp_path / "out.pt"
    code, output, _ = mpirun.run(JOB, out, *args, ranks=ranks, timeout=timeout)
    return out, code, output


def check_batches(out: Path, per_rank: int, batches: int) -> None:
    """Rank 0's batches: one row per collecting rank, in rank order (each row's largest
    observation is its rank), the policy's first weights in the first batch and the sent ones
    after it, and trajectory ids that no two rows, nor two batches' new trajectories, share."""
    saved = torch.load(out, weights_only=False)
    collecting = saved["collecting"]
    rows = len(collecting)
    got = [TensorDict(b, batch_size=[rows, per_rank]) for b in saved["batches"]]
    assert len(got) == batches
    seen: set[int] = set()
    for i, batch in enumerate(got):
        assert [int(row.max()) for row in batch["next", "observation"]] == collecting
        assert batch["action"][..., 1].float().mean().item() == (0.0 if i == 0 else 1.0)
        ids = [set(row.unique().tolist()) for row in batch["collector", "traj_ids"]]
        assert sum(map(len, ids)) == len(set().union(*ids)), "two ranks share a trajectory id"
        seen |= set().union(*ids)
    assert saved["versions"] == [1] * len(saved["versions"])  # one update, to each gatherer
    assert len(seen) > rows * batches  # every rank's episodes end within a batch


@mpi_job
@pytest.mark.parametrize(
    "backend", [pytest.param("mpi", marks=pytest.mark.anympi), pytest.param("gloo")]
)
@pytest.mark.timeout(150)
def test_a_trainer_takes_one_batch_a_group_laid_out_as_every_ranks(tmp_path, backend):
    """``mpiexec -n 7``, groups of 3: gatherers 1 and 4 each collect from two ranks, and rank
    0 yields ``[4, T]`` batches, rows in rank order, the weights it sends reaching every rank
    through the gatherers. The job exits 0 and leaves no process."""
    out, code, output = run(tmp_path, "--gather", "3", "--backend", backend)
    assert code == 0, output
    check_batches(out, 16, 3)
    assert len(torch.load(out, weights_only=False)["versions"]) == 2  # one a gatherer
    assert_gone(job_pids(out))


@mpi_job
@pytest.mark.timeout(150)
def test_with_sync_false_each_groups_round_comes_as_it_is_ready(tmp_path):
    out, code, output = run(tmp_path, "--gather", "3", "--sync", "0")
    assert code == 0, output
    saved = torch.load(out, weights_only=False)
    groups = [[2, 3], [5, 6]]
    for raw in saved["batches"]:
        batch = TensorDict(raw, batch_size=[2, 32])  # frames_per_batch (64) over one group
        assert [int(row.max()) for row in batch["next", "observation"]] in groups
    assert_gone(job_pids(out))


@mpi_job
@pytest.mark.timeout(150)
def test_a_replay_buffer_gets_a_frame_an_item_as_without_gathering(tmp_path):
    out, code, output = run(tmp_path, "--gather", "3", "--mode", "buffer", "--batches", "2")
    assert code == 0, output
    extends = torch.load(out, weights_only=False)["buffer"]
    # a rank's row an extend, as each worker's part without gathering
    assert [TensorDict(e)["next", "observation"].shape for e in extends] == [(16, 1)] * 8
    assert_gone(job_pids(out))


@mpi_job
@pytest.mark.timeout(150)
def test_an_error_on_a_gathered_rank_names_it_and_ends_the_job(tmp_path):
    out, code, output = run(tmp_path, "--gather", "3", "--mode", "raise")
    assert code != 0
    # MPI's own numbers: rank 6, through its gatherer, rank 4
    assert "Rank 4 (worker 1) on" in output and "Rank 6 (worker 1) on" in output, output
    assert "the last collecting rank's env fails on purpose" in output
    assert "aborting the whole job" in output
    assert_gone(job_pids(out))


@mpi_job
@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("stopped", "says"),
    [
        # what the output says: one of these, each line of it
        (6, [["Rank 4 (worker 1) on", "Rank 6 (worker 1) on", "collector rank 6 (pid"]]),
        (4, [["collector rank 4 (pid"], ["its gatherer, rank 4, has sent nothing"]]),
    ],
    ids=["a-gathered-rank", "a-gatherer"],
)
def test_a_silent_rank_or_gatherer_ends_the_job_within_its_liveness_timeout(
    tmp_path, stopped, says
):
    """SIGSTOP to rank 6 (its gatherer, 4, notices within ``liveness_timeout`` and rank 0 raises
    naming both) or to gatherer 4 (rank 0 notices, and so do 4's ranks, whichever first)."""
    out = tmp_path / "out.pt"
    args = ("--gather", "3", "--mode", "wait", "--liveness", "3")
    with mpirun.started(JOB, out, *args, ranks=7, output=True) as proc:
        pid = int((tmp_path / f"out.pt.pid{stopped}").read_text())
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            output, _ = proc.communicate(timeout=30)
            assert time.monotonic() - stopped_at < 15, output
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert proc.returncode != 0
    assert any(all(line in output for line in lines) for lines in says), output
    assert_gone(job_pids(out))


@mpi_job
@pytest.mark.alone
@pytest.mark.timeout(300)
def test_64_collector_ranks_gathered_in_eights(tmp_path):
    """``mpiexec -n 65``, groups of 8: 8 gatherers each take 7 ranks' batches, and rank 0 takes
    8 messages a round instead of 56. Exit 0, every row in place, nothing left running."""
    out, code, output = run(tmp_path, "--gather", "8", "--per-rank", "64", ranks=65, timeout=250)
    assert code == 0, output[-3000:]
    assert "BAD TERMINATION" not in output
    check_batches(out, 64, 3)
    assert len(torch.load(out, weights_only=False)["versions"]) == 8
    assert_gone(job_pids(out))
