"""Rank 0's ingest against its transport's: the collector's cost per batch on rank 0 against a
bare receive of the same bytes through the same transport, same run (issue 28, part 2).

For each batch kind (CartPole: ``--fpb`` frames of the usual keys; image: 64 frames of uint8
``[3, 84, 84]`` observations), each transport and each rank count:

* **collector**: ``DistributedDataCollector(sync=False, total_frames=-1)`` whose ranks hand a
  pre-made batch again at once (``scale.py``'s ``Premade``), so rank 0 is the bottleneck. gloo
  runs with ``launcher="mp"``; the mpi4py transport (``backend="mpi"``) under
  ``mpiexec -n k+1``. Measured over ``--seconds`` after the first batch.
* **bare transport**: ``mpiexec -n k+1`` processes whose ranks 1..k send a flat buffer of the
  batch's bytes to rank 0 as fast as it takes them, and rank 0 receives them into one buffer:
  ``Comm.Recv`` from any rank with the mpi4py transport, ``dist.recv`` from each rank in turn
  over a gloo group (gloo's receive from any rank stalled for good in some runs of 32 image
  senders). No header, no TensorDict, no request per batch: the floor of what rank 0 can do.
* **bare with asks** (``bare_ask``): the same, but rank 0 answers each batch with a 64-byte ask
  and a rank sends its next batch only once asked, as the collector's ranks do (one batch in
  flight per rank: TorchRL's semantics, where a rank's next batch is collected with the weights
  of after the yield). The floor of that protocol; ``ratio_ask`` is the collector's CPU time
  over it, what Python costs beyond the messages themselves.
* **bare with asks and the batch** (``bare_yield``, CartPole only): the same again, and rank 0
  makes the TensorDict it would yield from each message, as the collector does for a small
  batch (``FlatLayout.own``: each leaf copied out, the nesting assembled without tensordict's
  checks; the message is the layout's bytes, its leaves aligned). ``ratio_floor`` is it over
  the bare receive. ``bare_nest`` (``ratio_nest``) is the least: the TensorDict only assembled
  over leaves made once, no byte copied (a batch the next message overwrites, which no
  collector may yield). TorchRL's semantics ask for a batch of its own per yield and
  tensordict makes each TensorDict in Python, so where ``ratio_nest`` is above the target no
  collector of TensorDicts meets it. With many senders on few cores, the senders' spinning
  weighs on these runs as on the collector's (``bare_yield`` then costs more than the
  collector in some cells).

Both report rank 0's CPU time per batch (all of its threads: ``time.process_time``) and its wall
time per batch. The ratio is the collector's CPU time per batch over the bare receive's; the
issue's target is at most 1.5.

    python benchmarks/ingest.py
    python benchmarks/ingest.py --ranks 1 8 --kinds cartpole --transports gloo --seconds 3
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

import _jobs

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "ingest.json"
TARGET = 1.5
#: bare receives timed per cell (after one warm-up message per sender)
RAW_BATCHES = {"cartpole": 20000, "image": 1500}


def _under_mpiexec(k: int, *args: str) -> dict:
    return _jobs.result([_jobs.mpiexec(), "-n", str(k + 1), sys.executable, __file__, *args])


def collector(kind: str, transport: str, k: int, seconds: float, fpb: int) -> dict:
    """rank 0 of the collector: {cpu_us, wall_us, nbytes} per batch."""
    sys.path.insert(0, str(HERE))
    import scale

    if transport == "mpi":
        args = ["--collector", str(k), "--kind", kind, "--seconds", str(seconds)]
        return _under_mpiexec(k, *args, "--fpb", str(fpb))
    _, bps, _, cpu, _, nbytes = scale.measure(kind, "mp", "gloo", k, seconds, fpb)
    return {"cpu_us": cpu / bps * 1e6, "wall_us": 1e6 / bps, "nbytes": nbytes}


def _collector_main(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(HERE))
    import scale

    _, bps, _, cpu, _, nbytes = scale.measure(
        args.kind, "mpi", "mpi", args.collector, args.seconds, args.fpb
    )
    out = {"cpu_us": cpu / bps * 1e6, "wall_us": 1e6 / bps, "nbytes": nbytes}
    print("RESULT " + json.dumps(out), flush=True)


def bare(
    transport: str,
    k: int,
    nbytes: int,
    batches: int,
    ask: bool = False,
    fpb: int | None = None,
    nest: bool = False,
) -> dict:
    """rank 0 of the bare receive (``ask``: each batch answered by an ask; ``fpb``: also the
    TensorDict of a CartPole batch of ``fpb`` frames made from each, laid out as the collector
    lays it, ``nbytes`` then unused; ``nest``: only assembled over leaves made once): {cpu_us,
    wall_us} per batch."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["--bare", transport, "--nbytes", str(nbytes), "--batches", str(batches)]
    if fpb is not None:
        args += ["--yield-fpb", str(fpb), *(["--nest"] if nest else [])]
    return _under_mpiexec(k, *args, "--port", str(port), *(["--ask"] if ask else []))


def _cartpole_layout(fpb: int) -> Any:
    """The ``FlatLayout`` of a CartPole batch of ``fpb`` frames, as the collector sends it."""
    import gymnasium as gym

    from hpccollect import SyncDataCollector
    from hpccollect.transport.batches import FlatLayout

    collector = SyncDataCollector(
        lambda: gym.make("CartPole-v1"), None, frames_per_batch=fpb, total_frames=fpb
    )
    try:
        return FlatLayout.of(next(iter(collector)))
    finally:
        collector.shutdown()


