"""DistributedDataCollector under a real ``mpiexec -n 3`` (the ``mpich`` package's hydra):
``launcher="mpi"`` with gloo and with the mpi4py transport, against the ``mp`` launcher's data,
and the faults MPI adds (a rank raising, a rank killed)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import mpirun
import pytest
import torch
from conftest import assert_each_holds_its_own
from mpirun import assert_gone, job_pids
from tensordict import TensorDict

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.slow,
    pytest.mark.usefixtures("no_mpich_segments_left"),
    mpirun.needs(),
]

JOB = Path(__file__).with_name("mpi_job.py")


def run_job(out: Path, *args: str, ranks: int = 3, timeout: float = 90, job: Path = JOB) -> tuple:
    """Run ``job`` (mpi_job.py by default; see ``mpirun.run``)."""
    return mpirun.run(job, out, *args, ranks=ranks, timeout=timeout)


def batches(out: Path) -> list[TensorDict]:
    return [TensorDict(b) for b in torch.load(out, weights_only=False)["batches"]]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[TensorDict]:
    """The same job with launcher='mp' in one plain process."""
    out = tmp_path_factory.mktemp("mp") / "mp.pt"
    code, output, _ = run_job(out, "--launcher", "mp", ranks=0)
    assert code == 0, output
    return batches(out)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_a_trainer_stops_ranks_that_collect_without_end_and_the_job_exits_0(tmp_path, backend):
    """``total_frames=-1``, ``sync=False``: the ranks are mid-batch when rank 0 shuts them down.
    Each says it is done, so rank 0 sees every rank end within the shutdown's deadline (over
    gloo, a rank's connection outlived its groups: every rank counted as one that "cannot be
    stopped", after 12 s, and the job was aborted)."""
    out = tmp_path / "out.pt"
    code, output, _ = run_job(out, "--backend", backend, "--sync", "0", "--mode", "stream")
    assert code == 0, output
    assert "cannot be stopped" not in output and "terminate called" not in output, output
    saved = torch.load(out, weights_only=False)
    assert len(saved["batches"]) == 20
    assert saved["shutdown_s"] < 10.0  # the pool's deadline: a rank seen ending within it
    assert_gone(job_pids(out))


@pytest.mark.timeout(120)
def test_a_trainer_that_never_shuts_down_still_ends_its_ranks_and_exits_0(tmp_path):
    """Rank 0 leaves its script with the collector open: its exit hooks stop the ranks before
    they finalise MPI (over gloo, a finalise that came first waited for ranks that still
    collected, which ended the job 30 s later as ranks that lost rank 0: exit 3)."""
    out = tmp_path / "out.pt"
    code, output, _ = run_job(out, "--backend", "gloo", "--sync", "0", "--mode", "leave")
    assert code == 0, output
    assert "has sent nothing" not in output, output
    assert len(batches(out)) == 20
    assert (tmp_path / "out.pt.finalized").read_text() == "True"
    assert_gone(job_pids(out))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_ranks_told_to_stop_mid_batch_finish_it_and_the_job_exits_0(tmp_path, backend):
    """A stop waits for the batch a rank is collecting (3 s here): rank 0 waits for it, and
    does not take a rank that is still finishing its batch for one that will not stop (a
    shutdown that closed the weight broadcast once every rank was told did, over mpi4py:
    "did not stop when asked", then MPI_Abort)."""
    out = tmp_path / "out.pt"
    code, output, _ = run_job(out, "--backend", backend, "--sync", "0", "--mode", "long-batch")
    assert code == 0, output
    assert "did not stop when asked" not in output, output
    assert torch.load(out, weights_only=False)["shutdown_s"] < 10.0
    assert_gone(job_pids(out))


@pytest.mark.timeout(240)
@pytest.mark.parametrize(  # under the other MPIs (suite 3), MPI's own transport alone
    "backend", ["gloo", pytest.param("mpi", marks=pytest.mark.anympi)]
)
def test_mpiexec_job_gives_the_mp_launchers_data(tmp_path, reference, backend):
    out = tmp_path / "out.pt"
    code, output, seconds = run_job(out, "--backend", backend)
    assert code == 0, output
    assert output.count("rank 0 done") == 1  # the other ranks never returned from the constructor
    got = batches(out)
    assert len(got) == len(reference) == 10
    for mine, theirs in zip(got, reference, strict=True):
        assert set(mine.keys(True, True)) == set(theirs.keys(True, True))
        assert (mine == theirs).all()
    assert torch.load(out, weights_only=False)["listening"] <= {"127.0.0.1"}  # one node
    assert len(job_pids(out)) == 3
    assert_gone(job_pids(out))
    assert seconds < 60, f"the job took {seconds:.1f} s"
    # rank 0 let its collector ranks go before its own teardown (finalize_before_teardown)
    assert (tmp_path / "out.pt.finalized").read_text() == "True"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["wide", "narrow"])
