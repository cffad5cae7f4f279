"""``launcher="mpi"``: the ranks of an ``mpiexec``/``srun`` job, each running the same script.

Every rank constructs the same ``DistributedDataCollector``. On rank 0 the constructor returns
the collector; on every other rank it serves rank 0 (``serve``) and then ends the process with
status 0, so the script needs no branch on the rank. Rank 0 hands each rank its ``RankArgs``
over the MPI communicator; the collector's data then travels over the chosen backend (gloo
through rank 0's store, or MPI itself).

Under ``mpiexec`` a rank that exits with an error leaves the others waiting forever, so an
uncaught exception on any rank prints its traceback, names the rank and host, and aborts the
whole job (``MPI_Abort``). A rank killed by a signal ends the whole job too: hydra and srun tear
every rank down, so under MPI a job cannot go on without a lost rank.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from hpccollect.errors import ArgumentValueError, CollectorTimeoutError
from hpccollect.launchers.base import Launcher
from hpccollect.launchers.rank import RankArgs, serve_rank
from hpccollect.transport.base import PeerLife
from hpccollect.transport.mpi4py_group import abort_job, mpi4py_comm, quiesce
from hpccollect.transport.mpi_waits import recv_object, send_object

__all__ = ["MPILauncher", "serve"]

_START = 32766  # the tag of rank 0's RankArgs message
_WAIT_SLEEP = 0.02  # waits for start-up are long: test them rarely
_EXIT_LIMIT = 60.0  # seconds a finalised collector rank's C exit handlers may take


class MPILauncher(Launcher):
    """Rank 0 of an MPI job starts nothing: the other ranks exist already, and are told how to
    join. ``master_addr``/``interface`` choose where rank 0 listens (default: loopback when
    every rank is on this node, see ``hpccollect.transport.rendezvous``)."""

    mpi_world = True

    def __init__(self, master_addr: str | None = None, interface: str | None = None) -> None:
        self.comm = mpi4py_comm()
        abort_on_uncaught(self.comm)
        size = self.comm.Get_size()
        if size < 2:
            raise ArgumentValueError(
                "launcher='mpi' needs rank 0 and at least one collector rank: start the script "
                "with mpiexec -n N (N >= 2) or srun -n N, or use launcher='mp' to start the "
                "collector ranks as local processes."
            )
        self.num_ranks = size - 1
        self.master_addr, self.interface = master_addr, interface
        self._rendezvous: Any = None

    @property
    def rendezvous(self) -> Any:
        """Where rank 0 listens (only rank 0 asks: the ranks get it with their arguments, so no
        collective call is made whose presence would depend on rank 0's arguments)."""
        if self._rendezvous is None:
            from hpccollect.transport.rendezvous import detect

            self._rendezvous = detect(
                rank=self.comm.Get_rank(),
                world_size=self.comm.Get_size(),
                master_addr=self.master_addr,
                interface=self.interface,
            )
        return self._rendezvous

    @property
    def shares_host(self) -> bool:  # type: ignore[override]
        return self.rendezvous.local_size == self.comm.Get_size()

    @property
    def default_port(self) -> int:  # type: ignore[override]
        return self.rendezvous.port or 0

    def enter(self, start_timeout: float) -> None:
        if self.comm.Get_rank() == 0:
            return
        serve(start_timeout, self.comm)
        sys.stdout.flush()
        sys.stderr.flush()
        from mpi4py import MPI

        quiesce()  # no thread may still call MPI when it is finalised
        MPI.Finalize()  # waits until rank 0 finalises too (at its exit)
        exit_finalized(0)

    def address(self) -> str:
        return self.rendezvous.master_addr

    def start(self, ranks: Sequence[RankArgs]) -> list[PeerLife | None]:
        for args in ranks:
            send_object(
                self.comm,
                args,
                args.rank,
                _START,
                args.start_timeout,
                f"handing rank {args.rank} its arguments",
                _WAIT_SLEEP,
            )
        return [None] * len(ranks)


def exit_finalized(code: int = 0) -> NoReturn:
    """End this process, whose MPI is finalised, without returning to the script (a collector
    rank inside the collector's constructor), by C's ``exit``: not ``os._exit``.

    MPICH tells its process manager that a rank finalised (PMI ``finalize``) in a C ``atexit``
    hook, not in ``MPI_Finalize``. ``os._exit`` skips that hook, and hydra takes a rank whose
    PMI connection closes without it for a rank that died: it SIGKILLs every other process of
    the job, rank 0 included, which is then in the middle of its own exit (the job ends
    "killed by signal 9", or with status 0 but rank 0 cut short, as hydra's bookkeeping
    happens to go). C's ``exit`` runs the libraries' exit handlers, MPICH's among them, but
    not Python's teardown, as ``os._exit``; the GIL stays held (``PyDLL``), so no other Python
    thread runs meanwhile. Bounded: an exit handler that hangs for ``_EXIT_LIMIT`` s has this
    rank's Python stacks printed and ends it with status 1 (``faulthandler``'s watchdog)."""
    sys.stdout.flush()
    sys.stderr.flush()
    faulthandler.dump_traceback_later(_EXIT_LIMIT, exit=True)
    try:
        libc = ctypes.PyDLL(None)
        libc.exit.argtypes = [ctypes.c_int]
        libc.exit(code)
    finally:  # no C library to call (not reached once exit runs)
        os._exit(code)


def serve(timeout: float = 120.0, comm: Any = None) -> None:
    """Run this process as a collector rank of an MPI job whose rank 0 constructs
    ``DistributedDataCollector(..., launcher="mpi")``; returns once rank 0 shut the collector
    down. For scripts that branch on the rank themselves (``launcher="mpi"`` calls it for you).
    ``timeout``: seconds to wait for rank 0 to construct its collector."""
    comm = comm if comm is not None else mpi4py_comm()
    abort_on_uncaught(comm)
    if comm.Get_rank() == 0:
        raise ArgumentValueError(
            "hpccollect.distributed.serve() runs the collector ranks (MPI ranks 1..N-1); on "
            "rank 0, construct DistributedDataCollector(..., launcher='mpi') instead."
        )
    try:
        args: RankArgs = recv_object(comm, 0, _START, timeout, "rank 0's start", _WAIT_SLEEP)
    except CollectorTimeoutError as err:
        raise CollectorTimeoutError(
            f"MPI rank {comm.Get_rank()} waited {timeout:g} s for rank 0 to construct "
            "DistributedDataCollector(..., launcher='mpi'); every rank must construct it (or "
            "call hpccollect.distributed.serve()). Raise start_timeout if rank 0 does long work "
            "first."
        ) from err
    serve_rank(args)


def abort_on_uncaught(comm: Any = None) -> None:
    """Make an uncaught exception in this process end the whole MPI job (after printing it,
    with the rank and host), instead of leaving the other ranks waiting. ``comm``: None takes
    ``MPI.COMM_WORLD`` when an exception comes (mpi4py is imported only then)."""
    if getattr(sys.excepthook, "_hpccollect_abort", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        nonlocal comm
        try:
            comm = comm if comm is not None else mpi4py_comm()
            previous(kind, value, tb)
            sys.stderr.write(
                f"hpccollect: {kind.__name__} on MPI rank {comm.Get_rank()} of "
                f"{comm.Get_size()} ({socket.gethostname()}); aborting the whole job.\n"
            )
            sys.stderr.flush()
            sys.stdout.flush()
        finally:
            abort_job(comm, 130 if issubclass(kind, KeyboardInterrupt) else 1)

    hook._hpccollect_abort = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def abort_on_uncaught_under_mpiexec() -> None:
    """``abort_on_uncaught`` when this process is one of several started by an MPI launcher
    (MPICH's hydra or Open MPI): called when ``hpccollect.distributed`` is loaded, so that an
    exception before any collector exists ends the job too."""
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        if os.environ.get(name, "1").strip() not in ("", "0", "1"):
            with contextlib.suppress(ImportError):
                import mpi4py  # noqa: F401 - only a check that it is there

                abort_on_uncaught()
            return
