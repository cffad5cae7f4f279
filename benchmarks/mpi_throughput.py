"""The MPI side of the distributed collector under ``mpiexec``: the mpi4py transport against raw
mpi4py and gloo, ``launcher="mpi"`` against one-process collectors, and weak scaling.

CartPole-v1, the 2x64 MLP actor sampling one-hot actions from OneHotCategorical. Run under
``mpiexec -n 3`` (rank 0 and 2 collector ranks); ``--only`` picks parts:

* transport: batches/s through ``RankChannel``'s receive path (a channel that announced a batch
  layout, receiving ``BATCH`` messages into that layout's views) over ``backend="mpi"`` (the
  mpi4py ``MPIGroup``), against a raw blocking ``comm.Send``/``comm.Recv`` of the same bytes
  (numpy views; MPICH's blocking ``Recv`` spins, so this is the ceiling) and against the same
  channel over gloo (torch groups over a TCPStore on loopback), for a real CartPole batch of
  ``--transport-frames`` frames and an image batch (uint8 ``[256, 3, 84, 84]``). MPI rank 1
  sends, rank 0 receives (as rank 0 does in a job), each loop once rank 0 is ready for it;
  other ranks wait without spinning.
* collect: frames/s of ``DistributedDataCollector(launcher="mpi", sync=False)`` with one
  CartPole per collector rank, for ``backend="mpi"`` and ``"gloo"``, against
  ``MultiaSyncDataCollector`` with as many workers (one CartPole each) in rank 0's process
  (``--fpb`` frames per batch of one rank or worker; each measurement starts after a first
  batch), and the collector's start-up on rank 0 (construction until it returns). The local
  reference runs while the collector ranks wait for rank 0's start (sleeping, not spinning);
  they serve each collector rank 0 constructs through ``hpccollect.distributed.serve``.
* weak scaling (``--scaling 1 2``, run WITHOUT mpiexec): runs the collect part under
  ``mpiexec -n k+1`` for each k collector ranks and prints frames/s in total and per rank.

The kinds take turns within each repeat; the best of ``--repeats`` is kept.

    mpiexec -n 3 python benchmarks/mpi_throughput.py
    mpiexec -n 3 python benchmarks/mpi_throughput.py --only transport --repeats 5
    python benchmarks/mpi_throughput.py --scaling 1 2

Targets (issue 9): the mpi transport >= 0.8x raw mpi4py and faster than gloo (both batches);
collect >= 0.8x the one-process collector (issue 8's start-up < 5 s kept).
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any

import torch
from _common import Actor, cartpole
from distributed_throughput import (
    best,
    cartpole_batch,
    checksum,
    expect,
    frames_per_s,
    go_key,
    image_batch,
    timed,
    verdict,
)

from hpccollect import DistributedDataCollector, MultiaSyncDataCollector
from hpccollect.distributed import serve
from hpccollect.launchers.rendezvous import on_one_node, share_from_root
from hpccollect.protocol import Command, Layout, Reply, message
from hpccollect.transport.base import wait_request
from hpccollect.transport.batches import FlatLayout
from hpccollect.transport.control import ControlListener, connect
from hpccollect.transport.groups import RankGroups, open_store
from hpccollect.transport.mpi4py_group import mpi4py_comm
from hpccollect.transport.rank_channel import RankChannel

HOST = "127.0.0.1"
TARGETS = {"collect": 0.8, "startup_s": 5.0, "transport": 0.8}
#: raw mpi4py, the mpi4py transport itself (``MPIGroup``), RankChannel over it, and over gloo
KINDS = ("raw", "group", "mpi", "gloo")
RAW_TAG = 7


def turn(names: tuple[str, ...], repeat: int) -> tuple[str, ...]:
    """``names`` rotated by ``repeat``: within a repeat each goes first in turn."""
    k = repeat % len(names)
    return names[k:] + names[:k]


def idle_barrier(comm: Any, timeout: float) -> None:
    """A barrier whose wait sleeps (MPICH's blocking one would spin a core all along)."""
    request = comm.Ibarrier()
    wait_request(request.Test, timeout, "the barrier", max_sleep=0.02)


# ---------------------------------------------------------------------- transport
def _send_kind(
    channels: dict, group: Any, raw: Any, store: Any, kind: str, count: int, args: Any
) -> None:
    """Rank 1's side for one batch kind: announce the layout on both channels, then per repeat
    ``count + 1`` sends of each kind, in ``turn`` (the first of each is the receiver's
    warm-up)."""
    timeout = datetime.timedelta(seconds=args.timeout)
    made = cartpole_batch(args.transport_frames) if kind == "cartpole" else image_batch()
    store.set(f"bench/sum/{kind}", repr(checksum(made)))
    for channel in channels.values():
        batch = channel.batch_buffers(made).update_(made)  # where a rank's collector writes
        channel.send(message(Reply.LAYOUT, Layout(batch, "bench", os.getpid())))
    flat, views = FlatLayout.of(made).allocate()
    views.update_(made)
    raw_bytes = flat.numpy()
    batch = message(Reply.BATCH, made.numel())  # made once, as the raw loop's arguments are
    mpi, gloo = channels["mpi"], channels["gloo"]
    wait = datetime.timedelta(seconds=args.timeout)
    steps = {
        "raw": lambda: raw.Send(raw_bytes, 0, RAW_TAG),
        "group": lambda: group.send([flat], 0, RAW_TAG).wait(wait),
        "mpi": lambda: mpi.send(batch),
        "gloo": lambda: gloo.send(batch),
    }
    for repeat in range(args.repeats):
        for name in turn(KINDS, repeat):
            store.wait([go_key(kind, repeat, name)], timeout)
            for _ in range(count + 1):
                steps[name]()
    # the receiver reads the last batches before the next layout message reuses their buffers
    store.wait([f"bench/checked/{kind}"], timeout)


def _receive_kind(
    channels: dict, group: Any, raw: Any, store: Any, kind: str, count: int, args: Any
) -> dict:
    """Rank 0's side for one batch kind: batches/s of each kind, best of the repeats; checks
    that each channel's last batch is the one sent."""
    layouts = {name: expect(ch, Reply.LAYOUT, args.timeout) for name, ch in channels.items()}
    nbytes = FlatLayout.of(layouts["mpi"].batch).nbytes
    raw_bytes = torch.empty(nbytes, dtype=torch.uint8).numpy()
    into = torch.empty(nbytes, dtype=torch.uint8)
    rates: dict[str, float] = {"bytes": nbytes}
    wait = datetime.timedelta(seconds=args.timeout)

    def group_recv() -> None:
        group.recv([into], 1, RAW_TAG).wait(wait)

    mpi, gloo, kind_, timeout = channels["mpi"], channels["gloo"], Reply.BATCH, args.timeout
    steps = {
        "raw": lambda: raw.Recv(raw_bytes, 1, RAW_TAG),
        "group": group_recv,
        "mpi": lambda: expect(mpi, kind_, timeout),
        "gloo": lambda: expect(gloo, kind_, timeout),
    }
    for repeat in range(args.repeats):
        for name in turn(KINDS, repeat):
            store.set(go_key(kind, repeat, name), "1")
            best(rates, name, timed(steps[name], count))
    sent = float(store.get(f"bench/sum/{kind}").decode())
    for name, layout in layouts.items():
        if abs(checksum(layout.batch) - sent) > 1e-6 * max(1.0, abs(sent)):
            raise RuntimeError(f"the {kind} batch that arrived over {name} is not the one sent")
    store.set(f"bench/checked/{kind}", "1")
    return rates


def _open_transport(comm: Any, timeout: float) -> tuple[Any, dict[str, RankGroups]]:
    """The store (rank 0 hosts it) and every rank's groups over both backends."""
    rank, size = comm.Get_rank(), comm.Get_size()
    store = open_store(HOST, 0, size, True, timeout) if rank == 0 else None
    port = share_from_root(comm, store.port if rank == 0 else None, timeout)
    if rank != 0:
        store = open_store(HOST, port, size, False, timeout)
    groups = {b: RankGroups.open(b, store, rank, size) for b in ("mpi", "gloo")}
    return store, groups


def _links(comm: Any, timeout: float) -> dict[str, Any]:
    """Ranks 0 and 1's control connections, one per backend (rank 0 listens, rank 1
    connects; the others hold none)."""
    rank = comm.Get_rank()
    listeners = {b: ControlListener(HOST) for b in ("mpi", "gloo")} if rank == 0 else {}
    where = {b: (lis.address, lis.token) for b, lis in listeners.items()}
    where = share_from_root(comm, where if rank == 0 else None, timeout)
    links: dict[str, Any] = {}
    if rank == 1:
        links = {
            b: connect(address, 1, token, timeout, None) for b, (address, token) in where.items()
        }
    elif rank == 0:
        links = {b: lis.accept([1], timeout)[1] for b, lis in listeners.items()}
        for lis in listeners.values():
            lis.close()
    return links


def transport(comm: Any, args: argparse.Namespace) -> None:
    rank = comm.Get_rank()
    plan = [("cartpole", args.batches), ("image", args.image_batches)]
    raw = comm.Dup()
    store, groups = _open_transport(comm, args.timeout)
    group = groups["mpi"].messages  # the mpi4py transport the channel runs over
    channels: dict[str, RankChannel] = {}
    results: dict[str, dict] = {}
    try:
        links = _links(comm, args.timeout)
        if rank in (0, 1):
            peer = 1 - rank
            channels = {
                b: g.channel(peer, links[b], send_timeout=args.timeout) for b, g in groups.items()
            }
            if rank == 1:
                for channel in channels.values():
                    channel.start_reading()
        if rank == 1:
            for kind, count in plan:
                _send_kind(channels, group, raw, store, kind, count, args)
            for channel in channels.values():
                channel.send(message(Command.SHUTDOWN, True))
                expect(channel, Command.SHUTDOWN, args.timeout)
        elif rank == 0:
            results = {k: _receive_kind(channels, group, raw, store, k, n, args) for k, n in plan}
            for channel in channels.values():
                expect(channel, Command.SHUTDOWN, args.timeout)
                channel.send(message(Command.SHUTDOWN, True))
        idle_barrier(raw, args.timeout)  # ranks 2.. wait here all along
    finally:
        for g in groups.values():
            g.close()
        for channel in channels.values():
            channel.close()
            channel.join_threads(5.0)
        raw.Free()
    if rank == 0:
        _print_transport(results, plan, args)


def _print_transport(results: dict, plan: list, args: argparse.Namespace) -> None:
    names = {"cartpole": f"CartPole {args.transport_frames} frames", "image": "image [256,3,84,84]"}
    goal = TARGETS["transport"]
    print(
        "transport: one batch MPI rank 1 -> rank 0, batches/s (MB/s); the mpi4py transport is\n"
        "  MPIGroup.send/recv, the channel is RankChannel (the protocol) over it"
    )
    for kind, count in plan:
        r = results[kind]
        mb = r["bytes"] / 1e6
        group_raw, vs_raw, vs_gloo = (
            r["group"] / r["raw"],
            r["mpi"] / r["raw"],
            r["mpi"] / r["gloo"],
        )
        print(
            f"  {names[kind]:22s} {mb:7.3f} MB [{count} batches]\n"
            + "".join(
                f"    {n:18s} {r[k]:9.1f}/s ({r[k] * mb:6.0f} MB/s)\n"
                for n, k in (
                    ("raw mpi4py Recv", "raw"),
                    ("mpi4py transport", "group"),
                    ("channel over mpi", "mpi"),
                    ("channel over gloo", "gloo"),
                )
            )
            + f"    transport/raw {group_raw:.2f}x ({verdict(group_raw >= goal)} {goal}x)  "
            f"channel/raw {vs_raw:.2f}x ({verdict(vs_raw >= goal)} {goal}x)  channel mpi/gloo "
            f"{vs_gloo:.2f}x ({verdict(vs_gloo > 1.0)} > 1x)"
        )


# ---------------------------------------------------------------------- collect
def _distributed(comm: Any, backend: str, args: argparse.Namespace) -> tuple[float, float]:
    """On rank 0: (frames/s, start-up s) of the distributed collector over ``backend``; on the
    other ranks: serve it."""
    if comm.Get_rank() != 0:
        serve(args.timeout, comm)
        return 0.0, 0.0
    start = time.perf_counter()
    collector = DistributedDataCollector(
        cartpole,
        Actor(),
        frames_per_batch=args.fpb,
        sync=False,
        launcher="mpi",
        backend=backend,
        start_timeout=args.timeout,
    )
    startup = time.perf_counter() - start
    return frames_per_s(collector, args.frames), startup


def collect(comm: Any, args: argparse.Namespace) -> None:
    rank, ranks = comm.Get_rank(), comm.Get_size() - 1
    rates: dict[str, float] = {}
    startups: dict[str, list[float]] = {b: [] for b in args.backends}
    for repeat in range(args.repeats):
        if rank == 0:  # the collector ranks wait in serve() meanwhile
            local = MultiaSyncDataCollector([cartpole] * ranks, Actor(), frames_per_batch=args.fpb)
            best(rates, "local", frames_per_s(local, args.frames))
        for backend in turn(tuple(args.backends), repeat):
            rate, startup = _distributed(comm, backend, args)
            best(rates, backend, rate)
            startups[backend].append(startup)
    if rank != 0:
        return
    cores = os.cpu_count()
    print(
        f"collect: CartPole-v1, {ranks} collector rank{'s' * (ranks > 1)} x 1 env under mpiexec -n {ranks + 1}, "
        f"sync=False, {args.fpb} frames per rank's batch, {args.frames} frames per measurement\n"
        f"  ({cores} cores here: {ranks + 1} busy processes"
        f"{' oversubscribe them' if ranks + 1 > (cores or 1) else ''}; the reference has as many;"
        " start-up: the ranks already run, imports done)"
    )
    goal = TARGETS["collect"]
    for backend in args.backends:
        ratio = rates[backend] / rates["local"]
        up = startups[backend]
        print(
            f"  launcher=mpi backend={backend:4s} {rates[backend]:7.0f} f/s "
            f"({rates[backend] / ranks:6.0f} per rank)  MultiaSync({ranks} workers) "
            f"{rates['local']:7.0f} f/s  {ratio:.2f}x ({verdict(ratio >= goal)} {goal}x)  "
            f"start-up {min(up):.2f}-{max(up):.2f} s "
            f"({verdict(max(up) < TARGETS['startup_s'])} < {TARGETS['startup_s']:g} s)"
        )
        if args.scaling_child:
            print(f"SCALING {backend} {ranks} {rates[backend]:.1f}")


# ---------------------------------------------------------------------- weak scaling
def scaling(args: argparse.Namespace) -> None:
    """Run the collect part under ``mpiexec -n k+1`` for each k of ``args.scaling``."""
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or "mpiexec"
    rates: dict[tuple[str, int], float] = {}
    for k in args.scaling:
        cmd = [
            mpiexec, "-n", str(k + 1), sys.executable, os.path.abspath(__file__), "--only",
            "collect", "--scaling-child", "--repeats", str(args.repeats), "--frames",
            str(args.frames), "--fpb", str(args.fpb), "--timeout", str(args.timeout),
            "--backends", *args.backends,
        ]  # fmt: skip
        print("$", " ".join([*cmd[:3], "python", "mpi_throughput.py", *cmd[5:]]), flush=True)
        job = subprocess.run(cmd, capture_output=True, text=True, timeout=20 * args.timeout)
        sys.stdout.write(re.sub(r"^SCALING .*\n", "", job.stdout, flags=re.M))
        if job.returncode != 0:
            sys.exit(f"mpiexec -n {k + 1} failed ({job.returncode}):\n{job.stderr[-3000:]}")
        for backend, ranks, rate in re.findall(r"^SCALING (\w+) (\d+) ([\d.]+)$", job.stdout, re.M):
            rates[backend, int(ranks)] = float(rate)
    first = args.scaling[0]
    print(f"weak scaling (1 CartPole per rank; {os.cpu_count()} cores: more busy processes than "
          "that oversubscribe them):")  # fmt: skip
    for backend in args.backends:
        base = rates[backend, first] / first
        for k in args.scaling:
            per = rates[backend, k] / k
            print(
                f"  backend={backend:4s} {k} collector rank{'s' * (k > 1)}: "
                f"{rates[backend, k]:7.0f} f/s, "
                f"{per:6.0f} per rank ({per / base:.2f}x of {first} rank{'s' * (first > 1)})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=["transport", "collect"])
    parser.add_argument("--backends", nargs="+", choices=["mpi", "gloo"], default=["mpi", "gloo"])
    parser.add_argument("--repeats", type=int, default=2, help="rounds (best kept)")
    parser.add_argument("--frames", type=int, default=8192, help="frames per collect measurement")
    parser.add_argument("--fpb", type=int, default=1024, help="frames per batch of one rank")
    parser.add_argument("--transport-frames", type=int, default=1024, help="CartPole batch size")
    parser.add_argument("--batches", type=int, default=500, help="timed CartPole batches")
    parser.add_argument("--image-batches", type=int, default=30, help="timed image batches")
    parser.add_argument("--timeout", type=float, default=120.0, help="s any one wait may take")
    parser.add_argument(
        "--scaling", nargs="+", type=int, metavar="K", help="collector ranks per job (no mpiexec)"
    )
    parser.add_argument("--scaling-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    under_mpi = any(
        os.environ.get(v, "1") not in ("", "0", "1") for v in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
    )
    if args.scaling:
        if under_mpi:
            parser.error("--scaling starts its own mpiexec jobs: run it without mpiexec")
        if min(args.scaling) < 1:
            parser.error("--scaling: each number of collector ranks must be >= 1")
        scaling(args)
        return
    if not under_mpi:
        parser.error("run under mpiexec -n 3 (rank 0 and 2 collector ranks), or pass --scaling")
    torch.set_num_threads(1)
    comm = mpi4py_comm(on_one_node())
    parts = {"transport": transport, "collect": collect}
    for name in args.only or parts:
        parts[name](comm, args)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
