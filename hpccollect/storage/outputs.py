"""Where a command writes: an output path checked before anything is read or started, so that a
path of the wrong kind, or one in a directory that cannot be written, is one line naming it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from hpccollect.errors import ArgumentValueError
from hpccollect.storage.sink import dataset_format
from hpccollect.storage.unfinished import final_path

__all__ = [
    "check_absent",
    "check_final_name",
    "check_inputs_kept",
    "check_kind",
    "check_writable",
]


def check_absent(out: Path, overwrite: bool) -> None:
    """Refuse an output that exists, unless ``overwrite`` (it is then replaced)."""
    if out.exists() and not overwrite:
        raise ArgumentValueError(f"{out} already exists; pass --overwrite to replace it.")


def check_kind(out: Path, folder: bool, option: str = "--out") -> None:
    """Refuse a file where a folder goes, or a folder where a file goes."""
    if folder and out.exists() and not out.is_dir():
        raise ArgumentValueError(f"{option} {out} is a file; this output is a folder: give one.")
    if not folder and out.is_dir():
        raise ArgumentValueError(
            f"{option} {out} is a directory; give a file path, e.g. {option} {out / 'run.h5'}."
        )


def check_writable(out: Path, option: str = "--out", hint: str = "") -> None:
    """Refuse ``out`` when its directory cannot be made or written (``hint``: what else to
    try, added to the message). Nothing is left: a directory still to be made is made by the
    writer, once every check passed; this tries the nearest one that exists."""
    base = out.parent
    while not base.exists() and base != base.parent:
        base = base.parent
    probe = base / f".{out.name}.{os.getpid()}.write-test"
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        os.unlink(probe)
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ArgumentValueError(
            f"{option} {out}: cannot write in {out.parent} ({reason}); choose a writable "
            f"directory with {option}{hint}."
        ) from err


def check_final_name(out: Path, option: str = "--out") -> None:
    """Refuse the names a dataset has while it is written (``run.h5.partial``, and
    ``run.h5.partial.new`` while it is made): readers would take the finished file for an
    unfinished one, and a resumed run for one to repair or delete.

    Args:
        out: the output's path.
        option: the option that named it, for the message.

    Raises:
        ArgumentValueError: naming ``option`` and the finished name to give instead.
    """
    partial = dataset_format(out).partial_path(out)
    suffix = partial.name[len(out.name) :]  # what a file being written has after its name
    final = final_path(out)
    if final == out and out.name.endswith(suffix):
        final = out.with_name(out.name.removesuffix(suffix))
    if final != out:
        raise ArgumentValueError(
            f"{option} {out}: that is the name a dataset has while it is written; give the "
            f"finished name, {option} {final}."
        )


def check_inputs_kept(out: Path, inputs: Iterable[Path], what: str, option: str = "--out") -> None:
    """Refuse an output that is one of the files a command reads, or a folder that holds one:
    writing it would destroy what the command reads (through another path, a symlink or a
    hard link too).

    Args:
        out: the file or folder the command writes.
        inputs: the files it reads (for a merged view, its shards as well).
        what: the command, for the message ("merge", "export").
        option: the option that named ``out``.

    Raises:
        ArgumentValueError: naming ``option``, the input and what to do instead.
    """
    target = out.resolve()
    for path in inputs:
        if not path.exists():
            continue
        if (out.exists() and os.path.samefile(path, out)) or target in path.resolve().parents:
            held = "is" if not out.is_dir() else "holds"
            raise ArgumentValueError(
                f"{option} {out} {held} {path}, which the {what} reads; write the {what} elsewhere."
            )
