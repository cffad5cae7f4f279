"""Where a command writes: an output path checked before anything is read or started, so that a
path of the wrong kind, or one in a directory that cannot be written, is one line naming it."""

from __future__ import annotations

import os
from pathlib import Path

from hpccollect.errors import ArgumentValueError

__all__ = ["check_kind", "check_output_path", "check_writable"]


def check_output_path(
    out: str | os.PathLike, *, overwrite: bool, folder: bool = False, option: str = "--out"
) -> Path:
    """Refuse an output that exists (unless ``overwrite``), is of the other kind, or lies in
    a directory that cannot be written.

    Args:
        out: the file (or, with ``folder``, the folder) to write.
        overwrite: whether an existing ``out`` may be replaced.
        folder: ``out`` is a folder (a memory-mapped TensorDict, a Minari dataset), not a file.
        option: the option that named ``out``, for the message.

    Returns:
        ``out`` as a path.

    Raises:
        ArgumentValueError: naming ``option`` and what to give instead.
    """
    out = Path(out)
    check_kind(out, folder, option)
    if out.exists() and not overwrite:
        raise ArgumentValueError(f"{out} already exists; pass --overwrite to replace it.")
    check_writable(out, option)
    return out


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
    try, added to the message)."""
    probe = out.parent / f".{out.name}.{os.getpid()}.write-test"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        os.unlink(probe)
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ArgumentValueError(
            f"{option} {out}: cannot write in {out.parent} ({reason}); choose a writable "
            f"directory with {option}{hint}."
        ) from err
