"""A progress line for collection runs: a live bar on a terminal, periodic lines in batch logs."""

from __future__ import annotations

import re
import sys
import time
from typing import TextIO

__all__ = ["Progress", "show_warning_line"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def show_warning_line(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """A ``warnings.showwarning`` that prints ``hpccollect: warning: <first line>``, like the
    errors: no source path, no code line, no colour codes."""
    text = _ANSI.sub("", str(message)).strip()
    first = text.splitlines()[0] if text else category.__name__
    print(f"hpccollect: warning: {first}", file=file if file is not None else sys.stderr)


class Progress:
    """Shows frames, frames/s while collecting (from the first batch request, start-up
    excluded), episodes kept and the mean return of the last 100 kept episodes.

    On a terminal the line is redrawn in place (at most 10 times a second); otherwise (a SLURM
    log, a pipe) a full line is printed every ``log_every`` seconds, so logs stay readable.
    """

    def __init__(self, total: int, stream: TextIO | None = None, log_every: float = 10.0) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.log_every = log_every
        self.start = time.perf_counter()
        self._last = 0.0
        self._drawn = False

    def line(self, frames: int, episodes: int, mean_return: float | None) -> str:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        width = 24
        filled = min(width, int(width * frames / max(self.total, 1)))
        ret = "-" if mean_return is None else f"{mean_return:.1f}"
        return (
            f"[{'#' * filled}{'.' * (width - filled)}] {frames}/{self.total} frames  "
            f"{frames / elapsed:,.0f} frames/s while collecting  {episodes} episodes  "
            f"mean return {ret} (last 100 episodes)"
        )

    def update(self, frames: int, episodes: int, mean_return: float | None) -> None:
        """Show progress; ``frames == 0`` marks the start of collection (rates count from it)."""
        now = time.perf_counter()
        if frames == 0:
            self.start = now
            return
        if now - self._last < (0.1 if self.tty else self.log_every) and frames < self.total:
            return
        self._last = now
        text = self.line(frames, episodes, mean_return)
        if self.tty:
            self.stream.write("\r" + text)
            self._drawn = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
