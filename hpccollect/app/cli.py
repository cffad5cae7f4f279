"""``python -m hpccollect``: argument parsing and output only; the work is in ``job`` and
``storage``. A user mistake prints one line and exits with code 2."""

from __future__ import annotations

import argparse
import functools
import json
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from hpccollect.app.config import (
    BACKENDS,
    COLLECTORS,
    COMPRESSIONS,
    LAUNCHERS,
    RENAMED,
    RunConfig,
    load_toml,
)
from hpccollect.app.progress import show_warning_line
from hpccollect.app.resume import RUN_OPTIONS, RunComplete, resumed_config
from hpccollect.errors import (
    ArgumentTypeError,
    ArgumentValueError,
    EnvError,
    HpcCollectError,
    PolicyError,
)

__all__ = ["main"]

COMMANDS = ("collect", "inspect", "repair", "merge", "export")
_USER_ERRORS = (ArgumentValueError, ArgumentTypeError, EnvError, PolicyError)


class _UsageError(Exception):
    """A mistake argparse found; its one line is printed by ``main``."""


class _Parser(argparse.ArgumentParser):
    """Raises ``_UsageError`` instead of printing; ``quiet``: prints no help either (the ranks
    of an MPI job other than rank 0)."""

    def __init__(self, *args, quiet: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.quiet = quiet

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: error: {message} (see --help)")

    def _print_message(self, message: str, file=None) -> None:
        if not self.quiet:
            super()._print_message(message, file)


def _spellings(option: str, words: tuple[str, ...]) -> tuple[str, ...]:
    """``words`` and the earlier spellings still accepted (left out of the help)."""
    return (*words, *RENAMED.get(option, {}))


def _parser(quiet: bool = False) -> argparse.ArgumentParser:
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
    collect.add_argument("--config", help="TOML file with any of these options")
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
        choices=_spellings("collector", COLLECTORS),
        metavar="{" + ",".join(COLLECTORS) + "}",
        help=f"default {d.collector}",
    )
    collect.add_argument("--frames-per-batch", type=int, help=f"default {d.frames_per_batch}")
    collect.add_argument("--total-frames", type=int, help=f"default {d.total_frames}")
    collect.add_argument("--max-steps", type=int, help="truncate episodes after this many steps")
    collect.add_argument(
        "--seed",
        type=int,
        help="seeds envs, policy weights and sampling: the same seed and options give the same "
        f"dataset with sync and multi-sync (default {d.seed})",
    )
    collect.add_argument(
        "--policy", help="default (a small MLP), random, module:function, or a state_dict file"
    )
    collect.add_argument("--out", help="dataset file (default data/<env>-seed<seed>.h5)")
    collect.add_argument("--compression", choices=COMPRESSIONS, help=f"default {d.compression}")
    collect.add_argument("--overwrite", action="store_true", default=None)
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
        "--shards",
        action="store_true",
        default=None,
        help="each collector rank writes its own shard OUT.shards/rank-0001.h5, ...; rank 0 "
        "writes --out as a merged view over them (default: rank 0 writes --out)",
    )
    inspect = sub.add_parser("inspect", help="describe and check a dataset file")
    inspect.add_argument("file")
    repair = sub.add_parser(
        "repair",
        help="make an unfinished file (a crashed or killed run's .partial) readable: cut it "
        "back to its committed rows and give it its final name",
    )
    repair.add_argument("file", help="the .partial file, or its final name")
    merge = sub.add_parser("merge", help="one file over many shards (virtual datasets)")
    merge.add_argument("shards", nargs="+")
    merge.add_argument("--out", required=True)
    merge.add_argument("--overwrite", action="store_true")
    merge.add_argument(
        "--allow-partial",
        action="store_true",
        help="also merge unfinished (.partial) shards, their committed rows only",
    )
    export = sub.add_parser("export", help="export to D4RL, Minari or a memory-mapped TensorDict")
    export.add_argument("file")
    export.add_argument("--format", required=True, choices=("d4rl", "minari", "memmap"))
    export.add_argument(
        "--out", required=True, help="file (d4rl), datasets root (minari), folder (memmap)"
    )
    export.add_argument("--dataset-id", help="NAMESPACE/NAME-vN (minari)")
    export.add_argument("--overwrite", action="store_true")
    return parser


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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or (args[0] not in COMMANDS and args[0] not in ("-h", "--help")):
        args.insert(0, "collect")
    out = _Output(args[0] == "collect")
    commands = {
        "collect": functools.partial(_collect, out=out),
        "inspect": _inspect,
        "repair": _repair,
        "merge": _merge,
        "export": _export,
    }
    try:
        ns = _parser(quiet=not out.speaks).parse_args(args)
        with warnings.catch_warnings():
            warnings.showwarning = show_warning_line
            if not out.speaks:  # rank 0 alone warns of what every rank finds alike
                warnings.simplefilter("ignore", FutureWarning)
            return commands[ns.command](ns)
    except _UsageError as err:
        return out.fail(2, str(err))
    except HpcCollectError as err:
        code, line = _describe(err)
        return out.fail(code, line)


