"""Rendezvous: every launcher's variables, their priorities, bad values, SLURM host lists, network
interfaces; and, under the real ``mpiexec``, detection and ``share_from_root`` across ranks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import mpirun
import pytest
from conftest import alive

from hpccollect.errors import ArgumentTypeError, ArgumentValueError
from hpccollect.launchers.rendezvous import (
    Rendezvous,
    detect,
    expand_nodelist,
    launched_ranks,
)

TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.1.2.3",
    "MASTER_PORT": "29500",
}
MPICH = {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3"}
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_SIZE": "6",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}
SLURM_STEP = {  # what an srun step of 4 tasks on 2 nodes sees (inside an sbatch allocation)
    "SLURM_JOB_ID": "77",
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_JOB_NODELIST": "192.0.2.7,192.0.2.8",
    "SLURM_STEP_NODELIST": "192.0.2.7,192.0.2.8",
}
SBATCH_SCRIPT = {  # the batch script itself: one process, although NTASKS says 8
    "SLURM_JOB_ID": "77",
    "SLURM_PROCID": "0",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "0",
    "SLURM_NNODES": "2",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_NODELIST": "node[01-02]",
}


def test_no_launcher_is_a_single_process():
    rv = detect(environ={})
    assert rv == Rendezvous(0, 1, 0, 1, "127.0.0.1", None, "single")
    assert rv.is_master
    assert launched_ranks({}) == 1


def test_torchrun_variables():
    rv = detect(environ=TORCHRUN)
    assert rv == Rendezvous(3, 8, 1, 2, "10.1.2.3", 29500, "torchrun")
    assert not rv.is_master
    assert launched_ranks(TORCHRUN) == 8


def test_mpich_hydra_variables_all_on_this_node_bind_loopback():
    rv = detect(environ=MPICH)
    assert rv == Rendezvous(2, 3, 2, 3, "127.0.0.1", None, "mpich")
    assert detect(environ={**MPICH, "TCP_PORT": "4000"}).port == 4000
    assert launched_ranks(MPICH) == 3


def test_openmpi_variables():
    rv = detect(environ=OPENMPI, master_addr="10.0.0.9")
    assert rv == Rendezvous(5, 6, 1, 2, "10.0.0.9", None, "openmpi")
    assert launched_ranks(OPENMPI) == 6


def test_srun_step_rank_0_listens_on_the_first_node():
    rv = detect(environ=SLURM_STEP)
    assert rv == Rendezvous(3, 4, 1, None, "192.0.2.7", None, "slurm")
    assert launched_ranks(SLURM_STEP) == 4


def test_srun_step_on_one_node_binds_loopback():
    env = {**SLURM_STEP, "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NODELIST": "192.0.2.7"}
    assert detect(environ=env).master_addr == "127.0.0.1"


def test_sbatch_script_alone_is_not_a_launch():
    assert detect(environ=SBATCH_SCRIPT) == Rendezvous(0, 1, 0, 1, "127.0.0.1", None, "single")
    assert launched_ranks(SBATCH_SCRIPT) == 1


def test_first_node_resolving_to_loopback_is_refused_on_several_nodes():
    env = {**SLURM_STEP, "SLURM_STEP_NODELIST": "localhost,192.0.2.8"}
    with pytest.raises(ArgumentValueError, match=r"SLURM_STEP_NODELIST.*loopback.*master_addr"):
        detect(environ=env)


def test_several_nodes_and_no_address_is_refused():
    env = {**MPICH, "PMI_SIZE": "4", "MPI_LOCALNRANKS": "3"}
    with pytest.raises(ArgumentValueError, match=r"rank 2 of 4.*master_addr.*MASTER_ADDR"):
        detect(environ=env)
    assert detect(environ={**env, "MASTER_ADDR": "node01"}).master_addr == "node01"


def test_explicit_arguments():
    rv = detect(rank=1, world_size=2, master_addr="10.0.0.5", port=1234, environ={})
    assert rv == Rendezvous(1, 2, 0, None, "10.0.0.5", 1234, "explicit")
    assert detect(rank=1, world_size=2, local_rank=1, master_addr="h", environ={}).local_rank == 1


@pytest.mark.parametrize(
    ("environ", "kwargs", "expected"),
    [
        # every field from the first set that has it
        ({**TORCHRUN, **MPICH}, {}, (3, 8, 1, 2, "torchrun")),
        ({**MPICH, **OPENMPI}, {}, (2, 3, 2, 3, "mpich")),
        ({**OPENMPI, **SLURM_STEP}, {}, (5, 6, 1, 2, "openmpi")),
        ({**TORCHRUN, **SLURM_STEP}, {"rank": 0, "local_rank": 0}, (0, 8, 0, 2, "explicit")),
        # and each field on its own: the rank explicit, the rest from the variables
        ({**MPICH}, {"rank": 0}, (0, 3, 2, 3, "explicit")),
        ({"PMI_RANK": "1", "PMI_SIZE": "6", **OPENMPI}, {}, (1, 6, 1, 2, "mpich")),
        ({"SLURM_LOCALID": "0", **SLURM_STEP, **OPENMPI}, {}, (5, 6, 1, 2, "openmpi")),
        ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "LOCAL_RANK": "0"}, {}, None),
    ],
)
def test_priorities(environ, kwargs, expected):
    rv = detect(environ=environ, master_addr="10.0.0.1", **kwargs)
    if expected is None:  # LOCAL_RANK from torchrun, the rest from the srun step
        expected = (0, 2, 0, None, "slurm")
    assert (rv.rank, rv.world_size, rv.local_rank, rv.local_size, rv.source) == expected


def test_master_addr_and_port_priorities():
    env = {**MPICH, "MASTER_ADDR": "10.9.9.9", "MASTER_PORT": "5000", "TCP_PORT": "6000"}
    assert detect(environ=env, master_addr="10.0.0.1", interface="lo").master_addr == "10.0.0.1"
    assert detect(environ=env, interface="lo").master_addr == "127.0.0.1"
    assert detect(environ=env).master_addr == "10.9.9.9"
    assert detect(environ=MPICH).master_addr == "127.0.0.1"
    assert detect(environ=env, port=7000).port == 7000
    assert detect(environ=env).port == 5000
    assert detect(environ={**MPICH, "TCP_PORT": "6000"}).port == 6000
    assert detect(environ=MPICH).port is None


@pytest.mark.parametrize(
    ("environ", "kwargs", "match"),
    [
        ({**TORCHRUN, "RANK": "abc"}, {}, r"RANK='abc' is not an integer"),
        ({**MPICH, "PMI_RANK": "3"}, {}, r"PMI_RANK=3 is not below PMI_SIZE=3"),
        ({**MPICH, "PMI_RANK": "-1"}, {}, r"PMI_RANK=-1 must be at least 0"),
        ({**TORCHRUN, "WORLD_SIZE": "0"}, {}, r"WORLD_SIZE=0 must be at least 1"),
        ({**OPENMPI, "OMPI_COMM_WORLD_LOCAL_RANK": "2"}, {}, r"LOCAL_RANK=2 is not below"),
        ({}, {"rank": 4, "world_size": 4}, r"rank=4 is not below world_size=4"),
        ({}, {"rank": 1}, r"rank=1 is set but no world size"),
        ({"WORLD_SIZE": "4"}, {}, r"WORLD_SIZE=4 is set but no rank"),
        ({**MPICH, "MASTER_PORT": "70000"}, {}, r"MASTER_PORT=70000 is not a TCP port"),
        ({**MPICH, "TCP_PORT": "http"}, {}, r"TCP_PORT='http' is not an integer"),
        ({}, {"port": -1}, r"port=-1 is not a TCP port"),
        ({**MPICH, "MASTER_ADDR": "0.0.0.0"}, {}, r"MASTER_ADDR='0.0.0.0'.*wildcard"),
        ({}, {"master_addr": "::"}, r"master_addr='::'.*wildcard"),
        ({**SLURM_STEP, "SLURM_STEP_NODELIST": "n[01-"}, {}, r"SLURM_STEP_NODELIST='n\[01-'"),
        ({**SLURM_STEP, "SLURM_STEP_NUM_TASKS": "four"}, {}, r"SLURM_STEP_NUM_TASKS='four'"),
    ],
)
def test_bad_values_name_the_variable_and_value(environ, kwargs, match):
    with pytest.raises(ArgumentValueError, match=match):
        detect(environ=environ, **kwargs)


def test_bad_types():
    with pytest.raises(ArgumentTypeError, match="rank must be an int"):
        detect(rank="0", world_size=1, environ={})
    with pytest.raises(ArgumentTypeError, match="port must be an int"):
        detect(port=29500.0, environ={})
    with pytest.raises(ArgumentValueError, match=r"WORLD_SIZE='x'"):
        launched_ranks({"WORLD_SIZE": "x"})


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node01", ["node01"]),
        ("node[01-04,07],gpu3", ["node01", "node02", "node03", "node04", "node07", "gpu3"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),  # no padding: numbers grow in width
        ("c[098-101]", ["c098", "c099", "c100", "c101"]),  # padding to the lower bound's width
        ("a1,b[2,5],cpu-[0-1]", ["a1", "b2", "b5", "cpu-0", "cpu-1"]),
        ("r[1-2]-n[08-09]", ["r1-n08", "r1-n09", "r2-n08", "r2-n09"]),
        ("gpu[3],login", ["gpu3", "login"]),
    ],
)
def test_expand_nodelist(nodelist, hosts):
    assert list(expand_nodelist(nodelist)) == hosts


@pytest.mark.parametrize("nodelist", ["n[01-", "n]1[", "n[a-b]", "n[4-2]", "a,,b", "n[[1]]", ""])
def test_expand_nodelist_refuses_malformed_lists(nodelist):
    with pytest.raises(ArgumentValueError, match=r"SLURM_JOB_NODELIST="):
        list(expand_nodelist(nodelist))


# ---------------------------------------------------------------------------------------------
# under the real mpiexec (hydra, from the mpich package)

_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")


def _run_mpiexec(script: str, n: int, tmp_path: Path) -> tuple[list[dict], float]:
    """Runs ``script`` on ``n`` ranks; what each rank wrote (``report``), and the wall time."""
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(_REPORT + script))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _LAUNCH_VARS and not k.startswith(("PMI_", "OMPI_", "SLURM_", "MASTER_"))
    }
    env.pop("TCP_PORT", None)
    start = time.monotonic()
    proc = subprocess.Popen(
        mpirun.command(n, sys.executable, str(path)),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=10)
        pytest.fail(f"mpiexec did not end within 40 s:\n{out}\n{err}")
    wall = time.monotonic() - start
    assert proc.returncode == 0, f"mpiexec exit {proc.returncode}:\n{out}\n{err}"
    rows = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank-*.json"))]
    assert len(rows) == n, f"{out}\n{err}"
    deadline = time.monotonic() + 5
    while any(alive(r["pid"]) for r in rows) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [r["pid"] for r in rows if alive(r["pid"])], "ranks survived mpiexec"
    return sorted(rows, key=lambda r: r["rank"]), wall


_REPORT = """
    import json, os
    from mpi4py import MPI

    def report(row):  # one file per rank: hydra may interleave the ranks' lines on stdout
        path = f"rank-{MPI.COMM_WORLD.Get_rank()}.json"
        with open(path + ".tmp", "w") as f:
            json.dump(dict(row, pid=os.getpid()), f)
        os.replace(path + ".tmp", path)
