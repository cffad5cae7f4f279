"""The end of a process that hpccollect runs itself, without the interpreter's last pass over
every object torch made.

When Python exits, its cyclic garbage collector walks every object still tracked, and with
torch and tensordict imported that walk, with what it sets off, takes about 0.4 s of CPU
(torch 2.13, Python 3.11, this project's 2-core machine), which is a quarter of a short
process's life. A job pays it once per process: the command line, every worker, every rank,
every fork server. ``gc.freeze()`` moves the objects alive now out of the collector's sight,
so that last pass skips them.

Only the processes whose whole life is hpccollect's call ``freeze_survivors``, and only once
their work is done and their files closed: ``python -m hpccollect`` after its command, a
worker after its collector, a job's fork server once it has imported what its processes
share (``collectors/workers/server_frozen.py``). Nothing there needs a frozen object's
``__del__`` at exit: objects freed by their reference count still run it, and Python does not
promise it to objects alive at exit in any case. A user's own script is never frozen.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_survivors"]


def freeze_survivors() -> None:
    """Leave every object alive now out of the collections to come, the one at exit among
    them."""
    gc.freeze()
