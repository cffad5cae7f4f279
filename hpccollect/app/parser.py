"""The command line's grammar: the commands, their options and help, the exit codes; a
mistake found while parsing raises ``UsageError`` (one line, printed by ``cli.main``)."""

from __future__ import annotations

import argparse
import functools
import json
from typing import Any, NoReturn

from hpccollect.app.config import (
    BACKENDS,
    COMPRESSIONS,
    LAUNCHERS,
    RANK_FAILURES,
    RENAMED,
    RunConfig,
)
from hpccollect.collectors.torchrl_api.kinds import collector_kinds
from hpccollect.collectors.workers.cadence import DEFAULT_REPORT_INTERVAL
from hpccollect.transport.control import DEFAULT_LIVENESS_TIMEOUT

__all__ = ["COMMANDS", "EXIT_CODES", "UsageError", "build_parser"]

COMMANDS = ("collect", "inspect", "repair", "merge", "export")


class UsageError(Exception):
    """A mistake argparse found; its one line is printed by ``main``."""


class _Parser(argparse.ArgumentParser):
    """Raises ``UsageError`` instead of printing; ``quiet``: prints no help either (the ranks
    of an MPI job other than rank 0)."""

    def __init__(self, *args, quiet: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.quiet = quiet

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message} (see --help)")

    def _print_message(self, message: str, file=None) -> None:
        if not self.quiet:
            super()._print_message(message, file)


class _Choices(tuple):
    """An option's words, as argparse shows them (in the help and in its "invalid choice"
    line); the earlier spellings still accepted are taken too, not shown."""

    hidden: frozenset[str]

    def __new__(cls, words: tuple[str, ...], hidden: Any) -> _Choices:
        choices = super().__new__(cls, words)
        choices.hidden = frozenset(hidden)
        return choices

    def __contains__(self, value: object) -> bool:
        return super().__contains__(value) or value in self.hidden

    def __getnewargs__(self) -> tuple[tuple[str, ...], frozenset[str]]:  # copies, pickles
        return tuple(self), self.hidden


def _spellings(option: str, words: tuple[str, ...]) -> _Choices:
    """``words``, and the earlier spellings still accepted (left out of the help)."""
    return _Choices(words, RENAMED.get(option, {}))


