"""``launcher="mpi"``: the ranks of an ``mpiexec``/``srun`` job, each running the same script.

Every rank constructs the same collector: rank 0 gets it, the others serve it and exit, so the
script needs no branch on the rank. An uncaught exception on any rank aborts the whole job
(``MPI_Abort``) rather than leave the others waiting forever.
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

from hpccollect._exit import abort_job, end_job_at_exit, end_job_now_if_left_running
from hpccollect.errors import ArgumentValueError, CollectorTimeoutError
from hpccollect.launchers.base import Launcher, LaunchRequest
from hpccollect.launchers.launcher_watch import watch_launcher
from hpccollect.launchers.mpi_gather import check_gather, keep_gatherer_group, plan_gathering
from hpccollect.launchers.rank import LOST_RANK0_STATUS, RankArgs, serve_rank
from hpccollect.launchers.rendezvous import detect, env_port, on_one_node, recv_object, send_object
from hpccollect.transport.base import PeerLife
from hpccollect.transport.mpi4py_group import mpi4py_comm, quiesce

__all__ = ["MPILauncher", "serve"]

_START = 32766  # the tag of rank 0's RankArgs message
_HELLO = 32764  # the tag of a rank's first message: its host name and addresses
_WAIT_SLEEP = 0.02  # waits for start-up are long: test them rarely
_EXIT_LIMIT = 60.0  # seconds a finalised collector rank's C exit handlers may take


class MPILauncher(Launcher):
    """Rank 0 of an MPI job starts nothing: the other ranks exist already and are told how to join.

    Args:
        master_addr: the address rank 0 listens on (None: found, see ``rendezvous``).
        interface: the network interface rank 0 listens on, instead.
        gather: ``"node"``: each node's collector ranks form a group whose first rank (its
            gatherer) sends rank 0 their round as one batch (``mpi_gather``); ``k``: groups of
            ``k`` consecutive ranks; None: no gathering. Every rank must pass the same value.
        comm: the job's communicator (default ``MPI.COMM_WORLD``); a gatherer's collector passes
            its group (without ``gather``).
    """

    mpi_world = True

    @classmethod
    def from_request(cls, request: LaunchRequest) -> MPILauncher:
        """``launcher="mpi"``, listening where the request says (``--master-addr``)."""
        return cls(master_addr=request.master_addr, interface=request.interface)

    def __init__(
        self,
        master_addr: str | None = None,
        interface: str | None = None,
        gather: str | int | None = None,
        comm: Any = None,
    ) -> None:
        world = mpi4py_comm(on_one_node())
        self.gather = check_gather(gather)
        if comm is not None and self.gather is not None:
            raise ArgumentValueError(
                "MPILauncher takes gather= (to split MPI.COMM_WORLD itself) or comm= (a "
                "communicator already split), not both."
            )
        #: on rank 0 of a gathered job: the world ranks each gatherer collects from
        self.gathered: list[list[int]] | None = None
        if comm is None or comm == world:
            abort_on_uncaught(world)
            watch_launcher()  # a launcher that ends without passing SIGTERM on: launcher_watch
        self.comm = world if comm is None else comm
        if self.comm.Get_size() < 2:
            raise ArgumentValueError(
                "launcher='mpi' needs rank 0 and at least one collector rank: start the script "
                "with mpiexec -n N (N >= 2) or srun -n N, or use launcher='mp' to start the "
                "collector ranks as local processes."
            )
        #: a rank that collects for a gatherer, which waits for rank 0: two start-ups
        self._gathered_rank = False
        if self.gather is not None:
            plan = plan_gathering(world, self.gather)
            if plan.gathers:
                keep_gatherer_group(plan.lower)
            self._gathered_rank = plan.upper is None
            self.comm = plan.upper if plan.upper is not None else plan.lower
            if self.comm.Get_rank() == 0 and plan.lower is None:
                self.gathered = [group[1:] for group in plan.groups]
        size = self.comm.Get_size()
        #: a gathered job's communicator (None: MPI.COMM_WORLD), and its ranks' world numbers
        self.split_comm = None if self.comm == world else self.comm
        self.world_ranks: list[int] | None = None
        if self.split_comm is not None:
            self.world_ranks = list(
                self.comm.Get_group().Translate_ranks(list(range(size)), world.Get_group())
            )
        self.num_ranks = size - 1
        self.master_addr, self.interface = master_addr, interface
        self._rendezvous: Any = None
        self._hello: dict[int, tuple[str, list[str]]] | None = None
        self._start_timeout = 120.0

    @property
    def rendezvous(self) -> Any:
        """Where rank 0 listens (asked on rank 0 only): loopback when every rank runs on its host,
        else its address routed to the first rank elsewhere, unless ``master_addr``,
        ``interface`` or ``MASTER_ADDR`` choose (loopback refused when ranks run elsewhere)."""
        if self._rendezvous is None:
            remote = self._remote()
            environ: Any = os.environ
            if self.split_comm is not None:
                # the launcher's variables count the whole job; a gatherer ignores MASTER_ADDR
                kept = ("MASTER_ADDR",) if self.gather is not None else ()
                environ = {name: os.environ[name] for name in kept if name in os.environ}
            address = self.master_addr
            if address is None and self.interface is None and "MASTER_ADDR" not in environ:
                address = _reaching(remote) if remote else "127.0.0.1"
            found = detect(
                rank=self.comm.Get_rank(),
                world_size=self.comm.Get_size(),
                master_addr=address,
                interface=self.interface,
                environ=environ,
            )
            if remote:
                _refuse_loopback(found.master_addr, remote)
            self._rendezvous = found
        return self._rendezvous

    def _hellos(self) -> dict[int, tuple[str, list[str]]]:
        """Each collector rank's host name and addresses, from its first message (rank 0)."""
        if self._hello is None:
            self._hello = {
                rank: recv_object(
                    self.comm,
                    rank,
                    _HELLO,
                    self._start_timeout,
                    f"collector rank {self._name(rank)}'s first message",
                    _WAIT_SLEEP,
                )
                for rank in range(1, self.comm.Get_size())
            }
        return self._hello

    def _remote(self) -> dict[int, tuple[str, list[str]]]:
        """The collector ranks on another host than rank 0's."""
        here = socket.gethostname()
        return {rank: hello for rank, hello in self._hellos().items() if hello[0] != here}

    @property
    def shares_host(self) -> bool:  # type: ignore[override]
        return not self._remote()

    @property
    def default_port(self) -> int:  # type: ignore[override]
        if self.split_comm is not None and self.gather is None:
            return 0  # a gatherer's group: MASTER_PORT is rank 0's, maybe on this very host
        return env_port() or 0

    def enter(self, start_timeout: float) -> None:
        self._start_timeout = start_timeout
        if self.comm.Get_rank() == 0:
            return
        serve(start_timeout * (2 if self._gathered_rank else 1), self.comm)
        sys.stdout.flush()
        sys.stderr.flush()
        from mpi4py import MPI

        quiesce()  # no thread may still call MPI when it is finalised
        # a gatherer whose own ranks did not all stop: MPI_Finalize would wait for them
        end_job_now_if_left_running()
        MPI.Finalize()  # waits until rank 0 finalises too (at its exit)
        exit_finalized(0)

    def _name(self, rank: int) -> int:
        """Rank ``rank`` of this launcher's communicator by its number in the MPI job."""
        named = self.world_ranks
        return named[rank] if named else rank

    def address(self) -> str:
        return self.rendezvous.master_addr

    def left_running(self, ranks: Sequence[int]) -> None:
        """MPI cannot end one rank and ``MPI_Finalize`` would wait for it: the job ends when
        rank 0 exits, with status 0."""
        end_job_at_exit([self._name(r) for r in ranks], lost=True)

    def start(self, ranks: Sequence[RankArgs]) -> list[PeerLife | None]:
        self._hellos()  # taken in any case: every rank sends one
        for args in ranks:
            send_object(
                self.comm,
                args,
                args.rank,
                _START,
                args.start_timeout,
                f"handing rank {self._name(args.rank)} its arguments",
                _WAIT_SLEEP,
            )
        return [None] * len(ranks)