def _describe(err: BaseException) -> tuple[int, str] | None:
    """The exit code and the one line for an error the command line reports, else None."""
    if isinstance(err, RunComplete):
        return 0, f"hpccollect: {err}"
    if isinstance(err, _USER_ERRORS):
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        return 2, f"hpccollect: error: {text}"
    if isinstance(err, HpcCollectError):
        return 1, f"hpccollect: failed: {err}"
    return None


class _Output:
    """Who prints. Under mpiexec/srun every rank runs the same command: until the collect job
    knows better, only rank 0 reports the argument mistakes that every rank finds alike."""

    def __init__(self, collect: bool) -> None:
        self.speaks = True
        self.job = None  # the distributed collect job, once MPI runs
        if collect:
            from hpccollect.app.mpi_job import launched_rank

            self.speaks = launched_rank() == 0

    def fail(self, code: int, line: str) -> int:
        if self.speaks:
            print(line, file=sys.stderr)
        if self.job is not None:  # the other ranks would wait for this one forever
            sys.stderr.flush()
            self.job.abort(code)
        return code


def _collect(ns: argparse.Namespace, out: _Output) -> int:
    options = {k: v for k, v in vars(ns).items() if k not in ("command", "config", "quiet")}
    toml = load_toml(ns.config) if ns.config else {}
    resolve = None
    if options.get("resume") is not None:  # the run's options are checked once read (rank 0)
        resolve = functools.partial(resumed_config, options["resume"], [toml, options])
        options = {k: v for k, v in options.items() if k in RUN_OPTIONS}
        toml = {k: v for k, v in toml.items() if k.replace("-", "_") in RUN_OPTIONS}
    cfg = RunConfig.from_sources(toml, options)
    from hpccollect.app.mpi_job import wants_mpi

    if wants_mpi(cfg):  # rank 0 alone reads a run to resume, during its start-up checks
        return _collect_distributed(cfg, ns.quiet, out, resolve)
    out.speaks = True  # --launcher none: every process runs its own job
    if resolve is not None:
        cfg = resolve()
    cfg.check_local()
    from hpccollect.app.local_job import run_collect
    from hpccollect.app.progress import Progress

    print(
        f"collecting {cfg.total_frames} frames of {cfg.env} with {cfg.collector} "
        f"({cfg.num_workers if cfg.collector != 'single' else 1} process(es) x {cfg.num_envs} env(s)) "
        f"-> {cfg.output}",
        file=sys.stderr,
    )
    progress = None if ns.quiet else Progress(cfg.total_frames)
    try:
        summary = run_collect(
            cfg, None if progress is None else progress.update, _on_resume(progress)
        )
    finally:
        if progress is not None:
            progress.close()
    print("\n".join(summary.lines()))
    return 0


