"""``python -m hpccollect``: runs the command ``parser.py`` reads and prints its outcome; the work
is in the job (``lifecycle.py``, ``local_job.py``, ``mpi_job.py``) and ``storage``. A user
mistake prints one line and exits with code 2, found before torch loads where the command line
alone shows it (the jobs and storage are imported by the command that runs)."""

from __future__ import annotations

import argparse
import difflib
import functools
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from hpccollect._exit import freeze_survivors
from hpccollect.app.config import RUN_OPTIONS, RunConfig, load_toml, wants_mpi
from hpccollect.app.parser import COMMANDS, UsageError, build_parser
from hpccollect.app.progress import show_warning_line
from hpccollect.errors import (
    ArgumentTypeError,
    ArgumentValueError,
    EnvError,
    HpcCollectError,
    PolicyError,
)
from hpccollect.launchers.rendezvous import launched_rank

__all__ = ["main", "run"]

_USER_ERRORS = (ArgumentValueError, ArgumentTypeError, EnvError, PolicyError)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and not args[0].startswith("-") and args[0] not in COMMANDS:
        return _Output(True).fail(2, _unknown_command(args[0]))
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
        ns = build_parser(quiet=not out.speaks).parse_args(args)
        with warnings.catch_warnings():
            warnings.showwarning = show_warning_line
            if not out.speaks:  # rank 0 alone warns of what every rank finds alike
                warnings.simplefilter("ignore", FutureWarning)
            return commands[ns.command](ns)
    except UsageError as err:
        return out.fail(2, str(err))
    except HpcCollectError as err:
        code, line = _describe(err)
        return out.fail(code, line)


def run() -> int:
    """``python -m hpccollect`` and the ``hpccollect`` command: ``main()``, then the process ends
    without Python's last collections over torch's objects (``hpccollect._exit``).

    Returns:
        The exit code.
    """
    code = main()
    freeze_survivors()
    return code


def _unknown_command(word: str) -> str:
    """The line for a first word that is no command (collect takes no positional argument)."""
    near = difflib.get_close_matches(word.lower(), COMMANDS, n=1)
    guess = f"; did you mean {near[0]!r}?" if near else ""
    return (
        f"hpccollect: error: unknown command {word!r}{guess} (commands: {', '.join(COMMANDS)}; "
        "with none, collect runs; see --help)"
    )


def _describe(err: BaseException) -> tuple[int, str] | None:
    """The exit code and the one line for an error the command line reports, else None."""
    if isinstance(err, _USER_ERRORS):
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        return 2, f"hpccollect: error: {text}"
    if not isinstance(err, HpcCollectError):
        return None
    resume = sys.modules.get("hpccollect.app.resume")  # what raises RunComplete imported it
    if resume is not None and isinstance(err, resume.RunComplete):
        return 0, f"hpccollect: {err}"
    return 1, f"hpccollect: failed: {err}"


class _Output:
    """Who prints. Under mpiexec/srun every rank runs the same command: until the collect job
    knows better, only rank 0 reports the argument mistakes that every rank finds alike."""

    def __init__(self, collect: bool) -> None:
        self.speaks = True
        self.job = None  # the distributed collect job, once MPI runs
        if collect:
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
        resolve = functools.partial(_resumed, options["resume"], [toml, options])
        options = {k: v for k, v in options.items() if k in RUN_OPTIONS}
        toml = {k: v for k, v in toml.items() if k.replace("-", "_") in RUN_OPTIONS}
    cfg = RunConfig.from_sources(toml, options)
    if wants_mpi(cfg):  # rank 0 alone reads a run to resume, during its start-up checks
        return _collect_distributed(cfg, ns.quiet, out, resolve)
    out.speaks = True  # --launcher none: every process runs its own job
    if resolve is not None:
        cfg = resolve()
    cfg.check_local()
    from hpccollect.app.local_job import run_collect
    from hpccollect.app.progress import Progress

    progress = None if ns.quiet else Progress(cfg.total_frames)

    def on_progress(frames: int, episodes: int, mean: float | None) -> None:
        if frames == 0:  # the checks passed and the collector started: what it will do
            processes = cfg.num_workers if cfg.collector != "single" else 1
            print(
                f"collecting {cfg.total_frames} frames of {cfg.env} with {cfg.collector} "
                f"({processes} process(es) x {cfg.num_envs} env(s)) -> {cfg.output}",
                file=sys.stderr,
            )
        if progress is not None:
            progress.update(frames, episodes, mean)

    try:
        summary = run_collect(cfg, on_progress, _on_resume(progress))
    finally:
        if progress is not None:
            progress.close()
    print("\n".join(summary.lines()), flush=True)
    return 0


def _resumed(run: str, sources: list[dict]) -> RunConfig:
    """The configuration of the run to resume (``resume.resumed_config``; it reads datasets,
    so it is imported when a run is resumed)."""
    from hpccollect.app.resume import resumed_config

    return resumed_config(run, sources)


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
        print("\n".join(summary.lines()), flush=True)  # before a launcher kills the rank
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

    whole = _complete_already(Path(ns.file))
    if whole is not None:
        print(whole)
        return 0
    out = repair_dataset(Path(ns.file))  # a missing file: ArgumentValueError, named
    with read_dataset(out) as ds:
        problems = ds.check()
        print(f"repaired {out}: {len(ds)} committed frames, {ds.committed_episodes} episodes kept")
    if problems:
        print("still has problems: " + "; ".join(problems), file=sys.stderr)
        return 1
    return 0


def _complete_already(path: Path) -> str | None:
    """What to say of a finished, sound dataset given to ``repair`` (nothing to do), or None."""
    from hpccollect.storage import dataset_format, read_dataset
    from hpccollect.storage.unfinished import staging_path

    fmt = dataset_format(path)
    if not path.is_file() or fmt.partial_path(path).exists() or staging_path(path).exists():
        return None  # repair's to finish, or to delete (a file a killed writer was making)
    try:
        with read_dataset(path) as ds:
            if getattr(ds, "complete", False) and not ds.check():
                return (
                    f"{path} is complete: {len(ds)} committed frames, {ds.committed_episodes} "
                    "episodes; nothing to repair"
                )
    except HpcCollectError:
        pass  # repair says what it finds
    return None


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
    elif ns.dataset_id:
        raise ArgumentValueError(
            f"--dataset-id names a Minari dataset; --format {ns.format} takes none: drop it."
        )
    elif ns.format == "d4rl":
        out = export_d4rl(ns.file, ns.out, overwrite=ns.overwrite)
    else:
        out = export_memmap(ns.file, ns.out, overwrite=ns.overwrite)
    print(f"exported {ns.file} as {ns.format} to {out}")
    return 0
