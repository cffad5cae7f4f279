"""``python -m hpccollect collect`` under a real ``mpiexec -n 3`` (the ``mpich`` package's hydra):
rank 0 gathers, ranks 1 and 2 collect; the dataset read back with ``inspect`` and
``open_dataset`` in both dataset modes; SIGTERM to mpiexec; mistakes end every rank at once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import mpirun
import numpy as np
import pytest
from conftest import alive, descendants

from hpccollect.app.cli import main
from hpccollect.storage import open_dataset

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.slow,
    pytest.mark.usefixtures("no_mpich_segments_left"),
    mpirun.needs(),
]

ENV = {**os.environ, "PATH": mpirun.BIN + os.pathsep + os.environ.get("PATH", "")}
TOTAL, BATCH = 2000, 200
SMALL = ["--env", "CartPole-v1", "--frames-per-batch", str(BATCH), "--total-frames", str(TOTAL)]


class Job:
    """``mpiexec -n 3 python -m hpccollect collect ...`` in ``cwd``, watched: every process it
    starts is remembered, so the test can check that none is left. A job its test did not wait
    for (an assertion failed first) is killed when the test ends (``_no_job_left``)."""

    started: list[Job] = []

    def __init__(self, cwd: Path, *args: str, ranks: int = 3, launcher: str = "mpiexec") -> None:
        self.log = cwd / "job.log"
        self.cwd = cwd
        cmd = [sys.executable, "-m", "hpccollect", "collect", *args]
        cmd = mpirun.command(ranks, *cmd, launcher=launcher)
        self.out = open(cwd / "job.stdout", "w")  # noqa: SIM115 - closed in wait()
        self.err = open(self.log, "w")  # noqa: SIM115
        self.start = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=ENV, stdout=self.out, stderr=self.err, start_new_session=True
        )
        self.seen: set[int] = set()
        Job.started.append(self)

    def watch(self, timeout: float, until: Callable[[], bool] = lambda: False) -> bool:
        """Follow the job until ``until()`` or its end; False if neither came in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.seen |= set(descendants(self.proc.pid))
            if until() or self.proc.poll() is not None:
                return True
            time.sleep(0.1)
        return False

    def wait(self, timeout: float) -> tuple[int, str, str, float]:
        """Exit code, stdout, stderr and seconds; the job is killed if it runs past ``timeout``."""
        try:
            if not self.watch(timeout):
                pytest.fail(f"the job did not end within {timeout} s:\n{self.stderr()}")
            self.proc.wait(5)
        finally:
            self.kill()
        seconds = time.monotonic() - self.start
        return self.proc.returncode, (self.cwd / "job.stdout").read_text(), self.stderr(), seconds

    def kill(self) -> None:
        """End the job if it still runs (its launcher's group, and every process seen)."""
        if self.proc.poll() is None:
            self.seen |= set(descendants(self.proc.pid))
            os.killpg(self.proc.pid, signal.SIGKILL)
            for pid in self.seen:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
            self.proc.wait()
        self.out.close()
        self.err.close()

    def stderr(self) -> str:
        return self.log.read_text()

    def assert_nothing_left(self, by: float | None = None) -> None:
        """Every process the job started has ended by ``by`` (a ``time.monotonic()``; 10 s from
        now if not given)."""
        assert len(self.seen) >= 3, f"the ranks were never seen: {self.seen}"
        deadline = time.monotonic() + 10 if by is None else by
        while any(alive(p) for p in self.seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in self.seen if alive(p)], "processes of the job are still running"


@pytest.fixture(autouse=True)
def _no_job_left() -> Iterator[None]:
    """Kill the jobs a test started and did not wait for (see ``Job``)."""
    yield
    while Job.started:
        Job.started.pop().kill()


def inspect_ok(path: Path, capsys) -> str:
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "integrity         ok" in text
    return text


