"""DistributedDataCollector (launcher "mp", gloo) against local collectors and raw
torch.distributed, same run.

CartPole-v1, the 2x64 MLP actor sampling one-hot actions from OneHotCategorical, 2 collector
ranks of one env each. Three parts (``--only`` picks some):

* collect: frames/s of ``DistributedDataCollector(sync=False)`` against
  ``MultiaSyncDataCollector`` with 2 workers (``--fpb`` frames per yielded batch of one rank),
  and of ``sync=True`` against ``MultiSyncDataCollector`` with 2 workers (``2 * --fpb`` frames
  per yielded batch); each measurement starts after a first batch (start-up excluded). Also the
  distributed collector's start-up: construction until it returns.
* transport: batches/s through the collector's receive path (a ``RankChannel`` that announced a
  batch layout, receiving ``BATCH`` messages into that layout's views) against a raw
  ``dist.send``/``dist.recv`` of the same bytes between the same two processes, for a real
  CartPole batch of ``--transport-frames`` frames and an image batch (uint8 observations
  ``[256, 3, 84, 84]``). This process receives (as rank 0 does); a spawned one sends each loop
  once this one is ready for it, so no loop's messages queue up while another is timed.
* weights: ``update_policy_weights_()`` of a ~1M-parameter policy (MLP 4 -> ``--width`` ->
  ``--width`` -> 2) to 2 ranks, against one ``dist.broadcast`` of the same flat float32 tensor
  among 3 processes; median ms, timed on rank 0 with the receivers waiting. For reference also
  the broadcast until both receivers acknowledged it (a ``dist.send`` of one float each), an
  upper bound: ``update_policy_weights_`` returns once the broadcast is sent (ranks load the
  weights before their next batch; their acknowledgements are taken later).

The kinds take turns within each repeat; the best of ``--repeats`` is kept.

    python benchmarks/distributed_throughput.py
    python benchmarks/distributed_throughput.py --only transport weights --repeats 5

Targets (issue 8): collect >= 0.8x the local collector (each mode), start-up < 5 s; transport
>= 0.8x raw (both batches); weight update <= 1.5x one broadcast.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from _common import Actor, cartpole
from tensordict import TensorDict, TensorDictBase
from torch import nn

from hpccollect import (
    DistributedDataCollector,
    MultiaSyncDataCollector,
    MultiSyncDataCollector,
    SyncDataCollector,
)
from hpccollect.protocol import Command, Layout, Reply, message
from hpccollect.transport.batches import FlatLayout
from hpccollect.transport.control import ControlListener, connect
from hpccollect.transport.groups import RankGroups, open_store
from hpccollect.transport.rank_channel import RankChannel

HOST = "127.0.0.1"
TARGETS = {"collect": 0.8, "startup_s": 5.0, "transport": 0.8, "weights": 1.5}


def best(results: dict[str, float], name: str, value: float, low: bool = False) -> None:
    """Keep the best ``value`` under ``name`` (the highest, or the lowest with ``low``)."""
    old = results.get(name)
    if old is None or (value < old if low else value > old):
        results[name] = value


def verdict(ok: bool) -> str:
    return "meets" if ok else "BELOW"


def join_all(procs: list[Any], timeout: float) -> None:
    """Wait for ``procs`` to end (bounded); kill those that do not."""
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(5)


def init_default_group(store: Any, rank: int, world_size: int, timeout: float) -> None:
    """torch's default gloo group over ``store`` (apart from the collector's own groups)."""
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore("bench/raw", store),
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout),
    )


# ---------------------------------------------------------------------- collect
def frames_per_s(collector: Any, frames: int) -> float:
    """frames/s over at least ``frames`` frames after a first batch; shuts the collector down."""
    try:
        it = iter(collector)
        next(it)
        n, start = 0, time.perf_counter()
        while n < frames:
            n += next(it).numel()
        return n / (time.perf_counter() - start)
    finally:
        collector.shutdown()


def distributed(sync: bool, frames_per_batch: int, policy: nn.Module) -> tuple[Any, float]:
    """A DistributedDataCollector with 2 ranks of one CartPole each, and its start-up in s."""
    start = time.perf_counter()
    collector = DistributedDataCollector(
        [cartpole] * 2,
        policy,
        frames_per_batch=frames_per_batch,
        sync=sync,
        launcher="mp",
        backend="gloo",
    )
    return collector, time.perf_counter() - start


def collect(args: argparse.Namespace) -> None:
    fpb, frames = args.fpb, args.frames
    rates: dict[str, float] = {}
    startups: list[float] = []
    for _ in range(args.repeats):
        local = MultiaSyncDataCollector([cartpole] * 2, Actor(), frames_per_batch=fpb)
        best(rates, "multiasync", frames_per_s(local, frames))
        collector, startup = distributed(False, fpb, Actor())
        startups.append(startup)
        best(rates, "dist async", frames_per_s(collector, frames))
        local = MultiSyncDataCollector([cartpole] * 2, Actor(), frames_per_batch=2 * fpb)
        best(rates, "multisync", frames_per_s(local, frames))
        collector, startup = distributed(True, 2 * fpb, Actor())
        startups.append(startup)
        best(rates, "dist sync", frames_per_s(collector, frames))
    print(f"collect: CartPole-v1, 2 workers/ranks x 1 env, {frames} frames per measurement")
    for dist_name, local_name, batch in (
        ("dist async", "multiasync", f"{fpb} frames per batch (one rank's)"),
        ("dist sync", "multisync", f"{2 * fpb} frames per batch (both ranks)"),
    ):
        ratio = rates[dist_name] / rates[local_name]
        print(
            f"  {dist_name:10s} {rates[dist_name]:7.0f} f/s  {local_name:10s} "
            f"{rates[local_name]:7.0f} f/s  {ratio:.2f}x "
            f"({verdict(ratio >= TARGETS['collect'])} {TARGETS['collect']}x)  [{batch}]"
        )
    worst = max(startups)
    print(
        f"  start-up (construction until it returns): worst {worst:.2f} s, best "
        f"{min(startups):.2f} s of {len(startups)} ({verdict(worst < TARGETS['startup_s'])} "
        f"< {TARGETS['startup_s']:g} s)"
    )


# ---------------------------------------------------------------------- transport
def cartpole_batch(frames: int) -> TensorDictBase:
    """One real batch of ``frames`` frames from a SyncDataCollector (its layout is the one a
    CartPole rank announces)."""
    collector = SyncDataCollector(cartpole, Actor(), frames_per_batch=frames)
    try:
        return next(iter(collector)).clone()
    finally:
        collector.shutdown()


def image_batch(frames: int = 256) -> TensorDictBase:
    """``frames`` frames of uint8 [3, 84, 84] observations, with reward and done flags."""

    def pixels() -> torch.Tensor:
        return torch.randint(0, 256, (frames, 3, 84, 84), dtype=torch.uint8)

    def flag() -> torch.Tensor:
        return torch.rand(frames, 1) < 0.01

    return TensorDict(
        {
            "observation": pixels(),
            "action": torch.randint(0, 6, (frames,)),
            "done": flag(),
            "next": {
                "observation": pixels(),
                "reward": torch.randn(frames, 1),
                "done": flag(),
                "terminated": flag(),
                "truncated": flag(),
            },
        },
        batch_size=[frames],
    )


def order(repeat: int) -> tuple[str, str]:
    """Which loop goes first in a repeat: they alternate, so neither always runs first."""
    return ("raw", "channel") if repeat % 2 == 0 else ("channel", "raw")


def go_key(kind: str, repeat: int, name: str) -> str:
    """The store key rank 0 sets when it starts receiving a loop: the sender waits for it, so
    no loop's messages are sent (and buffered on the way) while rank 0 still times another."""
    return f"bench/go/{kind}/{repeat}/{name}"


