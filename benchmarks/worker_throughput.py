"""Frames/s of a collector in worker processes against the same collector in this process.

The configurations of issue 7, item 19, in one run: CartPole-v1, one env per collector, actor
classes defined in this script's ``__main__`` (so cloudpickle sends them to the workers by value,
as it does for a user's script), both actor kinds (a plain ``nn.Module`` and a
``ProbabilisticTensorDictSequential``), 512 and 1024 frames per worker per batch:

* ``SyncDataCollector`` in this process;
* ``aSyncDataCollector``: one worker, this process only waits;
* ``MultiSyncDataCollector`` with 2 workers;
* reference: two independent processes each running a ``SyncDataCollector`` at the same time,
  which says how much of a second core the machine gave during the run.

Each measurement starts after a first batch (start-up excluded); the kinds take turns within
each repeat, and the best of ``--repeats`` is kept. A second line gives the CPU time per frame of
the processes that collect (this one for Sync, the workers otherwise): what a frame costs in a
worker against in this process, whatever share of the cores the machine gave each.

    python benchmarks/worker_throughput.py
    python benchmarks/worker_throughput.py --repeats 5 --batches 10

Targets: aSync >= 0.9x Sync; MultiSync with 2 workers >= 1.6x Sync (for both actor kinds and
both batch sizes). On a machine busy with other work the reference column falls below 2x and
the MultiSync target cannot be met there: compare MultiSync with it.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from dataclasses import dataclass, field

import gymnasium as gym
import torch
from tensordict.nn import (
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
)
from torch import nn
from torch.distributions import OneHotCategorical

from hpccollect import MultiSyncDataCollector, SyncDataCollector, aSyncDataCollector

TARGETS = {"async": 0.9, "multisync": 1.6}


class MLP(nn.Module):
    """4 observations -> 2 logits through two hidden layers of 64 (defined here, in __main__)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2)
        )

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.layers(observation)


class Actor(nn.Module):
    """observation -> one-hot action sampled from OneHotCategorical(logits=MLP(observation))."""

    def __init__(self) -> None:
        super().__init__()
        self.net = MLP()

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return OneHotCategorical(logits=self.net(observation)).sample()


def td_actor() -> ProbabilisticTensorDictSequential:
    """The same actor as TorchRL users write it."""
    return ProbabilisticTensorDictSequential(
        TensorDictModule(MLP(), in_keys=["observation"], out_keys=["logits"]),
        ProbabilisticTensorDictModule(
            in_keys=["logits"], out_keys=["action"], distribution_class=OneHotCategorical
        ),
    )


ACTORS = {"module": Actor, "td": td_actor}


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def _cpu_seconds(pids: list[int]) -> float | None:
    """CPU seconds (user + system) used so far by ``pids``, or by this process if empty;
    None where ``/proc`` cannot tell."""
    if not pids:
        return time.process_time()
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def measure(collector, frames: int) -> tuple[float, float | None]:
    """(frames/s, CPU microseconds per frame of the collecting processes) over at least
    ``frames`` frames after a first batch; shuts the collector down."""
    try:
        pids = list(getattr(collector, "worker_pids", []))
        it = iter(collector)
        next(it)
        n, cpu0, start = 0, _cpu_seconds(pids), time.perf_counter()
        while n < frames:
            n += next(it).numel()
        rate = n / (time.perf_counter() - start)
        cpu1 = _cpu_seconds(pids)
        cpu = None if cpu0 is None or cpu1 is None else 1e6 * (cpu1 - cpu0) / n
        return rate, cpu
    finally:
        collector.shutdown()


def _independent(kind: str, fpb: int, batches: int, ready, go, results) -> None:
    """One process of the reference pair: a SyncDataCollector here, timed from ``go``."""
    collector = SyncDataCollector(cartpole, ACTORS[kind](), frames_per_batch=fpb)
    it = iter(collector)
    next(it)
    ready.wait()
    go.wait()
    start, cpu = time.perf_counter(), time.process_time()
    n = sum(next(it).numel() for _ in range(batches))
    results.put((n, start, time.perf_counter(), time.process_time() - cpu))
    collector.shutdown()