def episodes(path: Path) -> tuple[int, np.ndarray]:
    """Committed frames, and the id of each episode in file order; checks that every episode's
    rows are contiguous (an id never comes back after another one)."""
    with open_dataset(path) as ds:
        assert ds.complete and not ds.check()
        ids = np.asarray(ds.episode_ids)
        starts = np.concatenate([[True], ids[1:] != ids[:-1]])
        order = ids[starts]
        assert len(order) == len(np.unique(order)) == ds.committed_episodes
        return len(ds), order


@pytest.mark.anympi
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("extra", "shards"),
    [
        (["--collector", "single", "--backend", "mpi"], False),
        (["--collector", "single", "--num-envs", "2", "--shards"], True),
    ],
    ids=["rank-0-writes-mpi-backend", "shards-gloo"],
)
def test_collect_under_mpiexec_keeps_every_episode_of_every_rank(tmp_path, capsys, extra, shards):
    job = Job(tmp_path, *SMALL, *extra, "--out", "run.h5")
    code, out, err, seconds = job.wait(180)
    assert code == 0, err
    assert "Traceback" not in err
    assert err.count("collecting 2000 frames") == 1  # rank 0 speaks, the others do not
    assert out.count("frames collected  2000") == 1
    frames, order = episodes(tmp_path / "run.h5")
    assert frames == TOTAL
    assert set(order % 2) == {0, 1}  # rank r numbers its episodes r - 1 modulo 2
    text = inspect_ok(tmp_path / "run.h5", capsys)
    assert f"frames            {TOTAL} committed" in text
    folder = tmp_path / "run.shards"
    if shards:
        assert "merged from       2 shards" in text
        per_rank = []
        for rank in (1, 2):
            shard = folder / f"rank-{rank:04d}.h5"
            with open_dataset(shard) as ds:
                assert int(ds.file.attrs["shard"]) == rank
            n, ids = episodes(shard)
            assert set(ids % 2) == {rank - 1}
            per_rank.append((n, ids))
        assert sum(n for n, _ in per_rank) == TOTAL
        assert sorted(order) == sorted(np.concatenate([ids for _, ids in per_rank]))
    else:
        assert not folder.exists()
    job.assert_nothing_left()
    assert seconds < 150, f"the job took {seconds:.1f} s"


def stopped_early(tmp_path: Path, total: int, *args: str, ranks: int = 3) -> int:
    """A CartPole run of ``total`` frames to run.h5, stopped by SIGTERM to mpiexec once it
    collects; the frames it kept (some)."""
    job = Job(
        tmp_path,
        *["--env", "CartPole-v1", "--collector", "single", "--frames-per-batch", "200"],
        *["--total-frames", str(total), "--out", "run.h5", *args],
        ranks=ranks,
    )
    collecting = re.compile(rf"\] [1-9]\d*/{total} frames")
    started = job.watch(150, lambda: bool(collecting.search(job.stderr())))
    assert started and job.proc.poll() is None, job.stderr()
    job.proc.send_signal(signal.SIGTERM)
    code, out, err, _ = job.wait(60)
    assert code == 0 and "stopped early by SIGTERM" in out, err
    before, _ = episodes(tmp_path / "run.h5")
    assert before > 0
    job.assert_nothing_left()
    return before


