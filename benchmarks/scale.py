"""Weak scaling of rank 0: how many batches one rank 0 takes in as collector ranks are added.

Each collector rank runs ``Premade``: a ``SyncDataCollector`` that collects its first batch for
real and then hands the same batch again at once, so the ranks cost almost nothing but their
sends and this machine's cores go to rank 0 (a real env on 32 ranks would only measure how the
ranks share two cores). Two batches: CartPole (``--fpb`` frames of a 4-float observation, the
usual keys) and an image batch (64 frames of uint8 ``[3, 84, 84]`` observations). Two
transports: gloo (``launcher="mp"``: local rank processes, loopback) and the mpi4py transport
(``backend="mpi"`` under ``mpiexec -n k+1``). ``sync=False``: rank 0 takes whichever batch is
ready, as a trainer that keeps up would.

Per rank count: start-up (construction to the first batch), batches/s and MB/s into rank 0 over
``--seconds``, rank 0's CPU share, and its resident memory. Results go to
``benchmarks/results/scale.json``; ``--plot PNG`` draws them.

    python benchmarks/scale.py --ranks 1 2 4 8 16 32 --seconds 5 --plot docs/scale.png
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

import _jobs
import gymnasium as gym
import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "scale.json"


class ImageEnv(gym.Env):
    """3x84x84 uint8 observations, two actions, episodes of 100 steps."""

    observation_space = gym.spaces.Box(0, 255, (3, 84, 84), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros((3, 84, 84), np.uint8), {}

    def step(self, action):
        self.t += 1
        return np.full((3, 84, 84), self.t % 256, np.uint8), 1.0, False, self.t >= 100, {}


def _premade_class():
    from hpccollect import SyncDataCollector

    class Premade(SyncDataCollector):
        """Collects one batch for real, then hands the same one again at once."""

        _made = False

        def _collect_counted(self):
            if not self._made:
                self._batch = super()._collect_counted()
                self._made = True
                return self._batch
            self._frames += self._batch.numel()
            return self._batch

    return Premade


def env_for(kind: str):
    return partial(gym.make, "CartPole-v1") if kind == "cartpole" else ImageEnv


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def measure(kind: str, launcher: str, backend: str, ranks: int, seconds: float, fpb: int):
    """One run on rank 0: (start-up s, batches/s, MB/s, rank 0 CPU share, RSS MB)."""
    from hpccollect import DistributedDataCollector

    frames = fpb if kind == "cartpole" else 64
    start = time.perf_counter()
    collector = DistributedDataCollector(
        env_for(kind) if launcher == "mpi" else [env_for(kind)] * ranks,
        frames_per_batch=frames,
        total_frames=-1,
        collector_class=_premade_class(),
        launcher=launcher,
        backend=backend,
        sync=False,
    )
    try:
        it = iter(collector)
        batch = next(it)
        startup = time.perf_counter() - start
        nbytes = sum(v.numel() * v.element_size() for v in batch.values(True, True))
        n = 0
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            next(it)
            n += 1
        wall = time.perf_counter() - t0
        cpu = (time.process_time() - cpu0) / wall
        return startup, n / wall, n * nbytes / wall / 1e6, cpu, rss_mb(), nbytes
    finally:
        collector.shutdown()


def _rank0_main(args: argparse.Namespace) -> None:
    """Under mpiexec (every rank runs this): one measurement, printed by rank 0 as JSON."""
    out = measure(args.kind, "mpi", "mpi", args.one, args.seconds, args.fpb)
    print("RESULT " + json.dumps(out), flush=True)


def run(args: argparse.Namespace) -> list[dict]:
    rows = []
    mpiexec = _jobs.mpiexec() if "mpi" in args.transports else ""
    for kind in args.kinds:
        for transport in args.transports:
            for k in args.ranks:
                if transport == "gloo":
                    got = measure(kind, "mp", "gloo", k, args.seconds, args.fpb)
                else:
                    cmd = [mpiexec, "-n", str(k + 1), sys.executable, __file__, "--one", str(k)]
                    cmd += ["--kind", kind, "--seconds", str(args.seconds), "--fpb", str(args.fpb)]
                    got = _jobs.result(cmd)
                startup, bps, mbps, cpu, rss, nbytes = got
                row = dict(
                    kind=kind,
                    transport=transport,
                    ranks=k,
                    startup_s=round(startup, 2),
                    batches_per_s=round(bps, 1),
                    mb_per_s=round(mbps, 1),
                    rank0_cpu=round(cpu, 2),
                    rank0_rss_mb=round(rss),
                    batch_bytes=nbytes,
                )
                rows.append(row)
                print(
                    f"{kind:8s} {transport:5s} ranks {k:3d}: start-up {startup:5.1f} s, "
                    f"{bps:8.1f} batches/s, {mbps:8.1f} MB/s, rank 0 CPU {cpu:4.2f}, "
                    f"RSS {rss:6.0f} MB",
                    flush=True,
                )
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for kind, style in (("cartpole", "-"), ("image", "--")):
        for transport, marker in (("gloo", "o"), ("mpi", "s")):
            sel = [r for r in rows if r["kind"] == kind and r["transport"] == transport]
            if not sel:
                continue
            x = [r["ranks"] for r in sel]
            label = f"{kind}, {transport}"
            axes[0].plot(x, [r["batches_per_s"] for r in sel], style, marker=marker, label=label)
            axes[1].plot(x, [r["mb_per_s"] for r in sel], style, marker=marker, label=label)
            axes[2].plot(x, [r["startup_s"] for r in sel], style, marker=marker, label=label)
    titles = ("rank 0 ingest, batches/s", "rank 0 ingest, MB/s", "start-up, s")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("collector ranks")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle("One rank 0 on 2 cores, collector ranks sending pre-made batches", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--kinds", nargs="+", default=["cartpole", "image"])
    p.add_argument("--transports", nargs="+", default=["gloo", "mpi"])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--fpb", type=int, default=200, help="CartPole frames per batch")
    p.add_argument("--plot", type=Path, help="draw the figures into this PNG")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)  # under mpiexec: one run
    p.add_argument("--kind", default="cartpole", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one is not None:
        _rank0_main(args)
        return
    rows = run(args)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=1) + "\n")
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