def test_batches_over_mpi_kept_without_a_copy_are_each_their_own(tmp_path, mode):
    """Over the mpi4py transport, a large batch is yielded in the buffer it arrived in and
    the next one arrives in another, a small one is copied out of it: batches kept as yielded
    each hold their own frames."""
    out = tmp_path / "out.pt"
    code, output, _ = run_job(out, "--backend", "mpi", "--sync", "0", "--mode", mode)
    assert code == 0, output
    got = batches(out)
    assert len(got) == 10
    assert_each_holds_its_own(got, 24)
    assert_gone(job_pids(out))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_collector_ranks_leave_without_cutting_rank_0_short(tmp_path, backend):
    """Ranks 1..N must tell hydra they finalised (MPICH does it in a C exit hook, which
    ``os._exit`` skips): hydra takes a rank that leaves without it for a dead one and SIGKILLs
    the rest of the job, here rank 0 in the second it takes after its ``MPI_Finalize``."""
    out = tmp_path / "out.pt"
    code, output, _ = run_job(out, "--backend", backend, "--mode", "linger")
    assert code == 0, output
    assert (tmp_path / "out.pt.exited").exists(), f"rank 0 was cut short:\n{output}"
    assert_gone(job_pids(out))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_weights_reach_every_rank_under_mpiexec(tmp_path, backend):
    out = tmp_path / "out.pt"
    code, output, seconds = run_job(out, "--backend", backend, "--mode", "weights")
    assert code == 0, output
    saved = torch.load(out, weights_only=False)
    assert saved["versions"] == [1, 1]
    actions = [b["action"][..., 1].float().mean().item() for b in batches(out)]
    assert actions[:2] == [0.0, 0.0] and set(actions[2:]) == {1.0}, actions
    # every frame's policy_version names the weights it was collected with (each rank says)
    versions = [b["policy_version"].float().mean().item() for b in batches(out)]
    assert versions == actions, (versions, actions)
    assert_gone(job_pids(out))
    assert seconds < 60


@pytest.mark.timeout(120)
def test_a_script_that_branches_calls_serve_which_returns_after_shutdown(tmp_path):
    out = tmp_path / "out.pt"
    code, output, _ = run_job(out, "--backend", "mpi", "--mode", "branch")
    assert code == 0, output
    assert len(batches(out)) == 10
    assert [(tmp_path / f"out.pt.served{r}").read_text() for r in (1, 2)] == ["returned"] * 2
    assert_gone(job_pids(out))


@pytest.mark.timeout(60)
def test_launcher_mpi_without_mpiexec_says_how_to_start_the_job():
    code = (
        "from hpccollect import DistributedDataCollector\n"
        "DistributedDataCollector('CartPole-v1', frames_per_batch=8, launcher='mpi')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 1
    assert "launcher='mpi' needs rank 0 and at least one collector rank" in proc.stderr
    assert "mpiexec -n N" in proc.stderr


@pytest.mark.timed
@pytest.mark.timeout(120)
def test_rank_0_does_not_burn_a_core_while_it_waits_on_mpi(tmp_path):
    out = tmp_path / "out.pt"
    code, output, _ = run_job(out, "--backend", "mpi", "--mode", "idle")
    assert code == 0, output
    busy = torch.load(out, weights_only=False)["busy"]
    # MPICH's blocking receive would keep rank 0 at 100 % of a core for the whole wait
    assert busy < 0.3, f"rank 0 used {busy:.0%} of a core while its ranks' envs slept"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("mode", "says"),
    [
        pytest.param("raise-env", "rank 2's env fails on purpose", marks=pytest.mark.anympi),
        ("raise-before", "rank 2 fails before the collector exists"),
    ],
)
def test_an_exception_on_one_rank_ends_the_whole_job(tmp_path, mode, says):
    out = tmp_path / "out.pt"
    code, output, _ = run_job(out, "--backend", "mpi", "--mode", mode, timeout=90)
    ended = time.time()
    assert code != 0
    assert says in output
    assert "MPI rank" in output and "aborting the whole job" in output
    raised = float((tmp_path / "out.pt.raised").read_text())
    assert ended - raised < 15, f"the job took {ended - raised:.1f} s to end after the raise"
    assert_gone(job_pids(out))