def _reaching(remote: dict[int, tuple[str, list[str]]]) -> str:
    """Rank 0's address on the interface that reaches the first collector rank elsewhere."""
    from hpccollect.transport.addresses import address_towards

    rank, (host, addresses) = next(iter(remote.items()))
    for addr in addresses:
        with contextlib.suppress(ArgumentValueError):
            mine = address_towards(addr)
            if not mine.startswith("127."):
                return mine
    raise ArgumentValueError(
        f"rank 0 on {socket.gethostname()} has no route to collector rank {rank} on {host} "
        f"(its addresses: {', '.join(addresses) or 'none'}): pass --master-addr (master_addr=) "
        "with an address of rank 0's host that the other nodes reach, or --interface."
    )


def _refuse_loopback(address: str, remote: dict[int, tuple[str, list[str]]]) -> None:
    """Refuse a rank 0 address that is loopback while collector ranks run on other hosts."""
    try:
        resolved = socket.gethostbyname(address)
    except OSError:
        return  # the store's own error names it
    if resolved.startswith("127."):
        hosts = sorted({host for host, _ in remote.values()})
        raise ArgumentValueError(
            f"rank 0 would listen on {address} ({resolved}, loopback on "
            f"{socket.gethostname()}), which collector ranks on {', '.join(hosts)} cannot "
            "reach: pass --master-addr (master_addr=) with an address of rank 0's host that "
            "they reach, or --interface (e.g. eth0), or neither: rank 0 then finds it."
        )


