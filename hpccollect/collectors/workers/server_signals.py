"""Imported by a job's fork server (``fork_server.py``) before anything else it preloads, and
only there: the server ignores the stop signals, as every process of a job but the one that
runs it does (``hpccollect._signals``).

A scheduler signals every process of a job. Python's fork server leaves SIGTERM and SIGUSR1 to
their defaults, which end it, and a process forked from it learns its children's exit through
it: once it is gone, every worker or rank forked from it looks dead to the job (exit code 255),
and the job would fail instead of stopping after its batch.
"""

from __future__ import annotations

from hpccollect._signals import ignore_stop_signals

ignore_stop_signals()