def build_parser(quiet: bool = False) -> argparse.ArgumentParser:
    """The command line: ``collect`` (the default) and the dataset commands."""
    parser = _Parser(
        quiet=quiet,
        prog="hpccollect",
        description="Collect RL experience into HDF5 datasets. With no command, runs collect.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(
        dest="command", parser_class=functools.partial(_Parser, quiet=quiet)
    )
    collect = sub.add_parser(
        "collect",
        help="collect a dataset (the default command)",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _collect_options(collect)
    _distributed_options(collect)
    _dataset_commands(sub)
    return parser


def _collect_options(collect: argparse.ArgumentParser) -> None:
    collect.add_argument(
        "--config",
        help="TOML file of these options but --config and --quiet (at the top level or under "
        "[collect]; names as here, without the dashes); the command line wins",
    )
    d = RunConfig()
    collect.add_argument(
        "--env",
        help=f"gymnasium env id, or module:EnvName-v0 for an env that module registers "
        f"(default {d.env})",
    )
    collect.add_argument(
        "--import",
        dest="imports",
        action="append",
        metavar="MODULE",
        help="import MODULE first (in every worker too), e.g. one that registers envs; repeatable",
    )
    collect.add_argument(
        "--env-kwargs", type=_json_object, help="JSON object passed to gymnasium.make"
    )
    collect.add_argument(
        "--num-envs",
        type=int,
        help=f"envs per worker, a SyncVectorEnv when > 1 (default {d.num_envs})",
    )
    collect.add_argument(
        "--num-workers",
        type=int,
        help=f"worker processes of multi-* collectors (default {d.num_workers})",
    )
    collect.add_argument(
        "--collector",
        choices=_spellings("collector", collector_kinds()),
        metavar="{" + ",".join(collector_kinds()) + "}",
        help=f"default {d.collector}",
    )
    collect.add_argument("--frames-per-batch", type=int, help=f"default {d.frames_per_batch}")
    collect.add_argument("--total-frames", type=int, help=f"default {d.total_frames}")
    collect.add_argument("--max-steps", type=int, help="truncate episodes after this many steps")
    collect.add_argument(
        "--seed",
        type=int,
        help="seeds envs, policy weights and sampling: the same seed and options give the same "
        f"dataset with single and multi-sync (default {d.seed})",
    )
    collect.add_argument(
        "--policy", help="default (a small MLP), random, module:function, or a state_dict file"
    )
    collect.add_argument(
        "--out",
        help="dataset file (default $HPCCOLLECT_DATA_DIR/<env>-seed<seed>.h5, the directory "
        "data/ when that variable is not set)",
    )
    collect.add_argument("--compression", choices=COMPRESSIONS, help=f"default {d.compression}")
    collect.add_argument(
        "--overwrite",
        action="store_true",
        default=None,
        help="replace --out, and an earlier run's files beside it, if they exist",
    )
    collect.add_argument(
        "--resume",
        metavar="RUN",
        help="continue a run that stopped early (preempted, time limit, crash): RUN is its --out "
        "or the directory holding it; its recorded options are used, the frames on disk count "
        "towards --total-frames, new episodes go to new files and --out becomes a view over all",
    )
    collect.add_argument(
        "--worker-timeout",
        type=float,
        metavar="SECONDS",
        help="multi-* collectors: a worker that has not delivered its batch within this many "
        f"seconds is taken as hung, killed, and the run ends with exit code 1 "
        f"(default {d.worker_timeout:g})",
    )
    collect.add_argument("--quiet", action="store_true", help="no progress line")


def _distributed_options(collect: argparse.ArgumentParser) -> None:
    mpi = collect.add_argument_group(
        "distributed (mpiexec -n N / srun: rank 0 gathers, ranks 1..N-1 each run --collector)"
    )
    mpi.add_argument(
        "--launcher",
        choices=_spellings("launcher", LAUNCHERS),
        metavar="{" + ",".join(LAUNCHERS) + "}",
        help="mpi: run distributed (the default when mpiexec, srun or torchrun started more than "
        "one process); none: one process as without a launcher (each process its own job)",
    )
    mpi.add_argument(
        "--backend",
        choices=BACKENDS,
        help="how batches and weights travel between ranks: gloo (TCP, default), mpi (MPI "
        "itself), or another backend this torch build has",
    )
    mpi.add_argument(
        "--master-addr",
        metavar="ADDR",
        help="address of rank 0's host that the other ranks reach (default: loopback on one "
        "node, else rank 0's host address)",
    )
    mpi.add_argument(
        "--interface",
        metavar="NAME",
        help="network interface whose address rank 0 listens on (eth0, ib0), instead of "
        "--master-addr",
    )
    mpi.add_argument(
        "--on-rank-failure",
        choices=RANK_FAILURES,
        help="a collector rank that dies or goes silent: raise ends the run with exit code 1 "
        "(default); continue goes on with the other ranks and says so once",
    )
    mpi.add_argument(
        "--liveness-timeout",
        type=float,
        metavar="SECONDS",
        help="a rank silent this long (no batch, no heartbeat: its node lost, its network cut, "
        f"the process stopped) counts as lost; rank 0 silent this long ends the collector ranks "
        f"(default {DEFAULT_LIVENESS_TIMEOUT:g})",
    )
    mpi.add_argument(
        "--shards",
        action="store_true",
        default=None,
        help="each collector rank writes its own shard OUT.shards/rank-0001.h5, ...; rank 0 "
        "writes --out as a merged view over them (default: rank 0 writes --out)",
    )
    mpi.add_argument(
        "--gather",
        type=_gather,
        metavar="{node,K}",
        help="node: the collector ranks of each node send rank 0 one batch a round through "
        "the node's first rank, which collects nothing itself; K: groups of K consecutive "
        "collector ranks do the same (fewer messages and links into rank 0; each batch is a "
        "group's round, --frames-per-batch shared by its ranks; not with --shards)",
    )
    mpi.add_argument(
        "--report-interval",
        type=float,
        metavar="SECONDS",
        help="with --shards: a collector rank reports its frames, episodes and returns to rank 0 "
        "at least this often, which is how often the progress line moves "
        f"(default {DEFAULT_REPORT_INTERVAL:g})",
    )


def _dataset_commands(sub: Any) -> None:
    inspect = sub.add_parser("inspect", help="describe and check a dataset file")
    inspect.add_argument("file", type=_path)
    repair = sub.add_parser(
        "repair",
        help="make an unfinished file (a crashed or killed run's .partial) readable: cut it "
        "back to its committed rows and give it its final name",
    )
    repair.add_argument("file", type=_path, help="the .partial file, or its final name")
    merge = sub.add_parser("merge", help="one file over many shards (virtual datasets)")
    merge.add_argument("shards", nargs="+", type=_path)
    merge.add_argument("--out", required=True, type=_path)
    merge.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    merge.add_argument(
        "--allow-partial",
        action="store_true",
        help="also merge unfinished (.partial) shards, their committed rows only",
    )
    export = sub.add_parser("export", help="export to D4RL, Minari or a memory-mapped TensorDict")
    export.add_argument("file", type=_path)
    export.add_argument("--format", required=True, choices=("d4rl", "minari", "memmap"))
    export.add_argument(
        "--out",
        required=True,
        type=_path,
        help="file (d4rl), datasets root (minari), folder (memmap)",
    )
    export.add_argument("--dataset-id", help="NAMESPACE/NAME-vN (minari)")
    export.add_argument("--overwrite", action="store_true", help="replace --out if it exists")


def _gather(text: str) -> str | int:
    """``--gather``: ``node``, or a group size (its range is checked with the run's options)."""
    if text == "node":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "must be node or a number of collector ranks per group, such as 8"
        ) from None


def _path(text: str) -> str:
    """A file or folder argument: not empty (an empty path would mean the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must be a path, got an empty string")
    return text


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON: {err}") from err
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            "must be a JSON object such as '{\"max_episode_steps\": 100}'"
        )
    return value


EXIT_CODES = """\
exit codes:
  0  done, or stopped early by SIGTERM/SIGINT (SLURM preemption, scancel, timeout, Ctrl-C):
     the summary says "stopped early by SIGTERM"; every committed episode is kept, episodes in
     progress are written as truncated (a stop during start-up writes no dataset); continue
     it with --resume OUT. Also: --resume of a run that already holds its total
  1  collection failed: a worker died, or did not answer within --worker-timeout, or the
     dataset could not be written (full disk, file-size limit, I/O error); committed episodes
     are kept (after a write error, `repair FILE` finishes the file)
  2  a mistake in the arguments or the files named (nothing was started), or the env or the
     policy failed (in a worker too)
"""