def exit_finalized(code: int = 0) -> NoReturn:
    """End this process, whose MPI is finalised, by C's ``exit``, not ``os._exit``.

    MPICH tells hydra a rank finalised in a C ``atexit`` hook; ``os._exit`` skips it, and hydra
    then takes the rank for dead and SIGKILLs the whole job, rank 0 mid-exit included. C's
    ``exit`` runs the libraries' exit handlers but not Python's teardown; the GIL stays held
    (``PyDLL``), so no other thread runs. A handler hanging ``_EXIT_LIMIT`` s has the Python
    stacks printed and ends the rank with status 1 (``faulthandler``)."""
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
    """Serve as a collector rank of an MPI job whose rank 0 constructs the collector with
    ``launcher="mpi"``, until rank 0 shuts it down (for scripts that branch on the rank). A
    rank 0 gone silent aborts the whole job: it would never finalise with this rank.

    Args:
        timeout: seconds to wait for rank 0 to construct its collector.
        comm: the MPI communicator of the job (default ``MPI.COMM_WORLD``).

    Raises:
        CollectorTimeoutError: rank 0 did not construct its collector within ``timeout``."""
    world = mpi4py_comm(on_one_node())
    comm = comm if comm is not None else world
    abort_on_uncaught(world)
    if comm.Get_rank() == 0:
        raise ArgumentValueError(
            "hpccollect.distributed.serve() runs the collector ranks (MPI ranks 1..N-1); on "
            "rank 0, construct DistributedDataCollector(..., launcher='mpi') instead."
        )
    from hpccollect.transport.addresses import host_addresses

    names = (f"collector rank {comm.Get_rank()}", "rank 0")  # this rank, and its rank 0
    if comm != world:  # a gathered job's group: say the ranks' numbers in the job
        me, first = comm.Get_group().Translate_ranks([comm.Get_rank(), 0], world.Get_group())
        names = (f"collector rank {me}", "rank 0" if first == 0 else f"its gatherer, rank {first},")
    hello = (socket.gethostname(), host_addresses())
    send_object(comm, hello, 0, _HELLO, timeout, "telling rank 0 where this rank runs", _WAIT_SLEEP)
    try:
        args: RankArgs = recv_object(comm, 0, _START, timeout, "rank 0's start", _WAIT_SLEEP)
    except CollectorTimeoutError as err:
        waited = names[1].rstrip(",")
        raise CollectorTimeoutError(
            f"MPI {names[0].removeprefix('collector ')} waited {timeout:g} s for {waited} to "
            "construct DistributedDataCollector(..., launcher='mpi'); every rank must construct "
            "it (or call hpccollect.distributed.serve()). Raise start_timeout if rank 0 does "
            "long work first."
        ) from err

    def end_job() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        abort_job(mpi4py_comm(), LOST_RANK0_STATUS)  # the whole job, whatever comm is

    if comm == world:
        serve_rank(args, end_lost=end_job)
    else:
        serve_rank(args, end_lost=end_job, comm=comm, names=names)


def abort_on_uncaught(comm: Any = None) -> None:
    """Make an uncaught exception here print itself with the rank and host, then abort the whole
    MPI job. ``comm``: None takes ``MPI.COMM_WORLD`` (imported only when an exception comes)."""
    if getattr(sys.excepthook, "_hpccollect_abort", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        nonlocal comm
        try:
            comm = comm if comm is not None else mpi4py_comm(on_one_node())
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
    """``abort_on_uncaught`` when several ranks run under hydra or Open MPI; called on loading
    ``hpccollect.distributed``, so an exception before any collector ends the job too."""
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        if os.environ.get(name, "1").strip() not in ("", "0", "1"):
            with contextlib.suppress(ImportError):
                import mpi4py  # noqa: F401 - only a check that it is there

                abort_on_uncaught()
            return