@pytest.mark.timeout(240)
def test_collect_gathered_writes_every_collecting_ranks_episodes(tmp_path, capsys):
    """--gather 3 under mpiexec -n 7: two groups, each of a gatherer and two collecting ranks
    (each a multi-sync collector of two worker processes); rank 0 takes one batch a group and
    round, and writes what the four ranks collected."""
    job = Job(tmp_path, *SMALL, "--gather", "3", "--out", "run.h5", ranks=7)
    code, out, err, _ = job.wait(180)
    assert code == 0, err
    assert "Traceback" not in err
    assert "with 4 collector rank(s) in 2 group(s), each sent on by its own first rank" in err
    assert out.count("frames collected  2000") == 1
    frames, _ = episodes(tmp_path / "run.h5")  # every episode whole, none twice
    assert frames == TOTAL
    text = inspect_ok(tmp_path / "run.h5", capsys)
    assert "gather=3" in text and "collecting_ranks=4" in text and "collector_ranks=6" in text
    job.assert_nothing_left()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--gather", "1"], "--gather must be node or a number of collector ranks per group"),
        (["--gather", "two"], "argument --gather: must be node or a number"),
        (["--gather", "2", "--shards"], "--gather: --shards already sends rank 0 no batches"),
        (["--gather", "node", "--on-rank-failure", "continue"], "--gather: --on-rank-failure"),
        (["--gather", "node"], "--gather: only for a distributed run"),
    ],
)
def test_gather_mistakes_are_refused_in_one_line(tmp_path, capsys, args, says):
    assert main(["collect", *args, "--out", str(tmp_path / "x.h5")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not list(tmp_path.iterdir())


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("ranks", "args", "says"),
    [
        (  # 3 collecting ranks share each batch
            5,
            ["--gather", "4", "--frames-per-batch", "200"],
            "--frames-per-batch 200 cannot be split over a group: with --gather 4 each batch is "
            "one group's round, shared by its 3 collecting rank(s) x 1 env(s); pass a multiple "
            "of 3 (198 or 201).",
        ),
        (  # collector ranks 1 and 2, then 3 alone
            4,
            ["--gather", "2"],
            "--gather 2 leaves collector rank 3 alone in its group",
        ),
    ],
    ids=["frames", "alone"],
)
def test_gather_mistakes_under_mpiexec_end_every_rank_with_one_line(tmp_path, ranks, args, says):
    job = Job(tmp_path, "--collector", "single", "--total-frames", "2000", *args, ranks=ranks)
    code, out, err, _ = job.wait(100)
    assert code == 2, err
    lines = [line for line in mpirun.own_lines(err) if not line.startswith("collecting ")]
    assert len(lines) == 1 and lines[0].startswith("hpccollect: error: " + says), err
    assert "gather=" not in lines[0] and out == ""
    job.assert_nothing_left()


@pytest.mark.timeout(300)
def test_a_gathered_run_resumes_gathered(tmp_path, capsys):
    """--gather is how the new allocation runs, as --launcher is: given again on --resume."""
    total = 16_000  # the first run is stopped at its first progress line
    before = stopped_early(tmp_path, total, "--gather", "2", ranks=5)
    assert before < total, before

    again = Job(tmp_path, "--resume", "run.h5", "--gather", "2", ranks=5)
    code, out, err, _ = again.wait(200)
    assert code == 0, err
    assert "with 2 collector rank(s) in 2 group(s)" in err
    assert f"holds {total} of {total} frames" in out
    frames, _ = episodes(tmp_path / "run.h5")  # ids unique, episodes contiguous
    assert frames == total
    inspect_ok(tmp_path / "run.h5", capsys)
    again.assert_nothing_left()


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "shards",  # under the other MPIs (tests/all.sh's suite 3), the shards alone
    [
        pytest.param(False, id="rank-0-writes"),
        pytest.param(True, id="shards", marks=pytest.mark.anympi),
    ],
)
@pytest.mark.parametrize(
    ("launcher", "stop"), mpirun.STOPS, ids=["-".join(s) for s in mpirun.STOPS]
)
def test_a_stop_sent_to_the_launcher_keeps_the_committed_episodes(
    tmp_path, capsys, shards, launcher, stop
):
    """What a scheduler or Ctrl-C does to a job: the run stops after its batch, every file is
    finished, the job exits 0 and nothing is left (an Intel MPI ``mpirun`` script dies of the
    SIGTERM itself: its job, orphaned, notices and stops the same way)."""
    args = ["--env", "CartPole-v1", "--collector", "single", "--frames-per-batch", "100"]
    args += ["--total-frames", "100000000", "--out", "run.h5"] + (["--shards"] if shards else [])
    job = Job(tmp_path, *args, launcher=launcher)
    collecting = re.compile(r"\] [1-9]\d*/100000000 frames")
    started = job.watch(150, lambda: bool(collecting.search(job.stderr())))
    assert started and job.proc.poll() is None, job.stderr()
    job.proc.send_signal(getattr(signal, stop))
    stopped = time.monotonic()
    code, *_ = job.wait(60)
    # an orphaned job (the mpirun script gone) ends by itself, within the bar a job that had the
    # stop passed on meets (in a loaded CI run it took more than 10 s after the script's end)
    job.assert_nothing_left(by=stopped + 30)
    out = (tmp_path / "job.stdout").read_text()
    assert code == (-signal.SIGTERM if launcher == "mpirun" and mpirun.FLAVOUR == "impi" else 0)
    assert time.monotonic() - stopped < 30
    assert f"stopped early by {stop}" in out, job.stderr()
    frames, order = episodes(tmp_path / "run.h5")
    assert frames >= 100 and len(order)
    inspect_ok(tmp_path / "run.h5", capsys)
    if shards:
        for rank in (1, 2):  # every rank closed its shard: no unfinished file
            assert (tmp_path / "run.shards" / f"rank-{rank:04d}.h5").exists()
        assert not list((tmp_path / "run.shards").glob("*.partial"))