def _on_resume(progress) -> Callable:
    def on_resume(attempt) -> None:
        print(attempt.describe(), file=sys.stderr)
        if progress is not None:
            progress.total = attempt.cfg.total_frames

    return on_resume


def _collect_distributed(
    cfg: RunConfig, quiet: bool, out: _Output, resolve: Callable[[], RunConfig] | None
) -> int:
    """Rank 0 collects and reports; the other ranks serve it and print only their errors."""
    from hpccollect.app.agreement import JobEnded
    from hpccollect.app.mpi_job import MPICollect
    from hpccollect.app.progress import Progress

    job = MPICollect(cfg, resolve)
    alone = job.size == 1 and not out.speaks  # torchrun: every process is MPI's rank 0
    out.speaks = True  # from here on, a rank's error is its own
    progress = None if quiet or job.rank else Progress(cfg.total_frames)

    def announce(job: MPICollect) -> None:
        if job.attempt is not None:
            _on_resume(progress)(job.attempt)
        if job.size > 1:
            print(job.describe(), file=sys.stderr)
        if progress is not None:
            progress.total = job.cfg.total_frames

    try:
        summary = job.run(None if progress is None else progress.update, _describe, announce)
    except JobEnded as end:  # every rank ends, none waits: no abort
        if end.line and not alone:
            print(end.line, file=sys.stderr)
        return end.code
    except BaseException:
        out.job = job if job.size > 1 else None
        raise
    finally:
        if progress is not None:
            progress.close()
    if summary is not None:
        print("\n".join(summary.lines()))
    return 0


def _inspect(ns: argparse.Namespace) -> int:
    """Describe a file; one still being written is read as of its last commit (no lock taken)."""
    import time

    from hpccollect.app.report import description, unfinished_hint
    from hpccollect.storage import read_dataset

    unfinished_hint(ns.file)
    for attempt in range(3):
        with read_dataset(ns.file) as ds:
            problems = ds.check()
            if problems and not ds.complete and attempt < 2:
                time.sleep(0.2)  # read while its writer was mid-flush: look again
                continue
            print("\n".join(description(ds, ns.file)))
            print(
                "integrity         "
                + ("ok" if not problems else "PROBLEMS: " + "; ".join(problems))
            )
            return 0 if not problems else 1
    return 1


def _repair(ns: argparse.Namespace) -> int:
    from hpccollect.storage import read_dataset, repair_dataset

    path = Path(ns.file)
    partial = path if path.name.endswith(".partial") else path.with_name(path.name + ".partial")
    if not path.exists() and not partial.exists():
        raise ArgumentValueError(f"{ns.file} does not exist (nor {partial.name}).")
    out = repair_dataset(path)
    with read_dataset(out) as ds:
        problems = ds.check()
        print(f"repaired {out}: {len(ds)} committed frames, {ds.committed_episodes} episodes kept")
    if problems:
        print("still has problems: " + "; ".join(problems), file=sys.stderr)
        return 1
    return 0


def _merge(ns: argparse.Namespace) -> int:
    from hpccollect.storage import merge_datasets, read_dataset

    out = merge_datasets(ns.shards, ns.out, overwrite=ns.overwrite, allow_partial=ns.allow_partial)
    with read_dataset(out) as ds:
        print(
            f"merged {len(ns.shards)} shards into {out}: {len(ds)} frames, {ds.committed_episodes} episodes"
        )
    return 0


def _export(ns: argparse.Namespace) -> int:
    from hpccollect.storage import export_d4rl, export_memmap, export_minari

    if ns.format == "minari":
        if not ns.dataset_id:
            raise ArgumentValueError("--format minari needs --dataset-id NAMESPACE/NAME-vN.")
        out = export_minari(ns.file, ns.out, ns.dataset_id, overwrite=ns.overwrite)
    elif ns.format == "d4rl":
        out = export_d4rl(ns.file, ns.out, overwrite=ns.overwrite)
    else:
        out = export_memmap(ns.file, ns.out, overwrite=ns.overwrite)
    print(f"exported {ns.file} as {ns.format} to {out}")
    return 0
