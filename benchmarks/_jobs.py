"""How the benchmark scripts run their jobs (an ``mpiexec`` of the script itself, a launcher's
run): each bounded, and a job that overruns ends whole, its ranks and ``mpiexec``'s helpers
with it, so a benchmark that hangs in a transport leaves nothing running behind it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

__all__ = ["mpiexec", "result", "run"]

_GRACE = 5.0  # s between the TERM and the KILL of a job that overran


def mpiexec() -> str:
    """The ``mpiexec`` beside this Python (the test extra's MPICH)."""
    found = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    if found is None:
        raise SystemExit("no mpiexec beside this Python (pip install mpich)")
    return found


def run(cmd: list[str], timeout: float = 900, **kwargs: Any) -> subprocess.CompletedProcess:
    """Run ``cmd`` to its end, its output captured as text, in a session of its own: past
    ``timeout`` s its whole process group is ended (TERM, then KILL) and the benchmark stops
    with a message naming the command."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _end_group(proc)
        raise SystemExit(f"{' '.join(cmd)} ran past {timeout:g} s and was ended") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _end_group(proc: subprocess.Popen) -> None:
    """TERM the job's process group, KILL what is left of it ``_GRACE`` s later."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=_GRACE)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:  # the leader is gone; its group's stragglers are not
            time.sleep(0.5)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def result(cmd: list[str], timeout: float = 900, **kwargs: Any) -> Any:
    """The JSON of the ``RESULT`` line that ``cmd`` prints (run as ``run`` does); a job that
    fails or prints none stops the benchmark, with its output's end."""
    proc = run(cmd, timeout, **kwargs)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode})")
    return json.loads(line[0][len("RESULT ") :])