def checksum(batch: TensorDictBase) -> float:
    return sum(leaf.double().sum().item() for leaf in FlatLayout.of(batch).leaves(batch))


def _send_kind(channel: RankChannel, store: Any, kind: str, count: int, args: tuple) -> None:
    """Rank 1's side for one batch kind: announce its layout, then per repeat ``count + 1`` raw
    sends and ``count + 1`` channel sends, in ``order`` (the first of each is the receiver's
    warm-up)."""
    repeats, frames, timeout = args
    made = cartpole_batch(frames) if kind == "cartpole" else image_batch()
    batch = channel.batch_buffers(made).update_(made)  # where a rank's collector writes
    store.set(f"bench/sum/{kind}", repr(checksum(batch)))
    channel.send(message(Reply.LAYOUT, Layout(batch, socket.gethostname(), os.getpid())))
    raw = torch.ones(FlatLayout.of(batch).nbytes, dtype=torch.uint8)
    steps = {
        "raw": lambda: dist.send(raw, 0),
        "channel": lambda: channel.send(message(Reply.BATCH, batch.numel())),
    }
    for repeat in range(repeats):
        for name in order(repeat):
            store.wait([go_key(kind, repeat, name)], datetime.timedelta(seconds=timeout))
            for _ in range(count + 1):
                steps[name]()
    # the receiver reads the last batch before the next message reuses its buffer
    store.wait([f"bench/checked/{kind}"], datetime.timedelta(seconds=timeout))


