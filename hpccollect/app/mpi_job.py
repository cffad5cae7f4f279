"""``python -m hpccollect collect`` under ``mpiexec -n N`` or ``srun``: every rank runs the same
command; rank 0 is a ``DistributedDataCollector`` (``launcher="mpi"``) and ranks 1..N-1 its
collector ranks, each running the ``--collector`` over ``--num-workers``/``--num-envs``.

Start-up is agreed before any collector starts (``hpccollect.app.agreement``): every rank builds the
MPI launcher, rank 0 reads the run to resume (``--resume``) and checks the env, the output and the
policy, and every rank ends at once with the first error's code if any rank found one. Once the collector exists, a failure on any rank
aborts the whole MPI job (``MPI_Abort``): a rank that just returned would leave the others
waiting forever.

The dataset: rank 0 writes what it receives into ``--out``; with ``--shards`` each collector
rank writes its own shard (``run.shards/rank-0001.h5`` for ``run.h5``) as it collects and sends
rank 0 only reports of what it wrote (``rank_reports``: frames, episodes, returns, committed
counts), and rank 0 writes ``--out`` at the end as a merged virtual view over them. The shards of a run share one
``run_id`` and trajectory ids are unique across ranks, so the merged view keeps every id.

Signals: the collector ranks ignore SIGTERM and SIGINT (the launcher forwards them to every
rank); rank 0 stops after its current batch as in a local run (with --shards at once: it holds
no batch), shuts the collector down (each rank then closes its shard) and writes the merged
view. Under Open MPI, whose ``mpirun`` kills every rank a quarter of a second after it passes
SIGTERM on, rank 0 does not wait for the batches under way either: it closes the file with what
was committed, or has the ranks close their shards, within that time.
"""

from __future__ import annotations

import functools
import math
import os
import re
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpccollect._exit import abort_job
from hpccollect._signals import ignore_stop_signals
from hpccollect.app.agreement import Describe, agree
from hpccollect.app.config import WORKER_START, RunConfig
from hpccollect.app.lifecycle import Job, Progress
from hpccollect.app.preflight import check_output, env_maker, probe_policy, record, resolve_env
from hpccollect.app.resume import Attempt, remove_run_files, start_attempt
from hpccollect.app.signals import StopSignals
from hpccollect.app.summary import Summary
from hpccollect.collectors.workers.cadence import DEFAULT_REPORT_INTERVAL
from hpccollect.collectors.workers.reports import ReportTally
from hpccollect.distributed import DistributedDataCollector
from hpccollect.errors import ArgumentValueError, StorageError
from hpccollect.launchers import get_launcher
from hpccollect.launchers.mpi import MPILauncher, abort_on_uncaught
from hpccollect.launchers.rendezvous import launched_ranks, on_one_node
from hpccollect.storage import Sink, dataset_format, open_sink
from hpccollect.transport.control import DEFAULT_LIVENESS_TIMEOUT
from hpccollect.transport.mpi4py_group import mpi4py_comm

__all__ = ["MPICollect", "open_shard", "shard_name"]

_SHARD_WAIT = 60.0  # s rank 0 waits for the ranks to close their shards after shutdown
_POLL = 0.02


def shard_name(rank: int, attempt: Attempt | None = None) -> str:
    """The shard of collector rank ``rank``, in a fresh run or a resumed ``attempt``."""
    return f"rank-{rank:04d}.h5" if attempt is None else attempt.shard_name(rank)


def open_shard(
    folder: str, rank: int, *, names: Callable[[int], str], imports: tuple[str, ...], **writer: Any
) -> Sink:
    """The shard collector rank ``rank`` writes (called there, as ``rank_sink``)."""
    resolve_env(writer["env"], imports)  # the env's module registers it on this rank too
    return open_sink(Path(folder) / names(rank), shard=rank, **writer)


