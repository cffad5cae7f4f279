"""Local worker processes: start them with a clean environment and give back one
``PipeChannel`` each (the pool in ``pool.py`` does the talking and the stopping).

Workers ignore SIGTERM and SIGINT (see ``worker.py``): a batch scheduler signals every process of
a job, and the stop belongs to the collector, which sends ``SHUTDOWN``. A worker that does not
obey in time is killed with SIGKILL (``PipeChannel.kill``). Workers exit by themselves when the
collector's end of their pipe closes.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from hpccollect.errors import ArgumentValueError
from hpccollect.transport.pipe import PipeChannel

if TYPE_CHECKING:
    from hpccollect.collectors.workers.fork_server import JobForkServer

__all__ = ["LAUNCHER_PREFIXES", "clean_env", "start_local_workers"]

#: Environment variables a worker must not inherit: it would believe it is an MPI rank or a
#: SLURM step of its own and, for instance, call MPI_Init against the parent's launcher.
LAUNCHER_PREFIXES = (
    "OMPI_",
    "PMI_",
    "PMIX_",
    "MPI_",
    "MPICH_",
    "HYDRA_",
    "I_MPI_",
    "MV2_",
    "SLURM_",
)


@contextlib.contextmanager
def clean_env(prefixes: Sequence[str] = LAUNCHER_PREFIXES) -> Iterator[None]:
    """Remove launcher variables from ``os.environ`` while child processes are started."""
    removed = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith(tuple(prefixes))}
    try:
        yield
    finally:
        os.environ.update(removed)


def start_local_workers(
    target: Callable,
    args: Sequence[tuple],
    start_method: str = "spawn",
    name: str = "worker",
    daemon: bool = True,
    fork_server: JobForkServer | None = None,
) -> list[PipeChannel]:
    """Start one process per entry of ``args``, each running ``target(index, conn, *args[i])``.

    Args:
        start_method: ``"spawn"`` (default), ``"forkserver"`` or ``"fork"``.
        name: prefix of the process names.
        daemon: False for workers that start processes of their own (a multi-process collector
            inside a worker); the pool still ends them at shutdown and at exit.
        fork_server: a started ``JobForkServer``: the processes fork from it instead
            (``start_method`` is then not used).

    Returns:
        The collector's end of each worker's pipe; on any failure (a signal included) every
        process started so far is killed before the exception propagates.
    """
    methods = mp.get_all_start_methods()
    if fork_server is None and start_method not in methods:
        raise ArgumentValueError(
            f"mp_start_method={start_method!r} is not available here; use one of {methods}."
        )
    channels: list[PipeChannel] = []
    forking = (
        fork_server.forking()
        if fork_server is not None
        else contextlib.nullcontext(mp.get_context(start_method))
    )
    try:
        with forking as ctx:
            _start_each(ctx, target, args, name, daemon, channels)
    except BaseException:
        for channel in channels:
            channel.life.kill()
            channel.close()
        raise
    return channels


def _start_each(
    ctx: Any, target: Callable, args: Sequence[tuple], name: str, daemon: bool, channels: list
) -> None:
    if ctx.get_start_method() == "fork":
        # garbage of this process's cycles not collected yet would be collected in each child
        # as soon as it allocates; among it, objects whose end is not safe after a fork (an MPI
        # communicator, a gloo context and its threads): a child segfaulted so, in a test run
        gc.collect()
    for index, extra in enumerate(args):
        parent, child = ctx.Pipe()
        process = ctx.Process(
            target=target, args=(index, child, *extra), name=f"{name}-{index}", daemon=daemon
        )
        # kept before it starts, so an exception (a signal) during start() still finds it
        channels.append(PipeChannel(parent, process))
        with clean_env():
            process.start()
        child.close()
