"""Two simulated nodes (slurm/nodes.sh: network namespaces on a bridge, each with its own host
name, address, /etc/hosts and a resolver that fails at once), reached by a real ``mpiexec``
through slurm/node-ssh: a job over both nodes needs no address flag, loopback is refused, a
node that loses its link is noticed within the liveness timeout, and a rank 0 cut off ends the
collector ranks. Nothing of the nodes is left afterwards."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import mpirun
import pytest
import torch
from conftest import alive
from tensordict import TensorDict

from hpccollect.storage import open_dataset

ROOT = Path(__file__).resolve().parents[2]
NODES = ROOT / "slurm" / "nodes.sh"
SSH = ROOT / "slurm" / "node-ssh"
LIVENESS_JOB = ROOT / "tests" / "distributed" / "liveness_job.py"
GATHER_JOB = ROOT / "tests" / "distributed" / "gather_job.py"
BIN = mpirun.BIN
MPIEXEC = mpirun.MPIEXEC  # MPICH's hydra: its ssh launcher reaches the simulated nodes
# UCX would carry MPI between the simulated nodes through shared memory (one machine, one /dev/shm):
# TCP over each node's own link, as between real nodes
ENV = {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", ""), "UCX_TLS": "tcp,self"}

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.slow,
    pytest.mark.nodes,
    pytest.mark.usefixtures("no_mpich_segments_left"),
]
if (os.geteuid() != 0 or MPIEXEC is None or shutil.which("ip") is None) and not os.environ.get(
    "CI"
):
    pytestmark.append(pytest.mark.skip(reason="needs root, ip and mpiexec (simulated nodes)"))


def nodes_sh(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(NODES), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def node_pids(node: str) -> list[int]:
    out = subprocess.run(
        ["ip", "netns", "pids", f"hpcc-{node}"], capture_output=True, text=True, check=False
    ).stdout
    return [int(p) for p in out.split()]


def python_pids(node: str) -> list[int]:
    """The Python processes on ``node`` (the ranks; hydra's proxy is not one)."""
    found = []
    for pid in node_pids(node):
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if "python" in os.path.basename(exe) and alive(pid):
            found.append(pid)
    return found


@pytest.fixture(scope="module")
def nodes():
    """node1 and node2, up for this module; checked to leave nothing behind."""
    down = nodes_sh("down")
    assert down.returncode == 0, down.stderr
    up = nodes_sh("up", "2")
    assert up.returncode == 0, up.stderr
    try:
        yield ["node1", "node2"]
    finally:
        down = nodes_sh("down")
    assert down.returncode == 0, down.stderr
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "hpcc-" not in netns
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "hpcc0" not in links and "hpcc-v" not in links
    assert "hpccollect simulated nodes" not in Path("/etc/hosts").read_text()
    assert not Path("/run/hpccollect-nodes").exists()


class Job:
    """``mpiexec`` over the simulated nodes, in a session of its own."""

    def __init__(self, cwd: Path, hosts: str, n: int, *cmd: str) -> None:
        launch = [MPIEXEC, "-launcher", "ssh", "-launcher-exec", str(SSH), "-iface", "hpcc0"]
        self.proc = subprocess.Popen(
            [*launch, "-hosts", hosts, "-n", str(n), *cmd],
            cwd=cwd,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def wait(self, timeout: float) -> tuple[int, str, str]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        finally:
            self.end()
        return self.proc.returncode, out, err

    def end(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def assert_nodes_idle(nodes: list[str], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while any(node_pids(n) for n in nodes) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = {n: node_pids(n) for n in nodes if node_pids(n)}
    assert not left, f"processes left on the nodes: {left}"


def link(node: str, state: str) -> None:
    subprocess.run(["ip", "-n", f"hpcc-{node}", "link", "set", "eth0", state], check=True)


def assert_rank_2_reported_and_job_ended(
    job: Job, out: Path, since: float, failure: str, nodes: list[str]
) -> None:
    """liveness_job.py's result: rank 2 on node2 reported silent within the timeout (3 s) + 1
    of ``since``, let go with ``failure="continue"``; the job exits 0, nothing left."""
    result_path = out.with_suffix(".result")
    code, _, err = job.wait(90)
    assert result_path.exists(), f"no result (exit {code}):\n{err}"
    result = json.loads(result_path.read_text())
    took = result["at"] - since
    assert took <= 3.0 + 1.0, f"reported {took:.1f} s after rank 2 went silent"
    text = result.get("error") or err
    assert "collector rank 2" in text and "node2" in text and "not even a heartbeat" in text
    if failure == "continue":
        assert result["lost"] == [2] and result["batches_after"] == 10
    assert code == 0, err
    assert_nodes_idle(nodes)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_a_job_over_two_nodes_needs_no_address_flag(nodes, tmp_path, backend):
    total = 2000
    cmd = [sys.executable, "-m", "hpccollect", "collect", "--collector", "single"]
    cmd += ["--backend", backend, "--total-frames", str(total), "--frames-per-batch", "200"]
    job = Job(tmp_path, "node1,node2", 3, *cmd, "--out", "x.h5", "--quiet")
    code, out, err = job.wait(150)
    assert code == 0, err
    assert "rank 0 on node1" in out + err
    with open_dataset(tmp_path / "x.h5") as ds:
        assert ds.complete and len(ds) == total
    assert_nodes_idle(nodes)


@pytest.mark.timeout(180)
def test_gathered_per_node_with_ranks_placed_round_robin_rows_come_in_rank_order(nodes, tmp_path):
    """``MPILauncher(gather="node")`` over two nodes, hydra placing ranks round-robin (0, 2,
    4, 6 on node1; 1, 3, 5 on node2): gatherers 2 and 1 collect from [4, 6] and [3, 5], and
    rank 0's rows still come in rank order, each rank running its own env."""
    out = tmp_path / "out.pt"
    cmd = [sys.executable, str(GATHER_JOB), str(out), "--gather", "node", "--backend", "mpi"]
    code, _, err = Job(tmp_path, "node1,node2", 7, *cmd).wait(150)
    assert code == 0, err
    saved = torch.load(out, weights_only=False)
    assert saved["collecting"] == [3, 4, 5, 6]
    for raw in saved["batches"]:
        batch = TensorDict(raw, batch_size=[4, 16])
        assert [int(row.max()) for row in batch["next", "observation"]] == [3, 4, 5, 6]
    assert_nodes_idle(nodes)


@pytest.mark.timeout(120)
def test_rank_0_on_loopback_is_refused_when_ranks_run_on_another_node(nodes, tmp_path):
    cmd = [sys.executable, "-m", "hpccollect", "collect", "--collector", "single"]
    job = Job(tmp_path, "node1,node2", 3, *cmd, "--master-addr", "localhost", "--out", "x.h5")
    code, _, err = job.wait(90)
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("hpccollect: error:")]
    assert len(lines) == 1, err
    assert "loopback on node1" in lines[0] and "node2 cannot reach" in lines[0]
    assert "--master-addr" in lines[0] and "--interface" in lines[0]
    assert_nodes_idle(nodes)


@pytest.mark.timed
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("backend", "failure"), [("gloo", "raise"), ("mpi", "continue")])
def test_a_node_that_loses_its_link_is_noticed_within_the_timeout(
    nodes, tmp_path, backend, failure
):
    """Rank 0 and rank 1 on node1, rank 2 on node2; node2's link goes down mid-run."""
    out = tmp_path / "out"
    cmd = [sys.executable, str(LIVENESS_JOB), str(out), "--launcher", "mpi", "--hold"]
    cmd += ["--backend", backend, "--failure", failure]
    job = Job(tmp_path, "node1:2,node2:1", 3, *cmd)
    try:
        deadline = time.monotonic() + 90
        while not out.with_suffix(".ranks").exists():
            assert job.proc.poll() is None and time.monotonic() < deadline, job.proc.stderr.read()
            time.sleep(0.05)
        cut = time.time()
        link("node2", "down")
        while not out.with_suffix(".detected").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        result_path = out.with_suffix(".result")
        out.with_suffix(".resume").write_text("")
        while not result_path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        link("node2", "up")  # the lost node comes back: the job must still end, and end it
    assert_rank_2_reported_and_job_ended(job, out, cut, failure, nodes)


@pytest.mark.timed
@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["gloo", "mpi"])
def test_rank_0_cut_off_ends_every_collector_rank(nodes, tmp_path, backend):
    """Rank 0 alone on node1, ranks 1 and 2 on node2; node1's link goes down."""
    out = tmp_path / "out"
    cmd = [sys.executable, str(LIVENESS_JOB), str(out), "--launcher", "mpi", "--limit", "120"]
    job = Job(tmp_path, "node1:1,node2:2", 3, *cmd, "--backend", backend)
    try:
        deadline = time.monotonic() + 90
        while not out.with_suffix(".ranks").exists():
            assert job.proc.poll() is None and time.monotonic() < deadline, job.proc.stderr.read()
            time.sleep(0.05)
        ranks = python_pids("node2")
        assert len(ranks) == 2
        link("node1", "down")
        cut = time.monotonic()
        while any(alive(p) for p in ranks) and time.monotonic() - cut < 20:
            time.sleep(0.05)
        ended = time.monotonic() - cut
        assert not [p for p in ranks if alive(p)], "collector ranks outlived rank 0's node"
        assert ended <= 3.0 + 2.0, f"the collector ranks took {ended:.1f} s to end"
    finally:
        link("node1", "up")
    code, _, err = job.wait(60)
    assert code != 0  # the job could not finish: rank 0 was lost
    assert err.count("has sent nothing, not even a heartbeat") >= 1, err
    assert_nodes_idle(nodes)


@pytest.mark.timed
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("backend", "failure"), [("gloo", "continue"), ("mpi", "raise")])
def test_a_rank_on_the_other_node_stopped_and_continued_later(nodes, tmp_path, backend, failure):
    """Rank 2, alone on node2, is stopped with SIGSTOP mid-run: reported within the timeout;
    it is continued once rank 0 has noticed, and the job still ends, exit 0, nothing left."""
    out = tmp_path / "out"
    cmd = [sys.executable, str(LIVENESS_JOB), str(out), "--launcher", "mpi", "--hold"]
    cmd += ["--backend", backend, "--failure", failure]
    job = Job(tmp_path, "node1:2,node2:1", 3, *cmd)
    rank = None
    try:
        deadline = time.monotonic() + 90
        while not out.with_suffix(".ranks").exists():
            assert job.proc.poll() is None and time.monotonic() < deadline, job.proc.stderr.read()
            time.sleep(0.05)
        (rank,) = python_pids("node2")
        os.kill(rank, signal.SIGSTOP)
        stopped = time.time()
        while not out.with_suffix(".detected").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if rank is not None:
            os.kill(rank, signal.SIGCONT)  # it comes back: the job must still end, and end it
    out.with_suffix(".resume").write_text("")
    assert_rank_2_reported_and_job_ended(job, out, stopped, failure, nodes)
