"""examples/ppo_distributed.py under a real ``mpiexec -n 3``: rank 0 trains PPO on the batches of
two collector ranks and pushes its weights every batch; on a small budget the mean return must
climb far above a random policy's (about 22 on CartPole-v1), which it cannot do if the weights
never reach the ranks (they would keep acting with the initial, random policy) or if the loss
does not improve the policy.
"""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import mpirun
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "ppo_distributed.py"
FINAL = re.compile(r"final mean return (\d+\.\d) over (\d+) frames")


def run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own session; a hung job has every process of it killed."""
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_mpich_segments_left")
@mpirun.needs()
def test_ppo_learns_under_mpiexec(tmp_path: Path) -> None:
    """40k frames, seed 0 (about 30 s on a quiet 2-core machine): the mean return of the last 20
    training episodes and the final line (the best policy, greedy) end well above 150, the curve
    starts near random, CSV and PNG are written and the last line has the documented format."""
    out = tmp_path / "run"
    cmd = [
        *mpirun.command(3),
        sys.executable,
        str(SCRIPT),
        "--total-frames",
        "40000",
        "--frames-per-batch",
        "2000",
    ]
    done = run([*cmd, "--seed", "0", "--out", str(out)], timeout=220)
    assert done.returncode == 0, done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1]
    match = FINAL.fullmatch(last)
    assert match, f"last line {last!r}"
    assert int(match[2]) == 40_000
    assert float(match[1]) > 150, done.stdout

    with open(out / "curve.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["frames", "mean_return"]
    frames = [int(r[0]) for r in rows[1:]]
    assert frames == list(range(2000, 40_001, 2000))  # one row per 2000-frame batch
    assert float(rows[1][1]) < 50  # the first batch: the untrained policy
    # the behaviour policy on the collector ranks learned too: their weights came from rank 0
    trained = re.search(
        r"training: mean return (\d+\.\d) .* best policy after (\d+) frames", done.stdout
    )
    assert trained, done.stdout
    assert f"{float(rows[-1][1]):.1f}" == trained[1]
    assert float(trained[1]) > 150, done.stdout
    assert int(trained[2]) in frames
    assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--total-frames", "0"], "argument --total-frames: must be a positive integer, got 0"),
        (["--lr", "-1"], "--lr must be > 0, got -1.0"),
        (["--launcher", "ssh"], "argument --launcher: invalid choice: 'ssh'"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args: list[str], message: str) -> None:
    done = run([sys.executable, str(SCRIPT), *args], timeout=50)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ppo_distributed.py: error: ") and message in last, done.stderr