"""

_DETECT_JOB = """
    import time
    from mpi4py import MPI
    from hpccollect.transport.addresses import free_port
    from hpccollect.launchers.rendezvous import detect, launched_ranks, share_from_root

    comm = MPI.COMM_WORLD
    rv = detect()
    by_comm = detect(comm=comm, environ={})  # the communicator alone: Split_type for the node
    port = share_from_root(comm, free_port(rv.master_addr) if rv.is_master else None, 20)
    own = port if rv.is_master else None
    if rv.is_master:
        time.sleep(1.0)  # the others wait for a second: they must not spin a core meanwhile
    cpu, wall = time.process_time(), time.monotonic()
    big = share_from_root(comm, list(range(2000)) if rv.is_master else None, 20)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    report(dict(
        rank=rv.rank, world=rv.world_size, local_rank=rv.local_rank,
        local_size=rv.local_size, addr=rv.master_addr, port=rv.port, source=rv.source,
        launched=launched_ranks(), comm=[by_comm.rank, by_comm.world_size, by_comm.local_rank,
        by_comm.local_size, by_comm.master_addr, by_comm.source], shared=port, own=own,
        big_ok=big == list(range(2000)), cpu=cpu, wall=wall,
    ))
"""


@pytest.mark.timed
@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_detect_and_share_under_mpiexec(tmp_path):
    rows, wall = _run_mpiexec(_DETECT_JOB, 3, tmp_path)
    assert wall < 30, f"mpiexec -n 3 took {wall:.1f} s"
    assert [r["rank"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert (r["world"], r["local_rank"], r["local_size"]) == (3, r["rank"], 3)
        assert (r["addr"], r["port"], r["source"], r["launched"]) == ("127.0.0.1", None, "mpich", 3)
        assert r["comm"] == [r["rank"], 3, r["rank"], 3, "127.0.0.1", "mpi4py"]
        assert r["shared"] == rows[0]["own"] and 0 < r["shared"] < 65536
        assert r["big_ok"]
    for r in rows[1:]:  # waited ~1 s for rank 0, sleeping: MPICH's blocking bcast spins instead
        assert r["wall"] > 0.8 and r["cpu"] < 0.25, r


_TIMEOUT_JOB = """
    import time
    from mpi4py import MPI
    from hpccollect.launchers.rendezvous import share_from_root
    from hpccollect.errors import CollectorTimeoutError

    comm = MPI.COMM_WORLD
    row = dict(rank=comm.Get_rank())
    if comm.Get_rank() == 0:
        time.sleep(1.5)
        share_from_root(comm, "late", 10)  # completes the broadcast rank 1 gave up on
    else:
        start = time.monotonic()
        try:
            share_from_root(comm, None, 0.3)
        except CollectorTimeoutError as err:
            row.update(error=str(err), waited=time.monotonic() - start)
    comm.barrier()
    report(row)
"""


@pytest.mark.timed
@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_share_from_root_times_out_when_rank_0_does_not_come(tmp_path):
    rows, wall = _run_mpiexec(_TIMEOUT_JOB, 2, tmp_path)
    assert wall < 30, f"mpiexec -n 2 took {wall:.1f} s"
    assert 0.3 <= rows[1]["waited"] < 1.2, rows[1]
    assert "rank 1 of 2 waited 0.3 s for rank 0" in rows[1]["error"]