class MPICollect:
    """This rank's part of a distributed ``collect``; ``run()`` on every rank. On rank 0 it is
    the job's ``Part`` (``lifecycle.py``): the collector is a ``DistributedDataCollector``
    over the MPI job's other ranks, the sink rank 0's dataset (or, with ``--shards``, a tally
    while each rank writes its own shard)."""

    who = "a collector rank"

    def __init__(self, cfg: RunConfig, resolve: Callable[[], RunConfig] | None = None) -> None:
        """``resolve``: rank 0 calls it during its start-up checks for the run's options
        (``--resume``: only rank 0 reads the run)."""
        self.cfg = self.run_cfg = cfg
        self.resolve = resolve
        self.attempt: Attempt | None = None
        self.comm = mpi4py_comm(on_one_node())  # MPI starts here
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        if self.size > 1:
            abort_on_uncaught(self.comm)
        if self.rank:  # the launcher forwards signals to every rank; rank 0 decides
            ignore_stop_signals()
        self.describe_error: Describe | None = None
        #: on rank 0 with --gather: the ranks each group's first rank collects from
        self.gathered: list[list[int]] | None = None
        self.announce: Callable[[MPICollect], None] | None = None
        self.run_id = uuid.uuid4().hex

    @property
    def reports(self) -> bool:
        """With --shards rank 0 takes only the ranks' reports (see ``lifecycle.Part``)."""
        return bool(self.cfg.shards)

    @property
    def ranks(self) -> int:
        """Collector ranks (every MPI rank but 0)."""
        return self.size - 1

    @property
    def collecting(self) -> int:
        """Collector ranks that collect (with --gather, each group's first rank does not)."""
        if self.gathered is None:
            return self.ranks
        return sum(len(group) for group in self.gathered)

    def abort(self, code: int) -> None:
        """End every rank of the job with ``code`` (after this rank printed why)."""
        if self.size > 1:
            abort_job(self.comm, code)

    def run(
        self,
        on_progress: Progress | None,
        describe: Describe,
        announce: Callable[[MPICollect], None] | None = None,
    ) -> Summary | None:
        """Rank 0: collect and return the summary. Other ranks serve rank 0 and end the process
        when it is done (None if that ever returns). ``JobEnded`` when start-up failed.
        ``announce(self)``: on rank 0 once every rank passed its start-up checks."""
        self.describe_error, self.announce = describe, announce
        if self.rank:
            launcher = agree(self.comm, self._launcher, describe)
            DistributedDataCollector(env_maker(self.cfg), None, **self._arguments(launcher))
            return None
        return Job(self).run(on_progress)

    # ------------------------------------------------------------------ rank 0: the job's part
    def build(self, stop: StopSignals) -> Any:
        """Agree with every rank to start, then build the collector."""

        def checks() -> tuple[Any, Any]:
            with stop.deferred():  # collective calls: every rank must take part
                launcher = self._launcher()
            policy = self._check()
            self._check_groups(getattr(launcher, "gathered", None))
            return launcher, policy

        launcher, policy = agree(self.comm, checks, self.describe_error, stop)
        self.gathered = getattr(launcher, "gathered", None)  # --gather: each group's ranks
        if self.announce is not None:
            self.announce(self)
        if self.cfg.overwrite:  # an earlier run's shards go, so none is taken for this run's
            remove_run_files(self.cfg.output)
        with stop.deferred():  # cut in half, the ranks' state would be unknown
            return DistributedDataCollector(
                env_maker(self.cfg), policy, **self._arguments(launcher)
            )

    def open_sink(self, stop: StopSignals) -> Sink:
        cfg = self.cfg
        if cfg.shards:
            return ReportTally()
        with stop.deferred():
            return open_sink(
                cfg.output if self.attempt is None else self.attempt.output,
                expected_rows=cfg.total_frames,
                **self._writer_args(),
            )

    def shut_down(self, collector: Any, discard: bool) -> None:
        """Stop the collector ranks (each closes its shard); ``discard``: a stop before the
        first batch keeps no shard."""
        collector.shutdown()
        if discard and self.cfg.shards:
            self._drop_shards(self._await_shards())

    def where(self) -> Path:
        return self.cfg.shards_dir if self.cfg.shards else self.cfg.output

    def kept(self, sink: Sink, frames: int) -> tuple[int, int, list[float], Path] | None:
        if sink.path is not None:
            return sink.committed_episodes, sink.committed_steps, list(sink.returns), sink.path
        # the shards say: a stop cuts rank 0's wait, maybe before any report came
        merged = self._merge()
        return None if merged is None else (*merged, self.cfg.output)

    def _launcher(self) -> Any:
        if self.size == 1 and launched_ranks() > 1:
            raise ArgumentValueError(
                f"the launcher started {launched_ranks()} processes but MPI sees only this one: "
                "start the job with the mpiexec of the MPI library mpi4py uses (or srun with "
                "its PMI plug-in), or pass --launcher none to run one job per process."
            )
        name = self.cfg.launcher or "mpi"
        if self.size == 1:
            raise ArgumentValueError(
                f"--launcher {name} needs rank 0 and at least one collector rank: start the job "
                f"with mpiexec -n N or srun -n N (N >= 2), or drop --launcher {name} to collect "
                "in one process."
            )
        gather = self.cfg.gather
        if gather is not None:  # collective: every rank builds it alike, and fails alike
            try:
                return MPILauncher(self.cfg.master_addr, self.cfg.interface, gather=gather)
            except ArgumentValueError as err:  # said in the command line's words
                why = re.sub(r"^gather=\S+ ", "", str(err)).replace("pass gather=None", "drop it")
                raise ArgumentValueError(f"--gather {gather} {why}") from None
        return get_launcher(name, master_addr=self.cfg.master_addr, interface=self.cfg.interface)

    def _check(self) -> Any:
        """Rank 0's checks before anything starts (the run to resume, env, output, shards
        folder); the policy."""
        if self.resolve is not None:
            self.cfg = self.run_cfg = self.resolve()
        cfg = self.cfg
        resolve_env(cfg.env, cfg.imports)
        if cfg.resume is not None:
            self.attempt = start_attempt(cfg)
            self.cfg = self.attempt.cfg
            if cfg.shards:
                check_output(cfg.shards_dir / self.attempt.shard_name(1), False)
            return probe_policy(self.cfg, env_maker(cfg), seed=cfg.seed)
        check_output(cfg.output, cfg.overwrite)  # also refuses an earlier run's shards
        if cfg.shards:
            check_output(cfg.shards_dir / shard_name(1), True)  # the ranks write there
        return probe_policy(cfg, env_maker(cfg))

    def _check_groups(self, groups: list[list[int]] | None) -> None:
        """With --gather, each batch rank 0 takes is one group's round, split evenly among its
        collecting ranks and their envs (as ``_check_batch_split`` does without groups), so
        that ``--total-frames`` is collected exactly."""
        if not groups:
            return
        cfg = self.cfg
        sizes = sorted({len(group) for group in groups})
        unit = math.lcm(*(size * cfg.env_copies for size in sizes))
        if cfg.frames_per_batch % unit:
            lower = cfg.frames_per_batch // unit * unit
            values = " or ".join(str(v) for v in (lower, lower + unit) if v > 0)
            raise ArgumentValueError(
                f"--frames-per-batch {cfg.frames_per_batch} cannot be split over a group: with "
                f"--gather {cfg.gather} each batch is one group's round, shared by its "
                f"{' or '.join(map(str, sizes))} collecting rank(s) x {cfg.env_copies} env(s); "
                f"pass a multiple of {unit} ({values})."
            )

    def _arguments(self, launcher: Any) -> dict[str, Any]:
        """The ``DistributedDataCollector`` arguments; the same on every rank."""
        cfg = self.cfg
        multi = cfg.collector != "single"
        sink = None
        if cfg.shards and self.rank == 0:
            sink = functools.partial(
                open_shard,
                str(cfg.shards_dir.resolve()),
                names=functools.partial(shard_name, attempt=self.attempt),
                imports=tuple(cfg.imports),
                expected_rows=max(1, cfg.total_frames // self.ranks),
                **self._writer_args(),
            )
        return dict(
            frames_per_batch=cfg.frames_per_batch,
            total_frames=cfg.total_frames,
            max_frames_per_traj=-1 if cfg.max_steps is None else cfg.max_steps,
            collector_class=cfg.collector,
            collector_kwargs=(
                {"worker_timeout": cfg.worker_timeout, "mp_start_method": WORKER_START}
                if multi
                else None
            ),
            num_workers_per_collector=cfg.num_workers if multi else 1,
            sync=False,
            backend=cfg.backend or "gloo",
            launcher=launcher,
            worker_timeout=cfg.worker_timeout,
            on_worker_failure=cfg.on_rank_failure or "raise",
            liveness_timeout=cfg.liveness_timeout or DEFAULT_LIVENESS_TIMEOUT,
            rank_sink=sink,
            rank_reports=bool(cfg.shards),
            report_interval=cfg.report_interval or DEFAULT_REPORT_INTERVAL,
        )

    def _writer_args(self) -> dict[str, Any]:
        cfg = self.cfg
        return dict(
            env=cfg.env,
            env_kwargs=dict(cfg.env_kwargs),
            run_id=self.run_id,
            config={
                **record(self.run_cfg, self.attempt),
                "launcher": "mpi",
                "backend": cfg.backend or "gloo",
                "collector_ranks": self.ranks,
                **({} if self.gathered is None else {"collecting_ranks": self.collecting}),
            },
            seed=cfg.seed,
            compression=None if cfg.compression == "none" else cfg.compression,
            overwrite=cfg.overwrite,
        )

    def _await_shards(self) -> list[Path]:
        """The ranks' shard files once each rank has closed its own (they do after rank 0's
        shutdown)."""
        folder = self.cfg.shards_dir
        paths = [folder / shard_name(rank, self.attempt) for rank in range(1, self.size)]
        partial_path = dataset_format(self.cfg.output).partial_path
        deadline = time.monotonic() + _SHARD_WAIT
        while True:
            open_ = [p for p in paths if partial_path(p).exists() or not p.exists()]
            if not open_:
                return paths
            if time.monotonic() > deadline:
                raise StorageError(
                    f"{open_[0]} was not closed within {_SHARD_WAIT:g} s of the end of the run "
                    f"({len(open_)} shard(s) unfinished); its committed episodes are readable: "
                    f"python -m hpccollect repair {partial_path(open_[0])}, then merge the shards."
                )
            time.sleep(_POLL)

    def _drop_shards(self, paths: list[Path]) -> None:
        """Remove this attempt's shards (and the folder, once empty)."""
        for path in paths:
            path.unlink(missing_ok=True)
        if not any(self.cfg.shards_dir.iterdir()):
            self.cfg.shards_dir.rmdir()

    def _merge(self) -> tuple[int, int, list[float]] | None:
        """Write ``--out`` as the merged view over the ranks' shards; its episodes, steps and
        returns. None, and the shards removed, when no rank wrote a batch."""
        fmt = dataset_format(self.cfg.output)
        shards = []
        paths = self._await_shards()
        for path in paths:
            with fmt.open(path) as ds:
                if ds.keymap:  # a rank stopped before its first batch has no columns
                    shards.append(path)
        if not shards:
            self._drop_shards(paths)
            return None
        if self.attempt is not None:
            self.attempt.publish(shards)
        else:
            fmt.merge(shards, self.cfg.output, overwrite=self.cfg.overwrite)
        with fmt.open(self.cfg.output) as ds:
            return ds.committed_episodes, len(ds), ds.returns().tolist()

    def describe(self) -> str:
        """What the job runs, for the line before the progress bar."""
        cfg = self.cfg
        inner = (
            f"{cfg.num_workers} process(es) x {cfg.num_envs} env(s)"
            if cfg.collector != "single"
            else f"{cfg.num_envs} env(s)"
        )
        where = f"{cfg.output} (shards in {cfg.shards_dir})" if cfg.shards else str(cfg.output)
        ranks = f"{self.ranks} collector rank(s)"
        if self.gathered is not None:
            ranks = (
                f"{self.collecting} collector rank(s) in {len(self.gathered)} group(s), each "
                "sent on by its own first rank"
            )
        return (
            f"collecting {cfg.total_frames} frames of {cfg.env} with {ranks} "
            f"({cfg.backend or 'gloo'}, rank 0 on {socket.gethostname()}, pid "
            f"{os.getpid()}), each {cfg.collector} ({inner}) -> {where}"
        )