@pytest.mark.timeout(180)
def test_a_stop_before_the_first_report_ends_the_shards_job_at_once_with_its_data(tmp_path, capsys):
    """With --shards rank 0 holds no batch: SIGTERM ends its wait for the next report at once
    (here 60 s away, the first), and the merged view over what the ranks wrote is still made."""
    args = ["--env", "CartPole-v1", "--collector", "single", "--frames-per-batch", "100"]
    args += ["--total-frames", "100000000", "--out", "run.h5", "--shards"]
    job = Job(tmp_path, *args, "--report-interval", "60")
    shards = tmp_path / "run.shards"
    opened = job.watch(150, lambda: len(list(shards.glob("*.partial"))) == 2)
    assert opened and job.proc.poll() is None, job.stderr()
    time.sleep(3)  # the ranks commit their first episodes
    job.proc.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    code, out, err, _ = job.wait(90)
    assert code == 0, err
    assert time.monotonic() - stopped < 40, "rank 0 waited for the report"
    assert "stopped early by SIGTERM" in out
    frames, order = episodes(tmp_path / "run.h5")
    assert frames >= 100 and len(order)
    assert sorted(p.name for p in shards.iterdir()) == ["rank-0001.h5", "rank-0002.h5"]
    inspect_ok(tmp_path / "run.h5", capsys)
    job.assert_nothing_left()


#: a CartPole whose steps take 20 ms: a rank takes a second or more for its part of a batch
SLOW_ENV = (
    "import time\n"
    "import gymnasium as gym\n"
    "from gymnasium.envs.classic_control.cartpole import CartPoleEnv\n"
    "class Slow(CartPoleEnv):\n"
    "    def step(self, action):\n"
    "        time.sleep(0.02)\n"
    "        return super().step(action)\n"
    "gym.register('Slow-v0', entry_point=Slow, max_episode_steps=500)\n"
)

