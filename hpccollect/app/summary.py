"""What a collection job did and kept, as the command line prints it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Summary"]


@dataclass
class Summary:
    """What a run did and kept.

    ``collecting`` runs from the first batch request to the last batch written (the progress
    line's clock); ``elapsed`` is the whole run, start-up (env probe, worker start) and shutdown
    included. ``path`` is None when nothing was written (stopped during start-up).
    """

    frames: int
    episodes: int
    committed_steps: int
    returns: list[float]
    collecting: float
    elapsed: float
    path: Path | None
    stopped_by: str | None
    resumed: str | None = None  # a resumed run: what the run now holds

    @property
    def frames_per_second(self) -> float:
        """Frames per second while collecting (start-up and shutdown excluded)."""
        return self.frames / max(self.collecting, 1e-9)

    def lines(self) -> list[str]:
        if self.path is None:
            return [
                f"stopped by {self.stopped_by} during start-up, before the first batch: "
                "nothing was collected and no dataset was written"
            ]
        overall = self.frames / max(self.elapsed, 1e-9)
        out = [
            f"frames collected  {self.frames}  ({self.frames_per_second:,.0f} frames/s while "
            f"collecting, {self.collecting:.1f} s; {overall:,.0f} frames/s incl. start-up and "
            f"shutdown, {self.elapsed:.1f} s)"
        ]
        out.append(f"episodes kept     {self.episodes}  ({self.committed_steps} steps)")
        if self.returns:
            std = statistics.pstdev(self.returns) if len(self.returns) > 1 else 0.0
            out.append(
                f"episode return    mean {statistics.fmean(self.returns):.2f}  std {std:.2f}  "
                f"min {min(self.returns):.2f}  max {max(self.returns):.2f}  "
                f"(all {len(self.returns)} kept episodes)"
            )
        out.append(f"dataset           {self.path}")
        if self.resumed:
            out.append(f"resumed run       {self.resumed}")
        if self.stopped_by:
            out.append(
                f"stopped early by {self.stopped_by}: every committed episode was kept, "
                "episodes in progress were written as truncated"
            )
        return out