def _transport_sender(
    port: int, plan: list[tuple[str, int]], repeats: int, frames: int, timeout: float
) -> None:
    """Rank 1 of the transport part: sends every batch kind of ``plan``, then stops."""
    torch.set_num_threads(1)
    store = open_store(HOST, port, 2, False, timeout)
    link = connect_link(store, 1, timeout)
    groups = RankGroups.open("gloo", store, 1, 2)
    init_default_group(store, 1, 2, timeout)
    channel = groups.channel(0, link, send_timeout=timeout)
    channel.start_reading()
    try:
        for kind, count in plan:
            _send_kind(channel, store, kind, count, (repeats, frames, timeout))
        channel.send(message(Command.SHUTDOWN, True))
        expect(channel, Command.SHUTDOWN, timeout)
    finally:
        groups.close()
        channel.close()
        dist.destroy_process_group()


#: where rank 0 of the transport part publishes its control listener's port and token
CONTROL_KEY = "bench/control"


def connect_link(store: Any, rank: int, timeout: float) -> Any:
    """Rank ``rank``'s control connection to rank 0, whose port and token are in ``store``."""
    port, token = store.get(CONTROL_KEY).decode().split()
    return connect((HOST, int(port)), rank, bytes.fromhex(token), timeout, None)


def expect(channel: RankChannel, kind: Any, timeout: float, peer: Any = None) -> Any:
    """The payload of the next message, which must be ``kind``; bounded by ``timeout``, and
    failing at once if ``peer`` (a process) ends. A message already there costs one poll: the
    harness adds no time of its own to what is measured."""
    if not channel.poll(min(1.0, timeout)):
        deadline = time.monotonic() + timeout
        while not channel.poll(min(1.0, max(0.0, deadline - time.monotonic()))):
            if peer is not None and peer.exitcode is not None:
                raise RuntimeError(f"the sending process ended (exit code {peer.exitcode})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {kind.name} message within {timeout:g} s")
    got, payload = channel.recv()
    if got is not kind:
        raise RuntimeError(f"expected {kind.name}, got {got.name}")
    return payload


def timed(step: Callable[[], Any], count: int) -> float:
    """Calls per second of ``step`` over ``count`` calls after a first (excluded) one."""
    step()
    start = time.perf_counter()
    for _ in range(count):
        step()
    return count / (time.perf_counter() - start)