if mpirun.FLAVOUR == "openmpi":

    @pytest.mark.anympi
    @pytest.mark.alone  # the stop must fit in Open MPI's half second: no test beside it
    @pytest.mark.timeout(240)
    @pytest.mark.parametrize(
        ("shards", "env"),
        [(s, e) for s in (False, True) for e in ("CartPole-v1", "slowenv:Slow-v0")],
        ids=[f"{w}{b}" for w in ("rank-0-writes", "shards") for b in ("", "-batches-of-a-second")],
    )
    def test_sigterm_to_open_mpis_mpirun_still_finishes_every_file(tmp_path, capsys, shards, env):
        """Open MPI's mpirun passes SIGTERM on a quarter of a second late, kills every rank a
        quarter of a second after that and exits 1, whatever the ranks do (SIGUSR1 stops a job
        cleanly, above). No rank waits for a batch under way, however long the ranks take
        (batches of a second here): rank 0 finishes the file with what was committed, or each
        rank its shard (the signal ends its batch) and rank 0 the merged view, before the
        kill."""
        (tmp_path / "slowenv.py").write_text(SLOW_ENV)  # each rank imports it from its cwd
        args = ["--env", env, "--collector", "single", "--frames-per-batch", "100"]
        args += ["--total-frames", "100000000", "--out", "run.h5"]
        job = Job(tmp_path, *args, *(["--shards"] if shards else []))
        collecting = re.compile(r"\] [1-9]\d*/100000000 frames")
        assert job.watch(150, lambda: bool(collecting.search(job.stderr()))), job.stderr()
        job.proc.send_signal(signal.SIGTERM)
        code, *_ = job.wait(30)
        assert code == 1, job.stderr()[-3000:]
        job.assert_nothing_left()
        assert sorted(p.name for p in tmp_path.glob("run.*")) == (
            ["run.h5", "run.shards"] if shards else ["run.h5"]
        )
        if shards:
            names = sorted(p.name for p in (tmp_path / "run.shards").iterdir())
            assert names == ["rank-0001.h5", "rank-0002.h5"]
        frames, order = episodes(tmp_path / "run.h5")
        assert frames > 0 and len(order)
        inspect_ok(tmp_path / "run.h5", capsys)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("args", "says"),
    [
        pytest.param(
            ["--frames-per-batch", "7"],
            "hpccollect: error: --frames-per-batch 7 cannot be split",
            id="every-rank",
        ),
        # found on rank 0 only, after MPI started: the others must not wait for it forever
        pytest.param(
            ["--collector", "single", "--out", "taken.h5"],
            "hpccollect: error: taken.h5 already",
            id="rank-0-only",
            marks=pytest.mark.anympi,
        ),
    ],
)
def test_a_mistake_under_mpiexec_ends_every_rank_with_one_line(tmp_path, args, says):
    (tmp_path / "taken.h5").write_bytes(b"")
    job = Job(tmp_path, *args)
    code, out, err, seconds = job.wait(120)
    assert code == 2, err
    assert [line for line in mpirun.own_lines(err) if not line.startswith("collecting ")] == [
        next(line for line in err.splitlines() if line.startswith(says))
    ], err
    assert out == ""
    job.assert_nothing_left()
    assert seconds < 60, f"the job took {seconds:.1f} s to end"


