"""Run TorchRL's own distributed tests and examples against hpccollect, with only the collector
imports changed (``docs/torchrl.md``, "TorchRL's own distributed tests and examples").

Nothing of TorchRL is kept in this repository: the files are read from a pytorch/rl checkout at
a commit, their ``from torchrl.collectors`` imports are pointed at ``hpccollect.collectors``,
and the copies are run in a temporary directory with the torchrl environment's Python. The
examples' SLURM options are made those of a cluster without GPUs (one CPU per task) and need
``SLURM_CONF`` of a running cluster (``slurm/up.sh``); without one they are skipped.

    .venv-torchrl/bin/pip install psutil 'gym==0.26.2' tqdm   # what the files import
    .venv-torchrl/bin/python tests/torchrl_upstream.py --rl ~/src/rl
    .venv-torchrl/bin/python tests/torchrl_upstream.py --rl ~/src/rl --only examples --original

The examples time the rounds after their 10th; the default size (``SMALL``: 20 rounds) is for
a run that checks they work. For a speed figure, give them more rounds and pick one example:

    .venv-torchrl/bin/python tests/torchrl_upstream.py --rl ~/src/rl --only examples \
        --example multi_nodes/sync.py --frames-per-batch 800 --total-frames 120000 [--original]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

#: pytorch/rl's "Bump 0.14.0": the files of 0.14.0, run against the torchrl 0.14.1 that the
#: torchrl environment pins (the tag of 0.14.1 is not in the repository)
COMMIT = "373c31a85"
TESTS = "test/test_distributed.py"
#: the non-Ray classes (Ray is not installed)
SELECT = "TestDistributedCollector or TestRPCCollector or TestSyncCollector"
EXAMPLES = "examples/distributed/collectors"
SMALL = ["--env", "CartPole-v1", "--num_nodes", "2", "--frames_per_batch", "400"]
SMALL += ["--total_frames", "8000"]
#: (example, its arguments): every mode each single-machine example has, and the SLURM ones
RUNS = [
    ("single_machine/generic.py", ["--backend", "gloo", "--num_workers", "1"]),
    ("single_machine/generic.py", ["--backend", "gloo", "--num_workers", "1", "--sync"]),
    (
        "single_machine/generic.py",
        ["--backend", "gloo", "--num_workers", "2", "--worker_parallelism", "env"],
    ),
    ("single_machine/sync.py", ["--backend", "gloo", "--num_workers", "1"]),
    (
        "single_machine/sync.py",
        ["--backend", "gloo", "--num_workers", "2", "--worker_parallelism", "env"],
    ),
    ("single_machine/rpc.py", ["--num_workers", "2"]),
    ("single_machine/rpc.py", ["--num_workers", "1", "--sync"]),
    ("multi_nodes/generic.py", ["--backend", "gloo", "--slurm_partition", "debug"]),
    ("multi_nodes/sync.py", ["--backend", "gloo", "--slurm_partition", "debug"]),
]


def swapped(text: str) -> str:
    """``text`` with its collector imports taken from hpccollect instead of torchrl; an import
    of TorchRL's collectors left in another form fails (the run would test TorchRL's)."""
    out, n = re.subn(
        r"^(\s*)from torchrl\.collectors(\.distributed)? import",
        r"\1from hpccollect.collectors\2 import",
        text,
        flags=re.M,
    )
    left = [
        line
        for line in re.findall(r"^\s*(?:from|import) torchrl\.collectors.*$", out, flags=re.M)
        if ".ray import" not in line  # Ray's settings: the Ray classes are not run
    ]
    if not n or left:
        raise SystemExit(f"cannot swap the collector imports: {n} swapped, left: {left}")
    return out


def without_gpus(text: str) -> str:
    """An example's SLURM options for a cluster without GPUs: one CPU per task, 5 minutes."""
    text = text.replace(
        '"slurm_cpus_per_gpu": args.slurm_cpus_per_gpu,', '"slurm_cpus_per_task": 1,'
    )
    text = re.sub(r'^\s*"slurm_gpus_per_task": args\.slurm_gpus_per_task,\n', "", text, flags=re.M)
    return text.replace('"timeout_min": 100', '"timeout_min": 5')


def read(rl: Path, commit: str, path: str) -> str:
    return subprocess.run(
        ["git", "-C", str(rl), "show", f"{commit}:{path}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def run_tests(rl: Path, commit: str, work: Path, original: bool, workers: int) -> int:
    text = read(rl, commit, TESTS)
    (work / "test_distributed.py").write_text(text if original else swapped(text))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", SELECT]
    cmd += ["-W", "ignore::DeprecationWarning", "test_distributed.py"]
    if workers > 1:
        cmd += ["-n", str(workers)]
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=work, timeout=3600).returncode


def run_examples(
    rl: Path, commit: str, work: Path, original: bool, pick: str | None = None, size: list = ()
) -> int:
    """Run each example of ``RUNS`` (those whose name contains ``pick``) with ``SMALL`` and
    then ``size``'s arguments (later ones win); print each one's exit status and frames/s."""
    failed = 0
    for example, args in RUNS:
        if pick is not None and pick not in example:
            continue
        if example.startswith("multi_nodes") and not os.environ.get("SLURM_CONF"):
            print(f"{example}: skipped (no SLURM_CONF: start a cluster with slurm/up.sh)")
            continue
        text = without_gpus(read(rl, commit, f"{EXAMPLES}/{example}"))
        script = work / example.replace("/", "_")
        script.write_text(text if original else swapped(text))
        done = subprocess.run(
            [sys.executable, str(script), *SMALL, *size, *args],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=600,
        )
        rate = re.findall(r"rate: ([0-9.]+) fps", done.stdout + done.stderr)
        error = re.findall(r"^\w*Error: .*$", done.stderr, flags=re.M)
        print(
            f"{example} {' '.join(args)}: exit {done.returncode}"
            + (f", {float(rate[-1]):,.0f} frames/s" if rate else "")
            + (f" ({error[-1][:200]})" if done.returncode and error else ""),
            flush=True,
        )
        failed += done.returncode != 0
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rl", type=Path, required=True, help="a pytorch/rl git checkout")
    parser.add_argument("--commit", default=COMMIT, help=f"its commit to read (default {COMMIT})")
    parser.add_argument("--only", choices=["tests", "examples"], help="one of the two")
    parser.add_argument("--original", action="store_true", help="TorchRL's own classes")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers")
    parser.add_argument("--example", help="only the examples whose path contains this")
    parser.add_argument("--frames-per-batch", type=int, help=f"the examples' (default {SMALL[5]})")
    parser.add_argument("--total-frames", type=int, help=f"the examples' (default {SMALL[7]})")
    args = parser.parse_args()
    size = []
    if args.frames_per_batch is not None:
        size += ["--frames_per_batch", str(args.frames_per_batch)]
    if args.total_frames is not None:
        size += ["--total_frames", str(args.total_frames)]
    with tempfile.TemporaryDirectory(prefix="hpccollect-torchrl-") as tmp:
        work = Path(tmp)
        failed = 0
        if args.only in (None, "tests"):
            failed += run_tests(args.rl, args.commit, work, args.original, args.workers) != 0
        if args.only in (None, "examples"):
            failed += run_examples(args.rl, args.commit, work, args.original, args.example, size)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