def _bare_main(args: argparse.Namespace) -> None:
    """Every rank under mpiexec: ranks 1..k send, rank 0 receives (over gloo from each in
    turn, over mpi4py from any)."""
    import torch
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, k = comm.rank, comm.size - 1
    per = max(1, args.batches // k)
    layout = None
    if args.yield_fpb is not None:
        layout = comm.bcast(_cartpole_layout(args.yield_fpb) if rank == 0 else None, root=0)
    buf = torch.zeros(args.nbytes if layout is None else layout.nbytes, dtype=torch.uint8)
    leaves = layout.leaf_views(buf) if layout is not None and rank == 0 else None
    if leaves is not None and args.nest:
        made, recipe = [leaf.clone() for leaf in leaves], layout._recipe()

        def batch() -> None:
            recipe.assemble(made)

    elif leaves is not None:

        def batch() -> None:
            layout.own(leaves)

    ask = torch.zeros(64, dtype=torch.uint8)
    if args.bare == "gloo":
        import torch.distributed as dist

        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{args.port}",
            rank=rank,
            world_size=comm.size,
            timeout=datetime.timedelta(seconds=300),
        )

        turn = itertools.cycle(range(1, k + 1))

        def recv() -> None:
            src = next(turn)
            dist.recv(buf, src=src)
            if leaves is not None:
                batch()
            if args.ask:
                dist.send(ask, src)

        def send() -> None:
            dist.send(buf, 0)
            if args.ask:
                dist.recv(ask, 0)
    else:
        view, asked, status = [buf.numpy(), MPI.BYTE], [ask.numpy(), MPI.BYTE], MPI.Status()

        def recv() -> None:
            comm.Recv(view, source=MPI.ANY_SOURCE, tag=0, status=status)
            if leaves is not None:
                batch()
            if args.ask:
                comm.Send(asked, status.Get_source(), 1)

        def send() -> None:
            comm.Send(view, 0, 0)
            if args.ask:
                comm.Recv(asked, 0, 1)

    if rank == 0:
        for _ in range(k):  # warm-up: one each
            recv()
        cpu0, t0 = time.process_time(), time.perf_counter()
        for _ in range(per * k):
            recv()
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        out = {"cpu_us": cpu / (per * k) * 1e6, "wall_us": wall / (per * k) * 1e6}
    else:
        for _ in range(per + 1):
            send()
    comm.Barrier()
    if args.bare == "gloo":
        dist.destroy_process_group()
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 8, 32])
    p.add_argument("--kinds", nargs="+", default=["cartpole", "image"])
    p.add_argument("--transports", nargs="+", default=["gloo", "mpi"])
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--fpb", type=int, default=200, help="CartPole frames per batch")
    p.add_argument("--out", type=Path, default=RESULTS)
    # one run under mpiexec (every rank runs the script)
    p.add_argument("--collector", type=int, help=argparse.SUPPRESS)
    p.add_argument("--kind", default="cartpole", help=argparse.SUPPRESS)
    p.add_argument("--bare", help=argparse.SUPPRESS)
    p.add_argument("--nbytes", type=int, help=argparse.SUPPRESS)
    p.add_argument("--batches", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--ask", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--yield-fpb", type=int, help=argparse.SUPPRESS)
    p.add_argument("--nest", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.collector is not None:
        _collector_main(args)
        return
    if args.bare is not None:
        _bare_main(args)
        return
    rows = []
    for kind in args.kinds:
        for transport in args.transports:
            for k in args.ranks:
                got = collector(kind, transport, k, args.seconds, args.fpb)
                ref = bare(transport, k, got["nbytes"], RAW_BATCHES[kind])
                asked = bare(transport, k, got["nbytes"], RAW_BATCHES[kind], ask=True)
                ratio = got["cpu_us"] / ref["cpu_us"]
                row = {
                    "kind": kind,
                    "transport": transport,
                    "ranks": k,
                    "batch_bytes": got["nbytes"],
                    "collector_cpu_us": round(got["cpu_us"], 1),
                    "collector_wall_us": round(got["wall_us"], 1),
                    "bare_cpu_us": round(ref["cpu_us"], 1),
                    "bare_wall_us": round(ref["wall_us"], 1),
                    "ratio": round(ratio, 2),
                    "bare_ask_cpu_us": round(asked["cpu_us"], 1),
                    "ratio_ask": round(got["cpu_us"] / asked["cpu_us"], 2),
                }
                leasts = (("yield", False), ("nest", True)) if kind == "cartpole" else ()
                for name, nest in leasts:
                    least = bare(transport, k, 0, RAW_BATCHES[kind], True, args.fpb, nest)
                    row[f"bare_{name}_cpu_us"] = round(least["cpu_us"], 1)
                    row["ratio_nest" if nest else "ratio_floor"] = round(
                        least["cpu_us"] / ref["cpu_us"], 2
                    )
                rows.append(row)
                print(
                    f"{kind:8s} {transport:4s} ranks {k:3d}: collector {got['cpu_us']:7.1f} us "
                    f"CPU ({got['wall_us']:7.1f} wall), bare {ref['cpu_us']:7.1f} us CPU "
                    f"({ref['wall_us']:7.1f} wall): {ratio:5.2f}x "
                    f"({'meets' if ratio <= TARGET else 'ABOVE'} {TARGET}x); with asks "
                    f"{asked['cpu_us']:7.1f} us: {row['ratio_ask']:5.2f}x"
                    + (
                        f"; the floor (asks and the batch) {row['bare_yield_cpu_us']:7.1f} us: "
                        f"{row['ratio_floor']:5.2f}x the bare receive (assembled only "
                        f"{row['bare_nest_cpu_us']:7.1f} us: {row['ratio_nest']:5.2f}x)"
                        if "ratio_floor" in row
                        else ""
                    ),
                    flush=True,
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