@pytest.mark.timeout(120)
def test_distributed_options_without_a_launcher_are_refused(tmp_path, capsys):
    assert main(["collect", "--shards", "--backend", "mpi", "--out", "x.h5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and err[0].startswith("hpccollect: error: --shards, --backend: only")
    cmd = [sys.executable, "-m", "hpccollect", "collect", "--launcher", "mpi", "--out", "x.h5"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "hpccollect: error: --launcher mpi needs rank 0 and at least one collector rank: start "
        "the job with mpiexec -n N or srun -n N (N >= 2), or drop --launcher mpi to collect in "
        "one process."
    ]
    assert not list(tmp_path.iterdir())


@pytest.mark.timeout(360)
def test_a_run_stopped_under_mpiexec_resumes_with_new_shards(tmp_path, capsys):
    total = 40_000
    # reports (and so the progress line) every 0.2 s: the job is stopped near its start
    before = stopped_early(tmp_path, total, "--shards", "--report-interval", "0.2")
    assert before < total / 2, before

    again = Job(tmp_path, "--resume", "run.h5", "--shards")  # the rest from the record
    code, out, err, _ = again.wait(200)
    assert code == 0, err
    assert f"{before} of {total} frames on disk, attempt 1 collects {total - before}" in err
    frames, _ = episodes(tmp_path / "run.h5")  # ids unique, episodes contiguous
    assert frames == total
    folder = tmp_path / "run.shards"
    names = sorted(p.name for p in folder.iterdir())
    assert names == [f"{a}rank-000{r}.h5" for a in ("attempt-1.", "") for r in (1, 2)]
    seeds = set()
    for name in names:
        with open_dataset(folder / name) as ds:
            seeds.add(int(ds.file.attrs["seed"]))
    assert len(seeds) == 2  # the attempt's seed is not the first one's
    assert f"holds {total} of {total} frames" in out
    inspect_ok(tmp_path / "run.h5", capsys)
    again.assert_nothing_left()


def rank_pid(job: Job, rank: int) -> int | None:
    """The pid of the job's MPI rank ``rank`` (from its environment), once it runs."""
    for pid in descendants(job.proc.pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            f"PMI_RANK={rank}".encode() in environ
            and b"hpccollect" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ):
            return pid
    return None


@pytest.mark.timed
@pytest.mark.timeout(240)
def test_on_rank_failure_continue_finishes_the_run_without_a_silent_rank(tmp_path, capsys):
    """A collector rank stopped mid-run (as a lost node looks): the run says so once, finishes
    with the other rank, exits 0 with every frame asked for; the rank, let go on later, ends."""
    total = 100_000
    args = ["--env", "CartPole-v1", "--collector", "single", "--frames-per-batch", "500"]
    args += ["--total-frames", str(total), "--out", "x.h5", "--quiet"]
    job = Job(tmp_path, *args, "--on-rank-failure", "continue", "--liveness-timeout", "3")
    assert job.watch(120, lambda: (tmp_path / "x.h5.partial").exists()), job.stderr()
    time.sleep(1.0)
    pid = rank_pid(job, 2)
    assert pid is not None and job.proc.poll() is None, job.stderr()
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        assert job.watch(30, lambda: "is lost" in job.stderr()), job.stderr()
        noticed = time.monotonic() - stopped
    finally:
        os.kill(pid, signal.SIGCONT)
    code, _, err, _ = job.wait(180)
    assert code == 0, err
    assert noticed <= 5.0, f"noticed {noticed:.1f} s after the rank stopped"
    warned = [line for line in err.splitlines() if "is lost" in line]
    assert len(warned) == 1, err
    assert warned[0].startswith("hpccollect: warning: collector rank 2 ")
    assert "not even a heartbeat" in warned[0]
    frames, _ = episodes(tmp_path / "x.h5")
    assert frames == total
    job.assert_nothing_left()


@pytest.mark.alone
@pytest.mark.timeout(300)
def test_64_collector_ranks_with_shards_exit_0(tmp_path, capsys):
    """``mpiexec -n 65 ... collect --shards``: 64 collector ranks each keep their shard, the
    run merges them and exits 0, leaving nothing running.

    Also the guard of a run that completes exiting 0 at any rank count (it once ended "killed
    by signal 9" in 2 of 4 runs at 9 to 33 ranks, the dataset complete): with
    ``exit_finalized``'s C ``exit`` put back to ``os._exit``, each of 4 runs at 33 ranks ended
    with status 9 (at 9 ranks, none of 4), so one run at 65 catches it."""
    args = ["--collector", "single", "--frames-per-batch", "100", "--total-frames", "12800"]
    job = Job(tmp_path, *args, "--shards", "--out", "x.h5", "--quiet", ranks=65)
    code, _, err, _ = job.wait(250)
    assert code == 0, f"the run exited {code}:\n{err[-3000:]}"
    assert "BAD TERMINATION" not in err
    frames, _ = episodes(tmp_path / "x.h5")
    assert frames == 12800
    shards = sorted(p.name for p in (tmp_path / "x.shards").glob("rank-*.h5"))
    assert shards == [f"rank-{rank:04d}.h5" for rank in range(1, 65)]
    assert "merged from       64 shards" in inspect_ok(tmp_path / "x.h5", capsys)
    job.assert_nothing_left()