def _receive_kind(
    channel: RankChannel, store: Any, kind: str, count: int, args: Any, peer: Any
) -> dict[str, float]:
    """Rank 0's side for one batch kind: batches/s raw and through the channel, best of the
    repeats; checks that the channel's last batch is the one sent."""
    layout = expect(channel, Reply.LAYOUT, args.timeout, peer)
    nbytes = FlatLayout.of(layout.batch).nbytes
    raw = torch.empty(nbytes, dtype=torch.uint8)
    rates: dict[str, float] = {"bytes": nbytes}
    steps = {
        "raw": lambda: dist.recv(raw, 1),
        "channel": lambda: expect(channel, Reply.BATCH, args.timeout, peer),
    }
    for repeat in range(args.repeats):
        for name in order(repeat):
            store.set(go_key(kind, repeat, name), "1")
            best(rates, name, timed(steps[name], count))
    sent = float(store.get(f"bench/sum/{kind}").decode())
    if abs(checksum(layout.batch) - sent) > 1e-6 * max(1.0, abs(sent)):
        raise RuntimeError(f"the {kind} batch that arrived is not the one sent")
    store.set(f"bench/checked/{kind}", "1")
    return rates


def transport(args: argparse.Namespace) -> None:
    plan = [("cartpole", args.batches), ("image", args.image_batches)]
    store = open_store(HOST, 0, 2, True, args.timeout)
    ctx = mp.get_context("spawn")
    sender = ctx.Process(
        target=_transport_sender,
        args=(store.port, plan, args.repeats, args.transport_frames, args.timeout),
        daemon=True,
    )
    sender.start()
    groups = channel = None
    listener = ControlListener(HOST)
    store.set(CONTROL_KEY, f"{listener.address[1]} {listener.token.hex()}")
    try:
        link = listener.accept([1], args.timeout)[1]
        groups = RankGroups.open("gloo", store, 0, 2)
        init_default_group(store, 0, 2, args.timeout)
        channel = groups.channel(1, link, send_timeout=args.timeout)
        results = {kind: _receive_kind(channel, store, kind, n, args, sender) for kind, n in plan}
        expect(channel, Command.SHUTDOWN, args.timeout, sender)
        channel.send(message(Command.SHUTDOWN, True))
    finally:
        listener.close()
        join_all([sender], 30)
        if groups is not None:
            groups.close()
        if channel is not None:
            channel.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    names = {"cartpole": f"CartPole {args.transport_frames} frames", "image": "image [256,3,84,84]"}
    print("transport: one batch rank 1 -> rank 0 (gloo, loopback), batches/s and MB/s")
    for kind, count in plan:
        r = results[kind]
        mb = r["bytes"] / 1e6
        ratio = r["channel"] / r["raw"]
        print(
            f"  {names[kind]:22s} {mb:7.3f} MB  raw {r['raw']:8.1f}/s {r['raw'] * mb:7.0f} MB/s  "
            f"channel {r['channel']:8.1f}/s {r['channel'] * mb:7.0f} MB/s  {ratio:.2f}x "
            f"({verdict(ratio >= TARGETS['transport'])} {TARGETS['transport']}x)  [{count} batches]"
        )


# ---------------------------------------------------------------------- weights
def big_actor(width: int) -> Actor:
    """The benchmarks' actor with a 4 -> width -> width -> 2 MLP (~1M parameters at 1000)."""
    actor = Actor()
    actor.net = nn.Sequential(
        nn.Linear(4, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 2)
    )
    return actor


def _broadcast_receiver(rank: int, port: int, numel: int, count: int, timeout: float) -> None:
    """Ranks 1 and 2 of the baseline: receive each broadcast, then acknowledge it."""
    torch.set_num_threads(1)
    store = open_store(HOST, port, 3, False, timeout)
    init_default_group(store, rank, 3, timeout)
    try:
        buf, ack = torch.empty(numel), torch.zeros(1)
        for _ in range(count + 1):
            dist.broadcast(buf, 0)
            dist.send(ack, 0)
    finally:
        dist.destroy_process_group()


