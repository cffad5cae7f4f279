"""How often a Ctrl-C to a gloo job on one machine ends it, and how long its rank 0 takes to
exit: the robustness figure of ``hpccollect/transport/groups.py``'s release of its groups.

Each round starts rank 0 (a ``DistributedDataCollector`` over gloo, ``launcher="mp"``, two
CartPole ranks, 20 frames a batch, no end to the frames) in a session of its own, waits until
it collects, sends the whole session SIGINT (what Ctrl-C in a terminal does) and waits up to
``--limit`` s for rank 0 to exit. A round where it does not is a hang: rank 0's Python stacks
are dumped (``faulthandler`` on SIGUSR1) into the results, then the session is killed. The
Ctrl-C lands wherever rank 0 is, so the rare case (between the post of a receive and the line
that keeps it) comes up only over many rounds; ``--load K`` runs K busy loops beside the job,
as a loaded node does, which made it come up in 1 round of 8 to 22 before it was mended.

The results (``--out``) list each round's seconds from the Ctrl-C to rank 0's exit: a round
that lost a receive and left its release to the thread of ``groups.py`` pays that thread's
2 s wait.

    python benchmarks/ctrl_c_exit.py --rounds 60 --load 3
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "ctrl_c_exit.json"

RANK_0 = """
import faulthandler, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)
sys.path.insert(0, {here!r})
from _common import cartpole
from hpccollect import DistributedDataCollector

if __name__ == "__main__":
    c = DistributedDataCollector([cartpole, cartpole], None, frames_per_batch=20, launcher="mp")
    it = iter(c)
    next(it)
    print("collecting", flush=True)
    for batch in it:
        pass
"""


def one(script: Path, after: float, limit: float, folder: Path) -> dict:
    """One round: seconds from the SIGINT to rank 0's exit, or the hang's stacks."""
    err_path = folder / "stderr.txt"
    with open(err_path, "w") as err:
        job = subprocess.Popen(
            [sys.executable, str(script)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    try:
        if job.stdout.readline().strip() != "collecting":
            job.wait(limit)
            raise SystemExit(f"rank 0 did not start:\n{err_path.read_text()[-2000:]}")
        time.sleep(after)
        sent = time.monotonic()
        os.killpg(job.pid, signal.SIGINT)
        try:
            job.wait(limit)
            return {"exit": job.returncode, "seconds": round(time.monotonic() - sent, 2)}
        except subprocess.TimeoutExpired:
            os.kill(job.pid, signal.SIGUSR1)
            time.sleep(1.0)
            return {"hung": err_path.read_text()[-6000:]}
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--load", type=int, default=3, help="busy loops beside the job")
    p.add_argument("--after", type=float, default=1.0, help="s of collecting before Ctrl-C")
    p.add_argument("--limit", type=float, default=30.0, help="s past which rank 0 is hung")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.load)]
    rounds = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            script = folder / "rank_0.py"
            script.write_text(RANK_0.format(here=str(HERE)))
            for i in range(a.rounds):
                rounds.append(one(script, a.after, a.limit, folder))
                print(i, json.dumps(rounds[-1])[:200], flush=True)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    seconds = [r["seconds"] for r in rounds if "seconds" in r]
    result = {
        "rounds": len(rounds),
        "load": a.load,
        "exited": len(seconds),
        "hung": sum("hung" in r for r in rounds),
        "exit_codes": sorted({r["exit"] for r in rounds if "exit" in r}),
        "exit_seconds_median": statistics.median(seconds) if seconds else None,
        "exit_seconds_max": max(seconds) if seconds else None,
        "exit_seconds": sorted(seconds),
        "hangs": [r["hung"] for r in rounds if "hung" in r][:2],
    }
    a.out.parent.mkdir(exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "hangs"}))


if __name__ == "__main__":
    main()