def independent_pair(kind: str, fpb: int, batches: int) -> tuple[float, float]:
    """Combined frames/s of two independent Sync processes running at the same time, and their
    CPU microseconds per frame."""
    ctx = mp.get_context("spawn")
    ready, go, results = ctx.Barrier(3), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_independent, args=(kind, fpb, batches, ready, go, results))
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    try:
        ready.wait(timeout=300)
        go.set()
        parts = [results.get(timeout=300) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    frames = sum(p[0] for p in parts)
    elapsed = max(p[2] for p in parts) - min(p[1] for p in parts)
    return frames / elapsed, 1e6 * sum(p[3] for p in parts) / frames


@dataclass
class Row:
    kind: str
    fpb: int
    rates: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)

    def keep_best(self, name: str, result: tuple[float, float | None] | float) -> None:
        rate, cpu = result if isinstance(result, tuple) else (result, None)
        self.rates[name] = max(self.rates.get(name, 0.0), rate)
        if cpu is not None:
            self.cpu[name] = min(self.cpu.get(name, float("inf")), cpu)

    def ratio(self, name: str) -> float:
        return self.rates[name] / self.rates["sync"]


def run_round(row: Row, batches: int, with_reference: bool) -> None:
    """One measurement of each collector for ``row``'s actor kind and batch size."""
    make, fpb = ACTORS[row.kind], row.fpb
    frames = batches * fpb
    row.keep_best(
        "sync", measure(SyncDataCollector(cartpole, make(), frames_per_batch=fpb), frames)
    )
    row.keep_best(
        "async", measure(aSyncDataCollector(cartpole, make(), frames_per_batch=fpb), frames)
    )
    row.keep_best(
        "multisync",
        measure(
            MultiSyncDataCollector([cartpole] * 2, make(), frames_per_batch=2 * fpb), 2 * frames
        ),
    )
    if with_reference:
        row.keep_best("pair", independent_pair(row.kind, fpb, batches))


def report(row: Row) -> None:
    """Two lines per row: rates, ratios to Sync and a verdict per target; then the CPU time each
    collector's processes spent per frame (the cost of a frame wherever it is collected)."""
    verdicts = []
    for name, target in TARGETS.items():
        ok = "meets" if row.ratio(name) >= target else "BELOW"
        verdicts.append(f"{name} {row.ratio(name):.2f}x ({ok} {target}x)")
    ref = (
        f"  [2 independent Sync processes: {row.ratio('pair'):.2f}x]" if "pair" in row.rates else ""
    )
    print(
        f"actor={row.kind:6s} fpb/worker={row.fpb:4d}  sync {row.rates['sync']:6.0f}  "
        f"async {row.rates['async']:6.0f}  multisync {row.rates['multisync']:6.0f} f/s  |  "
        + "  ".join(verdicts)
        + ref
    )
    if {"sync", "async", "multisync"} <= set(row.cpu):
        sync, pair = row.cpu["sync"], row.cpu.get("pair")
        both = f", 2 independent Sync processes {pair:.0f}" if pair else ""
        print(
            f"{'':33s}CPU us/frame: sync {sync:.0f}, async worker {row.cpu['async']:.0f} "
            f"({row.cpu['async'] / sync:.2f}x), multisync workers {row.cpu['multisync']:.0f}"
            + both,
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds (best kept)")
    parser.add_argument("--batches", type=int, default=8, help="timed batches per measurement")
    parser.add_argument("--actor", choices=["module", "td", "both"], default="both")
    parser.add_argument("--fpb", type=int, nargs="+", default=[512, 1024], help="per worker")
    parser.add_argument(
        "--no-reference", action="store_true", help="skip the two-independent-processes column"
    )
    args = parser.parse_args()
    kinds = ["module", "td"] if args.actor == "both" else [args.actor]
    rows = [Row(kind, fpb) for kind in kinds for fpb in args.fpb]
    for _ in range(args.repeats):
        for row in rows:
            run_round(row, args.batches, not args.no_reference)
    for row in rows:
        report(row)


if __name__ == "__main__":
    main()
