"""A model of one rank 0 from 1 to 10,000 collector ranks, fitted to the points
``benchmarks/scale.py`` measured (``benchmarks/results/scale.json``) and checked against them.

What it models, per rank count N:

* rank 0's CPU per batch it takes in: ``a + bytes / B`` per transport, fitted by least squares
  to the measured rank 0 CPU time per batch (CPU share over batches/s) of that transport's
  rows. The per-batch cost does not grow with N: the residuals per rank count are printed to
  show it.
* what rank 0 needs to keep up with N ranks that each collect ``fps`` frames a second in batches
  of ``fpb`` frames: cores (``N * fps / fpb * cost``, with the mpi4py transport's cost, the one
  to use past ~100 ranks), bytes a second, memory (its base, plus a receive buffer and the
  yielded copy of one batch per rank), threads and sockets;
* gathered per node: rank 0 takes one message per node of ``PER_NODE`` cores a round instead
  of ``PER_NODE`` (``MPILauncher(gather="node")``, or one multi-sync collector rank per node).
  That saves the fixed cost of each message it no longer takes, and nothing else: its cost per
  frame (laying the round out, copying it into what it yields, waiting) stays. Both are fitted
  to ``benchmarks/gather.py``'s sync trainer with and without gathering
  (``benchmarks/results/gather.json``): rank 0 CPU per round = ``f * messages + c * frames``,
  least squares, and checked against those points;
* dataset jobs (``--shards``): one report per rank every ``report_interval`` s, each costed as
  a batch of a report's size;
* start-up under ``mpiexec``: a line fitted to the measured points; heartbeat traffic: one
  message each way per rank every ``beat_interval(liveness_timeout)`` s.

Three batch kinds: CartPole (measured: 13.2 KB for 200 frames), a MuJoCo-sized one
(HalfCheetah: 17 observation floats, 6 actions; 177 B a frame, 1,000 frames) and an Atari-sized
one (two 4x84x84 uint8 stacks a frame; 64 frames). The frames a second per rank are
assumptions (``KINDS``), stated with the results.

    python benchmarks/model.py --plot docs/scale_model.png

Prints the tables, writes ``benchmarks/results/model.json``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SCALE = HERE / "results" / "scale.json"
GATHER = HERE / "results" / "gather.json"
OUT = HERE / "results" / "model.json"

#: kind: (bytes a frame, frames a batch, frames a second per collector rank: an assumption)
KINDS = {
    "cartpole": (13_200 / 200, 200, 5_000),
    "mujoco": (177, 1_000, 2_000),
    "atari": (2 * 4 * 84 * 84 + 40, 64, 1_000),
}
RANKS = (1, 10, 100, 1_000, 10_000)
REPORT_BYTES = 1_200  # a rank report (``collectors/workers/reports.py``) as it travels
#: rank 0's own memory (MB) and what each link holds besides its batches, fitted below
LIVENESS = 30.0  # s, the default liveness_timeout
BEAT = min(5.0, LIVENESS / 6)  # control.beat_interval
#: per collector rank on rank 0: threads (none over either transport: rank 0 reads each rank's
#: control link in the thread that waits, ``transport/rank_channel.py``) and sockets (gloo's
#: and the control link, ``rank_sockets.py``; MPI: the control link)
THREADS = {"gloo": 0, "mpi": 0}
SOCKETS_RANK0 = {"gloo": 4, "mpi": 1}
#: gloo connects a pair of ranks when they first talk (``transport/backends._gloo``): a collector
#: rank holds the store's, two listeners, rank 0's, its control link to rank 0 and its broadcast
#: tree's (at most log2(N + 1)) sockets; MPI connects on first use
SOCKETS_RANK = {"gloo": lambda n: 6 + math.ceil(math.log2(n + 1)), "mpi": lambda n: 4}
FD_LIMIT = 1024  # the usual default ``ulimit -n``
PER_NODE = 32  # cores of a node: the workers of one gathering rank
SCALE_TRANSPORT = "mpi"  # the transport the needs are costed for


def load() -> list[dict]:
    return json.loads(SCALE.read_text())


def fit_cost(rows: list[dict]) -> dict[str, tuple[float, float]]:
    """Per transport, (a s, B bytes/s): rank 0 CPU per batch = a + bytes / B, least squares."""
    fits = {}
    for transport in sorted({r["transport"] for r in rows}):
        mine = [r for r in rows if r["transport"] == transport]
        x = np.array([r["batch_bytes"] for r in mine], float)
        y = np.array([r["rank0_cpu"] / r["batches_per_s"] for r in mine], float)
        slope, a = np.polyfit(x, y, 1)
        fits[transport] = (float(a), float(1 / slope))
    return fits


def fit_gather(rows: list[dict]) -> tuple[float, float, list[dict]]:
    """(f s a message, c s a frame) of rank 0's CPU per round = f * messages + c * frames, least
    squares over ``gather.py``'s rows with and without gathering; and each row checked."""
    x = np.array([[r["messages_per_round"], r["frames_per_round"]] for r in rows], float)
    y = np.array([r["rank0_cpu_ms_per_round"] / 1e3 for r in rows], float)
    (f, c), *_ = np.linalg.lstsq(x, y, rcond=None)
    checked = []
    for r, (messages, frames), measured in zip(rows, x, y, strict=True):
        model = f * messages + c * frames
        checked.append(
            dict(
                ranks=r["ranks"],
                gather=r["gather"],
                measured_ms=round(1e3 * measured, 3),
                model_ms=round(1e3 * model, 3),
                error=round(model / measured - 1, 2),
            )
        )
    return float(f), float(c), checked


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of a least-squares line."""
    slope, intercept = np.polyfit(np.array(xs, float), np.array(ys, float), 1)
    return float(intercept), float(slope)


def check(rows: list[dict], fits: dict[str, tuple[float, float]]) -> list[dict]:
    """Measured against modelled rank 0 CPU per batch, per row."""
    out = []
    for r in rows:
        a, bw = fits[r["transport"]]
        measured = r["rank0_cpu"] / r["batches_per_s"]
        model = a + r["batch_bytes"] / bw
        out.append(
            dict(
                kind=r["kind"],
                transport=r["transport"],
                ranks=r["ranks"],
                measured_us=round(1e6 * measured),
                model_us=round(1e6 * model),
                error=round(model / measured - 1, 2),
            )
        )
    return out


def needs(
    n: int, kind: str, a: float, bw: float, mem: tuple[float, float], per_message: float
) -> dict:
    """What rank 0 needs for ``n`` ranks of ``kind`` (see the module); ``per_message``: the
    fixed cost of a message that gathering saves (``fit_gather``)."""
    per_frame, fpb, fps = KINDS[kind]
    nbytes = per_frame * fpb
    cost = a + nbytes / bw
    batches = n * fps / fpb
    reports_cost = a + REPORT_BYTES / bw
    nodes = -(-n // PER_NODE)
    groups = nodes * fps / fpb  # a node's gatherer sends one message a round
    return dict(
        ranks=n,
        kind=kind,
        batch_kb=round(nbytes / 1e3, 1),
        batches_per_s=round(batches),
        cores=round(batches * cost, 4),
        cores_gathered=round(max(0.0, batches * cost - (batches - groups) * per_message), 3),
        gb_per_s=round(n * fps * per_frame / 1e9, 3),
        memory_gb=round((mem[0] + n * (mem[1] + 2 * nbytes / 1e6)) / 1e3, 2),
        max_ranks_one_core=math.floor(fpb / (fps * cost)),
        report_interval_for_half_core=round(2 * n * reports_cost, 1),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--plot", type=Path, help="draw the model into this PNG")
    args = p.parse_args()
    rows = load()
    fits = fit_cost(rows)
    for transport, (a, bw) in fits.items():
        print(f"{transport}: rank 0 CPU per batch = {1e6 * a:.0f} us + bytes / {bw / 1e9:.2f} GB/s")
    a, bw = fits[SCALE_TRANSPORT]
    print("\nchecked against the measured points (benchmarks/results/scale.json):")
    checked = check(rows, fits)
    for c in checked:
        print(
            f"  {c['kind']:8s} {c['transport']:5s} {c['ranks']:3d} ranks: measured "
            f"{c['measured_us']:6d} us, model {c['model_us']:6d} us ({c['error']:+.0%})"
        )
    # memory: rank 0's RSS against ranks, CartPole rows (batches small: the links' own cost)
    cart = [r for r in rows if r["kind"] == "cartpole" and r["transport"] == "gloo"]
    base, per_link = fit_line([r["ranks"] for r in cart], [r["rank0_rss_mb"] for r in cart])
    print(f"\nrank 0 memory = {base:.0f} MB + {per_link:.2f} MB a rank + two batches a rank")
    mpi = [r for r in rows if r["kind"] == "cartpole" and r["transport"] == "mpi"]
    s0, s1 = fit_line([r["ranks"] for r in mpi], [r["startup_s"] for r in mpi])
    print(f"start-up under mpiexec = {s0:.2f} s + {s1:.3f} s a rank")
    f, c, gathered = fit_gather(json.loads(GATHER.read_text()))
    print(
        f"\nsync trainer, rank 0 CPU per round = {1e6 * f:.0f} us a message + {1e6 * c:.3f} us "
        "a frame; checked against the measured points (benchmarks/results/gather.json):"
    )
    for g in gathered:
        print(
            f"  {g['ranks']:3d} ranks, gather={g['gather']}: measured {g['measured_ms']:.3f} "
            f"ms, model {g['model_ms']:.3f} ms ({g['error']:+.0%})"
        )
    table = [needs(n, k, a, bw, (base, per_link), f) for k in KINDS for n in RANKS]
    print(
        "\nwhat rank 0 needs when every batch comes to it (fps a rank: "
        + ", ".join(f"{k} {v[2]:,}" for k, v in KINDS.items())
        + "):"
    )
    for t in table:
        print(
            f"  {t['kind']:8s} {t['ranks']:6d} ranks: {t['batches_per_s']:9,d} batches/s, "
            f"{t['cores']:8.2f} cores ({t['cores_gathered']:.3f} gathered per node), "
            f"{t['gb_per_s']:8.3f} GB/s, {t['memory_gb']:8.2f} GB; "
            f"one core keeps up with {t['max_ranks_one_core']} ranks; reports every "
            f"{t['report_interval_for_half_core']} s keep a dataset job under half a core"
        )
    links = []
    for n in RANKS:
        links.append(
            dict(
                ranks=n,
                startup_mpiexec_s=round(s0 + s1 * n, 1),
                heartbeat_msgs_per_s=round(2 * n / BEAT),
                **{f"threads_{t}": 3 + THREADS[t] * n for t in THREADS},
                **{f"sockets_rank0_{t}": SOCKETS_RANK0[t] * n for t in SOCKETS_RANK0},
                **{f"sockets_rank_{t}": SOCKETS_RANK[t](n) for t in SOCKETS_RANK},
            )
        )
    print("\nlinks:")
    for link in links:
        over = " (over ulimit -n 1024)" if link["sockets_rank0_gloo"] > FD_LIMIT else ""
        print(
            f"  {link['ranks']:6d} ranks: start-up {link['startup_mpiexec_s']} s, heartbeats "
            f"{link['heartbeat_msgs_per_s']}/s, rank 0 threads gloo {link['threads_gloo']} / "
            f"mpi {link['threads_mpi']}, sockets on rank 0 gloo {link['sockets_rank0_gloo']}"
            f"{over} / mpi {link['sockets_rank0_mpi']}, sockets a collector rank gloo "
            f"{link['sockets_rank_gloo']} / mpi {link['sockets_rank_mpi']}"
        )
    OUT.write_text(
        json.dumps(
            dict(
                fits={
                    t: dict(cost_us=round(1e6 * fa, 1), bandwidth_gb_s=round(fb / 1e9, 3))
                    for t, (fa, fb) in fits.items()
                },
                gather_fit=dict(us_a_message=round(1e6 * f, 1), us_a_frame=round(1e6 * c, 4)),
                gather_checked=gathered,
                needs_costed_for=SCALE_TRANSPORT,
                per_node=PER_NODE,
                memory_base_mb=round(base),
                memory_per_link_mb=round(per_link, 3),
                startup_s=[round(s0, 3), round(s1, 4)],
                assumed_fps=KINDS,
                checked=checked,
                needs=table,
                links=links,
            ),
            indent=1,
        )
        + "\n"
    )
    if args.plot:
        plot(rows, fits, table, args.plot)


def plot(rows: list[dict], fits: dict, table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    ax = axes[0]
    for kind, marker in (("cartpole", "o"), ("image", "s")):
        for transport, color in (("gloo", "C0"), ("mpi", "C1")):
            sel = [r for r in rows if r["kind"] == kind and r["transport"] == transport]
            x = [r["ranks"] for r in sel]
            ax.plot(
                x,
                [1e3 * r["rank0_cpu"] / r["batches_per_s"] for r in sel],
                marker,
                color=color,
                label=f"{kind}, {transport} (measured)",
            )
            a, bw = fits[transport]
            nbytes = sel[0]["batch_bytes"]
            ax.axhline(1e3 * (a + nbytes / bw), color=color, ls="--", lw=1)
    ax.set(xscale="log", yscale="log", xlabel="collector ranks", ylabel="ms of CPU a batch")
    ax.set_title("rank 0 CPU a batch (dashed: model)")
    ax.legend(fontsize=7)
    for ax, key, title in (
        (axes[1], "cores", "rank 0 cores: every batch (-), gathered per node (:)"),
        (axes[2], "memory_gb", "rank 0 memory, GB"),
    ):
        for kind in KINDS:
            sel = [t for t in table if t["kind"] == kind]
            line = ax.plot(
                [t["ranks"] for t in sel], [max(t[key], 1e-3) for t in sel], "-o", label=kind
            )
            if key == "cores":
                ax.plot(
                    [t["ranks"] for t in sel],
                    [max(t["cores_gathered"], 1e-3) for t in sel],
                    ":",
                    color=line[0].get_color(),
                )
        ax.set(xscale="log", yscale="log", xlabel="collector ranks", title=title)
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    axes[1].axhline(1, color="red", lw=1, ls=":")
    axes[0].grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