def broadcast_ms(numel: int, count: int, timeout: float) -> tuple[float, float]:
    """Median ms of one ``dist.broadcast`` of ``numel`` float32 from rank 0 to 2 processes, and
    of that broadcast until both acknowledged it (after a first, excluded one)."""
    store = open_store(HOST, 0, 3, True, timeout)
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(
            target=_broadcast_receiver, args=(r, store.port, numel, count, timeout), daemon=True
        )
        for r in (1, 2)
    ]
    for p in procs:
        p.start()
    try:
        init_default_group(store, 0, 3, timeout)
        flat, ack = torch.randn(numel), torch.zeros(1)
        sent, acked = [], []
        for _ in range(count + 1):
            start = time.perf_counter()
            dist.broadcast(flat, 0)
            sent.append(time.perf_counter() - start)
            for r in (1, 2):
                dist.recv(ack, r)
            acked.append(time.perf_counter() - start)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        join_all(procs, 30)
    return 1e3 * statistics.median(sent[1:]), 1e3 * statistics.median(acked[1:])


def update_ms(width: int, count: int) -> float:
    """Median ms of ``update_policy_weights_()`` to 2 idle ranks (after a first, excluded one)."""
    actor = big_actor(width)
    collector, _ = distributed(True, 128, actor)
    try:
        times = []
        for _ in range(count + 1):
            start = time.perf_counter()
            collector.update_policy_weights_()
            times.append(time.perf_counter() - start)
        if collector.policy_versions != [count + 1] * 2:
            raise RuntimeError(f"weights not delivered: versions {collector.policy_versions}")
    finally:
        collector.shutdown()
    return 1e3 * statistics.median(times[1:])


def weights(args: argparse.Namespace) -> None:
    numel = sum(p.numel() for p in big_actor(args.width).parameters())
    ms: dict[str, float] = {}
    for _ in range(args.repeats):
        sent, acked = broadcast_ms(numel, args.updates, args.timeout)
        best(ms, "broadcast", sent, low=True)
        best(ms, "acked", acked, low=True)
        best(ms, "update", update_ms(args.width, args.updates), low=True)
    ratio = ms["update"] / ms["broadcast"]
    print(
        f"weights: {numel} float32 parameters ({4 * numel / 1e6:.1f} MB) to 2 ranks, median of "
        f"{args.updates}\n  update_policy_weights_ {ms['update']:7.2f} ms  dist.broadcast "
        f"{ms['broadcast']:7.2f} ms  {ratio:.2f}x ({verdict(ratio <= TARGETS['weights'])} "
        f"<= {TARGETS['weights']}x)\n  [dist.broadcast until both ranks acknowledged "
        f"(for reference): {ms['acked']:.2f} ms, update "
        f"{ms['update'] / ms['acked']:.2f}x that]"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=["collect", "transport", "weights"])
    parser.add_argument("--repeats", type=int, default=2, help="rounds (best kept)")
    parser.add_argument("--frames", type=int, default=8192, help="frames per collect measurement")
    parser.add_argument("--fpb", type=int, default=1024, help="frames per batch of one rank")
    parser.add_argument("--transport-frames", type=int, default=1024, help="CartPole batch size")
    parser.add_argument("--batches", type=int, default=200, help="timed CartPole batches")
    parser.add_argument("--image-batches", type=int, default=20, help="timed image batches")
    parser.add_argument("--width", type=int, default=1000, help="hidden width of the big policy")
    parser.add_argument("--updates", type=int, default=20, help="timed weight updates")
    parser.add_argument("--timeout", type=float, default=120.0, help="s any one wait may take")
    args = parser.parse_args()
    torch.set_num_threads(1)
    parts = {"collect": collect, "transport": transport, "weights": weights}
    for name in args.only or parts:
        parts[name](args)


if __name__ == "__main__":
    main()
