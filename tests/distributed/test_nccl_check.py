"""The GPU check of the data plane (``nccl_check.py``), run as CI can: the same point-to-point
and broadcast calls over gloo, on the CPU. With GPUs it runs NCCL (see the script)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("nccl_check.py")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_gpu_check_passes_over_gloo_on_the_cpu():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--backend", "gloo", "--device", "cpu", "--ranks", "2"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok gloo on cpu, sync=True: 2 rank(s), 3 weight updates" in done.stdout
    assert "ok gloo on cpu, sync=False: 2 rank(s), 3 weight updates" in done.stdout
