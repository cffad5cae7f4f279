"""SLURM jobs (issue 10): start-up per launcher, ``sbatch jobs/collect.sh`` against the same
``collect`` under ``mpiexec``, and the time from SIGTERM to a clean exit.

* startup: seconds from constructing ``DistributedDataCollector`` (2 collector ranks, one
  CartPole each, the benchmarks' 2x64 actor, ``sync`` collectors) to its first batch, for
  ``launcher="mp"`` (this process: starting the rank processes included), ``"mpi"`` (this script
  under ``mpiexec -n 3``, started by it: the ranks exist already, so also the time from starting
  ``mpiexec`` to the first batch), ``"submitit"`` and ``"submitit_delayed"`` (jobs on the local
  cluster, scheduling included; skipped, with the reason, where submitit is not installed; any
  other error of a kind is reported as FAILED in its row, the other kinds still run).
* sbatch: frames/s once started, i.e. the ``collect`` summary's "frames/s while collecting" (from
  the first batch request to the last batch written; start-up and shutdown excluded), of
  ``sbatch jobs/collect.sh ARGS`` (its log read once it left the queue) against ``mpiexec -n 3
  python -m hpccollect collect ARGS`` with the same ARGS. Target: at least 0.9x.
* sigterm: seconds from SIGTERM to the end of a run that is collecting: ``mpiexec ... collect``
  sent SIGTERM (until the process has exited with 0), and an ``sbatch`` job sent ``scancel
  --signal=TERM`` (until it has left the queue, its log saying "collect exited with 0").

The script starts a private single-node cluster with ``slurm/up.sh`` (its own directory and free
ports, so it never touches a cluster you run) and always stops it with ``slurm/down.sh --purge``,
also on Ctrl-C or an error; it ends by checking that no job is left queued. The kinds of each part
take turns within a repeat; the best of ``--repeats`` is kept (lowest time, highest rate).

    .venv/bin/python benchmarks/slurm_jobs.py
    .venv/bin/python benchmarks/slurm_jobs.py --only sbatch --repeats 3 --frames 200000
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BIN = os.path.dirname(sys.executable)
MPIEXEC = shutil.which("mpiexec", path=BIN) or "mpiexec"
RATE = re.compile(r"\(([\d,]+) frames/s while collecting")
PARTS = ("startup", "sbatch", "sigterm")


# ---------------------------------------------------------------------------------- start-up
def first_batch_seconds(launcher: str, **kwargs: Any) -> float:
    """Construction of a 2-rank collector until its first batch (this process is rank 0)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from _common import Actor, cartpole

    from hpccollect import DistributedDataCollector

    start = time.perf_counter()
    collector = DistributedDataCollector(
        [cartpole, cartpole] if launcher != "mpi" else cartpole,
        Actor(),
        frames_per_batch=200,
        total_frames=-1,
        collector_class="single",
        launcher=launcher,
        **kwargs,
    )
    try:
        next(iter(collector))
        return time.perf_counter() - start
    finally:
        collector.shutdown()