@pytest.mark.anympi
@pytest.mark.timeout(120)
def test_a_rank_killed_with_sigkill_ends_the_job_within_seconds(tmp_path):
    out = tmp_path / "out.pt"
    with mpirun.started(JOB, out, "--backend", "mpi", "--mode", "wait") as proc:
        os.kill(int((tmp_path / "out.pt.pid2").read_text()), signal.SIGKILL)
        killed = time.monotonic()
        proc.wait(timeout=30)
        assert time.monotonic() - killed < 10
        assert proc.returncode != 0
    assert_gone(job_pids(out))
    # hydra ends the other ranks with SIGKILL too: the segment was unlinked when MPI started,
    # which no_mpich_segments_left checks (waiting out those of jobs running beside this one)


def rank_0_holds(backend: str, ranks: int, tmp_path: Path) -> dict:
    """Rank 0's threads and pipes while it collects from ``ranks`` collector ranks."""
    job = Path(__file__).with_name("threads_job.py")
    code, output, _ = run_job(tmp_path / "x", backend, ranks=ranks + 1, timeout=150, job=job)
    lines = [x for x in output.splitlines() if x.startswith("THREADS ")]
    assert code == 0 and lines, output[-3000:]
    held = json.loads(lines[0][8:])
    assert held["ranks"] == ranks
    return held


@pytest.mark.xdist_group("rank-0-threads")  # one after the other: 17 processes each
@pytest.mark.timeout(360)
@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_rank_0_runs_the_same_threads_and_pipes_at_2_and_16_ranks(tmp_path, backend):
    """Nothing on rank 0 grows with the ranks but its links: the thread that waits reads every
    control link that woke its one ``poll`` (``rank_channel.py``), and one thread beats on
    every link (``control.Beats``), whatever the backend. A thread or a pipe per rank would
    show as 14 more at 16 ranks (64 are measured in docs/scale.md, ``threads_job.py``)."""
    few, many = (rank_0_holds(backend, n, tmp_path) for n in (2, 16))
    assert few["threads"] == many["threads"]
    assert not [t for t in many["threads"] if t.startswith("hpccollect-rank")]
    assert few["pipes"] == many["pipes"]


#: a script every rank of which builds the collector with an argument mistake
MISTAKE = """
import sys
import time
import gymnasium as gym
from hpccollect.distributed import DistributedDataCollector

start = time.monotonic()
try:
    DistributedDataCollector(
        [lambda: gym.make("CartPole-v1")], frames_per_batch=8, launcher="mpi",
        on_worker_failure="later",
    )
except Exception as err:
    print(f"REFUSED {type(err).__name__}: {err}", flush=True)
    print(f"AFTER {time.monotonic() - start:.3f} s", flush=True)
    sys.exit(3)
"""


@pytest.mark.timeout(120)
def test_an_argument_mistake_is_refused_by_every_rank_before_any_serves(tmp_path):
    """Arguments that need no launcher are checked before the ranks start serving rank 0: every
    rank refuses them alike, at once (a mistake found after would leave the collector ranks
    serving a rank 0 that is gone)."""
    script = tmp_path / "mistake.py"
    script.write_text(MISTAKE)
    code, output, _ = mpirun.run(script, tmp_path / "out", ranks=3, timeout=60)
    # mpiexec forwards each rank's output as it comes: two ranks' lines may share one line
    said = "REFUSED ArgumentValueError: on_worker_failure must be 'raise' or 'continue'"
    assert code != 0 and output.count(said) == 3, output
    assert output.count("REFUSED") == 3, output
    # refused as the constructor began: no rank waited for another (a rank serving a rank 0
    # that refused would wait start_timeout, 120 s; the job is killed at 60)
    after = [float(x) for x in re.findall(r"AFTER ([0-9.]+) s", output)]
    assert len(after) == 3 and max(after) < 10, output
