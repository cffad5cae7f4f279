"""Ends a process that hpccollect runs itself without Python's last collections over torch's
objects.

When Python exits, its cyclic garbage collector runs several full collections over every
object still tracked; with torch and tensordict imported that takes about 0.4 s of CPU (a
full ``gc.collect()`` takes 80-90 ms with torch 2.13 and Python 3.11 on this project's 2-core
machine), a quarter of a short process's life. ``freeze_survivors`` collects once, so that the
garbage cycles of the run still have their finalizers run, then freezes what is left
(``gc.freeze``), so that the collections at exit skip it.

Three kinds of process call it, each once its work is done and its files are closed: the
command line after its command (``hpccollect.app.cli.run``), a Multi collector's worker at
the exit that follows its collector (an ``atexit`` hook: a spawned one exits through Python's
teardown; a forked one leaves through ``os._exit`` and skips both), and a submitit job's rank
after it served. A user's own script is never
frozen. What freezing gives up: an object still reachable when it is called, in a cycle that
only the teardown of the modules breaks, no longer has its ``__del__`` run at exit, which
Python does not promise for objects alive at exit in any case.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_survivors"]


def freeze_survivors() -> None:
    """Collect the garbage cycles, then leave every object alive out of later collections."""
    gc.collect()
    gc.freeze()