def startup_under_mpiexec(env: dict[str, str]) -> tuple[float, float]:
    """The ``mpi`` launcher: this script's ``--mpi-rank`` mode under ``mpiexec -n 3``; the
    collector's start-up, and the time from starting ``mpiexec`` to the first batch."""
    launched = time.time()
    done = subprocess.run(
        [MPIEXEC, "-n", "3", sys.executable, __file__, "--mpi-rank"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    found = re.search(r"first batch after ([\d.]+) s at ([\d.]+)", done.stdout)
    if done.returncode or not found:
        raise RuntimeError(f"mpiexec exited {done.returncode}: {done.stderr[-2000:]}")
    return float(found.group(1)), float(found.group(2)) - launched


def startup(env: dict[str, str], repeats: int) -> dict[str, float | str]:
    results: dict[str, float | str] = {}
    folder = tempfile.mkdtemp(prefix="hpccollect-bench-submitit-")  # the jobs' logs and pickles
    for _ in range(repeats):
        for kind in ("mp", "mpi", "submitit", "submitit_delayed"):
            try:
                if kind == "mp":
                    seconds = first_batch_seconds("mp")
                elif kind == "mpi":
                    seconds, launch = startup_under_mpiexec(env)
                    results["mpi, from mpiexec"] = min(
                        launch, results.get("mpi, from mpiexec", launch)
                    )  # type: ignore[type-var]
                else:
                    slurm_kwargs = {"timeout_min": 10, "folder": folder}
                    seconds = first_batch_seconds(kind, slurm_kwargs=slurm_kwargs)
            except Exception as err:  # reported in the table; the other kinds still run
                missing = kind.startswith("submitit") and "needs the submitit package" in str(err)
                said = f"{type(err).__name__}: {str(err)[:160]}"
                results.setdefault(kind, f"{'skipped' if missing else 'FAILED'}: {said}")
                continue
            previous = results.get(kind)
            if not isinstance(previous, float) or seconds < previous:
                results[kind] = seconds
    shutil.rmtree(folder, ignore_errors=True)
    return results


# ---------------------------------------------------------------------------------- jobs
class Cluster:
    """A private cluster: ``start()`` runs ``slurm/up.sh``, ``close()`` runs ``down.sh --purge``."""

    def __init__(self) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI_"))}
        self.env.update(
            HPCCOLLECT_SLURM_DIR=tempfile.mkdtemp(prefix="hpccollect-bench-slurm-"),
            HPCCOLLECT_SLURM_CTLD_PORT=str(free_port()),
            HPCCOLLECT_SLURM_SLURMD_PORT=str(free_port()),
            HPCCOLLECT_VENV=sys.prefix,
            PATH=BIN + os.pathsep + os.environ.get("PATH", ""),
        )

    def start(self) -> None:
        up = self.run("bash", str(REPO / "slurm" / "up.sh"), timeout=240)
        for line in up.splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            self.env[name] = value

    def run(self, *cmd: str, timeout: float = 60, cwd: Path | None = None) -> str:
        done = subprocess.run(
            cmd, env=self.env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr[-2000:]}")
        return done.stdout

    def queued(self) -> list[str]:
        return self.run("squeue", "-h", "-o", "%A").split()

    def close(self) -> None:
        subprocess.run(
            ["bash", str(REPO / "slurm" / "down.sh"), "--purge"],
            env=self.env,
            capture_output=True,
            timeout=120,
            check=False,
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sbatch(cluster: Cluster, work: Path, name: str, args: list[str]) -> str:
    (work / "logs").mkdir(exist_ok=True)
    out = cluster.run(
        "sbatch", "--parsable", f"--job-name={name}", f"--chdir={work}",
        str(REPO / "jobs" / "collect.sh"), *args,
    )  # fmt: skip
    return out.strip().split(";")[0]


def job_log(work: Path, name: str, job: str) -> Path:
    return work / "logs" / f"{name}-{job}.out"


def wait_gone(cluster: Cluster, job: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while job in cluster.queued():
        if time.monotonic() > deadline:
            cluster.run("scancel", job)
            raise RuntimeError(f"job {job} still queued after {timeout:g} s")
        time.sleep(0.1)


def sbatch_rate(cluster: Cluster, work: Path, args: list[str]) -> float:
    job = sbatch(cluster, work, "bench", [*args, "--quiet"])
    wait_gone(cluster, job, 900)
    text = job_log(work, "bench", job).read_text()
    found = RATE.search(text)
    if not found:
        raise RuntimeError(f"job {job} printed no summary:\n{text[-2000:]}")
    return float(found.group(1).replace(",", ""))


def mpiexec_collect(
    cluster: Cluster, work: Path, args: list[str], stderr: Any = subprocess.PIPE
) -> subprocess.Popen:
    cmd = [MPIEXEC, "-n", "3", sys.executable, "-m", "hpccollect", "collect", *args]
    env = {**cluster.env, "UCX_NET_DEVICES": "lo"}
    return subprocess.Popen(
        cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
    )


def mpiexec_rate(cluster: Cluster, work: Path, args: list[str]) -> float:
    proc = mpiexec_collect(
        cluster, work, [*args, "--quiet", "--out", f"direct-{time.time_ns()}.h5"]
    )
    out, err = proc.communicate(timeout=900)
    found = RATE.search(out)
    if proc.returncode or not found:
        raise RuntimeError(f"mpiexec collect exited {proc.returncode}: {err[-2000:]}")
    return float(found.group(1).replace(",", ""))


def rates(cluster: Cluster, work: Path, args: list[str], repeats: int) -> dict[str, float]:
    best: dict[str, float] = {}
    for repeat in range(repeats):
        kinds = ("sbatch", "mpiexec") if repeat % 2 == 0 else ("mpiexec", "sbatch")
        for kind in kinds:
            rate = (sbatch_rate if kind == "sbatch" else mpiexec_rate)(cluster, work, args)
            best[kind] = max(best.get(kind, 0.0), rate)
    return best


def collecting(text: str) -> bool:
    """Whether rank 0's progress shows a first batch."""
    return bool(re.search(r"\] [1-9]\d*/\d+ frames", text))


def stop_mpiexec(cluster: Cluster, work: Path, args: list[str]) -> float:
    log = work / f"term-{time.time_ns()}.log"
    with open(log, "w") as err:
        proc = mpiexec_collect(cluster, work, [*args, "--out", f"{log.stem}.h5"], stderr=err)
    deadline = time.monotonic() + 300
    while not collecting(log.read_text()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait(30)
            raise RuntimeError(f"mpiexec collect did not start collecting:\n{log.read_text()}")
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    sent = time.perf_counter()
    out, _ = proc.communicate(timeout=120)
    seconds = time.perf_counter() - sent
    if proc.returncode or "stopped early by SIGTERM" not in out:
        raise RuntimeError(f"mpiexec collect ended {proc.returncode} after SIGTERM: {out}")
    return seconds


def stop_sbatch(cluster: Cluster, work: Path, args: list[str]) -> float:
    job = sbatch(cluster, work, "term", args)
    log, deadline = job_log(work, "term", job), time.monotonic() + 300
    while not (log.exists() and collecting(log.read_text())):
        if time.monotonic() > deadline or job not in cluster.queued():
            cluster.run("scancel", job)
            raise RuntimeError(f"job {job} did not start collecting")
        time.sleep(0.1)
    cluster.run("scancel", "--signal=TERM", job)
    sent = time.perf_counter()
    wait_gone(cluster, job, 120)
    seconds = time.perf_counter() - sent
    if "collect exited with 0" not in log.read_text():
        raise RuntimeError(f"job {job} did not stop cleanly:\n{log.read_text()[-2000:]}")
    return seconds


def sigterm(cluster: Cluster, work: Path, args: list[str], repeats: int) -> dict[str, float]:
    best: dict[str, float] = {}
    for _ in range(repeats):
        for kind, stop in (("mpiexec", stop_mpiexec), ("sbatch", stop_sbatch)):
            best[kind] = min(best.get(kind, float("inf")), stop(cluster, work, args))
    return best


# ---------------------------------------------------------------------------------- main
def print_table(rows: list[tuple[str, str, str]], repeats: int) -> None:
    print(f"\n| measurement (best of {repeats}) | figure | ratio, target |\n| --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=PARTS, action="append", help="parts to run (default all)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--frames", type=int, default=100_000, help="frames per sbatch/mpiexec run")
    parser.add_argument("--mpi-rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mpi_rank:  # one rank of the mpi start-up measurement; only rank 0 returns
        seconds = first_batch_seconds("mpi")
        print(f"first batch after {seconds:.3f} s at {time.time():.3f}", flush=True)
        return
    parts = args.only or list(PARTS)
    collect_args = ["--collector", "single", "--frames-per-batch", "500", "--env", "CartPole-v1"]
    cluster = Cluster()
    work = Path(tempfile.mkdtemp(prefix="hpccollect-bench-jobs-"))
    try:
        cluster.start()  # inside try: a cluster that fails half-way up is still stopped
        os.environ["SLURM_CONF"] = cluster.env["SLURM_CONF"]  # submitit's sbatch, in this process
        print(f"slurm_jobs: {os.cpu_count()} CPUs, cluster {cluster.env['SLURM_CONF']}")
        rows: list[tuple[str, str, str]] = []  # measurement, figure, ratio and target
        if "startup" in parts:
            for kind, value in startup(cluster.env, args.repeats).items():
                shown = f"{value:.2f} s" if isinstance(value, float) else value
                print(f"start-up to first batch, launcher={kind:18s} {shown}", flush=True)
                rows.append((f"start-up to first batch, launcher={kind}", shown, ""))
        if "sbatch" in parts:
            best = rates(cluster, work, [*collect_args, "--total-frames", str(args.frames)],
                         args.repeats)  # fmt: skip
            ratio = best["sbatch"] / best["mpiexec"]
            verdict = f"{ratio:.2f}x ({'ok' if ratio >= 0.9 else 'MISSED'}: target >= 0.9x)"
            rows.append(("frames/s once started, sbatch jobs/collect.sh", f"{best['sbatch']:,.0f}",
                         f"{verdict} of mpiexec"))  # fmt: skip
            rows.append(
                ("frames/s once started, mpiexec -n 3 collect", f"{best['mpiexec']:,.0f}", "")
            )
            print(f"frames/s once started: {best}, {verdict}", flush=True)
        if "sigterm" in parts:
            endless = [*collect_args, "--total-frames", "100000000"]
            for kind, seconds in sigterm(cluster, work, endless, args.repeats).items():
                print(f"SIGTERM to clean exit, {kind:8s} {seconds:.2f} s", flush=True)
                rows.append((f"SIGTERM to clean exit (rc 0), {kind}", f"{seconds:.2f} s", ""))
        print_table(rows, args.repeats)
        left = cluster.queued()
        if left:
            raise RuntimeError(f"jobs left queued: {left}")
    finally:
        cluster.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
