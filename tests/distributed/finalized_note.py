"""Imported first by mpi_job.py, so that its exit hook is registered before hpccollect's and
runs after them: it writes whether MPI was finalised before Python's teardown
(``OUT.finalized``). The collector ranks wait in ``MPI_Finalize`` until rank 0 finalises too,
and mpi4py would do it only after the teardown. Only rank 0 exits through Python's exit hooks.
"""

from __future__ import annotations

import atexit
import sys
from pathlib import Path


@atexit.register
def _note_finalized() -> None:
    if "mpi4py.MPI" in sys.modules:
        from mpi4py import MPI

        Path(f"{sys.argv[1]}.finalized").write_text(str(MPI.Is_finalized()))
