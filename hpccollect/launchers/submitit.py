"""``launcher="submitit"`` and ``"submitit_delayed"``: collector ranks as submitit jobs.

``"submitit"`` submits one job per collector rank; ``"submitit_delayed"`` one job whose task
``k`` serves rank ``k + 1``. Rank 0, the calling process, listens on loopback when the ranks run
on this host, else on its address routed to the cluster's nodes.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpccollect._exit import freeze_survivors
from hpccollect.errors import ArgumentTypeError, ArgumentValueError
from hpccollect.launchers.base import Launcher, LaunchRequest
from hpccollect.launchers.rank import RankArgs, serve_rank
from hpccollect.launchers.submitit_jobs import JobWatch, WatchedJob, cancel, slurm_nodes
from hpccollect.transport.base import PeerLife

__all__ = [
    "DEFAULT_SLURM_CONF",
    "DEFAULT_SLURM_CONF_MAIN",
    "TCP_PORT",
    "Packed",
    "SubmititLauncher",
    "SubmititRank",
    "serve_job",
    "serve_task",
]

CLUSTERS = ("slurm", "local")
_WATCH_PERIOD = 0.2  # s between looks at the local executor's jobs (SLURM's: 1 s)
#: minutes a job may run unless ``slurm_kwargs`` says (``timeout_min`` or ``slurm_time``)
DEFAULT_TIMEOUT_MIN = {"slurm": 60, "local": 7 * 24 * 60}
#: what a collection job of ``submitit_delayed_launcher`` asks of SLURM by default (TorchRL's
#: names; not its ``train`` partition and 32 CPUs, which most clusters lack)
DEFAULT_SLURM_CONF = {"timeout_min": DEFAULT_TIMEOUT_MIN["slurm"], "slurm_cpus_per_task": 1}
#: the same, for the main job of ``submitit_delayed_launcher``
DEFAULT_SLURM_CONF_MAIN = {"timeout_min": DEFAULT_TIMEOUT_MIN["slurm"], "slurm_cpus_per_task": 1}
#: TorchRL's fixed port for rank 0 (hpccollect's launchers take a free one: ranks learn it)
TCP_PORT = os.environ.get("TCP_PORT", "10003")


class SubmititRank(PeerLife):
    """One collector rank in a submitit job (its own, or a task of the shared one)."""

    def __init__(self, watched: WatchedJob, rank: int, task: int) -> None:
        self.watched, self.rank, self.task = watched, rank, task
        self.host = f"submitit job {watched.id}"
        task_of = f" task {task}" if len(watched.ranks) > 1 else ""
        self.where = f"submitit job {watched.id}{task_of}, log {watched.log(task)}"
        self.sentinel: int | None = os.dup(watched.read_fd)  # ranks of one job: one fd each

    def death(self, wait: float = 0.0) -> str | None:
        if self.watched.ended is None and wait > 0:
            self.watched.event.wait(wait)
        return self.watched.ended or self.watched.pending_too_long()

    def join(self, timeout: float) -> bool:
        return self.watched.event.wait(max(0.0, timeout))

    def kill(self) -> None:
        """Cancel the job once every rank it runs is to be killed."""
        self.watched.killed.add(self.rank)
        if self.watched.killed >= self.watched.ranks:
            cancel(self.watched)

    def close(self) -> None:
        """Cancel the job if it still runs once every rank of it is closed."""
        if self.sentinel is not None:
            with contextlib.suppress(OSError):
                os.close(self.sentinel)
            self.sentinel = None
        self.watched.closed.add(self.rank)
        if self.watched.closed >= self.watched.ranks:
            cancel(self.watched)
            self.watched.release()


class SubmititLauncher(Launcher):
    """Starts each collector rank as a submitit job, or every rank as the tasks of one job.

    Args:
        slurm_kwargs: for ``submitit.AutoExecutor.update_parameters``, plus ``"cluster"``
            (``"slurm"``/``"local"``; default ``$HPCCOLLECT_SUBMITIT_CLUSTER``, else SLURM where
            ``sinfo`` answers) and ``"folder"`` (default ``$HPCCOLLECT_SUBMITIT_DIR``, else
            ``./hpccollect-submitit``; a new sub-folder per run).
        delayed: one job whose tasks are the ranks.
        master_addr: where rank 0 listens, when the default does not suit.
    """

    uses_slurm_kwargs = True

    @classmethod
    def from_request(cls, request: LaunchRequest) -> SubmititLauncher:
        return cls(request.slurm_kwargs, delayed=request.name == "submitit_delayed")

    def __init__(
        self,
        slurm_kwargs: dict | None = None,
        delayed: bool = False,
        master_addr: str | None = None,
    ) -> None:
        if slurm_kwargs is None:
            slurm_kwargs = {}
        if not isinstance(slurm_kwargs, dict):
            raise ArgumentTypeError(
                f"slurm_kwargs must be a dict of submitit executor parameters (e.g. "
                f"{{'slurm_partition': 'cpu', 'timeout_min': 60}}), got "
                f"{type(slurm_kwargs).__name__}."
            )
        kwargs = dict(slurm_kwargs)
        self.delayed = delayed
        asked = _asked_cluster(kwargs.pop("cluster", None))
        nodes = slurm_nodes() if asked != "local" else None
        self.cluster = asked or ("slurm" if nodes is not None else "local")
        if self.cluster == "slurm" and nodes is None:
            raise ArgumentValueError(
                "slurm_kwargs['cluster']='slurm' but no SLURM cluster answers here (sbatch not "
                "on PATH, or sinfo failed); use cluster 'local' or run where SLURM is."
            )
        self.folder = _run_folder(kwargs.pop("folder", None))
        if "timeout_min" not in kwargs and "slurm_time" not in kwargs:
            kwargs["timeout_min"] = DEFAULT_TIMEOUT_MIN[self.cluster]
        kwargs.setdefault("name", "hpccollect-rank")
        self.parameters = kwargs
        self.executor = self._executor({})  # checks slurm_kwargs before anything starts
        self.master_addr = master_addr
        self._locate(nodes)

    def _locate(self, nodes: dict[str, str] | None) -> None:
        """Where the ranks run, from the cluster's nodes (None: the local executor)."""
        here = socket.gethostname().split(".")[0]
        self.shares_host = nodes is None or list(nodes) == [here]
        #: the first node that is not this host, and its address
        self._remote = next(((n, a) for n, a in (nodes or {}).items() if n != here), None)
        self._watch = JobWatch(period=1.0 if self.cluster == "slurm" else _WATCH_PERIOD)

    @property
    def jobs(self) -> list[Any]:
        """The submitit jobs submitted so far (``job.job_id``, ``job.paths.stderr``)."""
        return [watched.job for watched in self._watch.jobs]

    def _executor(self, extra: dict) -> Any:
        """A submitit executor for this run's folder with ``slurm_kwargs`` and ``extra``."""
        import submitit

        created = None  # the first folder this call makes: removed if it fails
        if not self.folder.exists():
            created = self.folder
            while not created.parent.exists():
                created = created.parent
        try:
            executor = submitit.AutoExecutor(folder=self.folder, cluster=self.cluster)
            executor.update_parameters(**{**self.parameters, **extra})
        except (NameError, AssertionError, ValueError, TypeError) as err:
            if created is not None:
                shutil.rmtree(created, ignore_errors=True)
            raise ArgumentValueError(
                f"slurm_kwargs were refused by submitit's {self.cluster} executor: {err}"
            ) from err
        return executor

    def address(self) -> str:
        if self.master_addr is not None:
            return self.master_addr
        if self.shares_host or self._remote is None:
            return "127.0.0.1"
        from hpccollect.transport.addresses import address_towards

        node, addr = self._remote
        mine = address_towards(addr)
        if mine.startswith("127.") and not addr.startswith("127."):
            raise ArgumentValueError(
                f"the route from {socket.gethostname()} to SLURM node {node} ({addr}) leaves "
                f"through loopback ({mine}), which the ranks there cannot reach: pass "
                "master_addr= (--master-addr) or interface= (--interface)."
            )
        return mine

    def start(self, ranks: Sequence[RankArgs]) -> list[PeerLife | None]:
        if not ranks:
            return []
        timeout = ranks[0].start_timeout
        slurm = self.cluster == "slurm"
        started: list[PeerLife] = []
        try:
            if self.delayed:
                per_node = math.ceil(len(ranks) / int(self.parameters.get("nodes", 1)))
                executor = self._executor({"tasks_per_node": per_node})
                job = executor.submit(serve_task, Packed(list(ranks)))
                watched = WatchedJob(job, [a.rank for a in ranks], timeout, slurm)
                self._watch.add(watched)
                started = [SubmititRank(watched, a.rank, i) for i, a in enumerate(ranks)]
            else:
                for args in ranks:
                    job = self.executor.submit(serve_job, Packed(args))
                    watched = WatchedJob(job, [args.rank], timeout, slurm)
                    self._watch.add(watched)
                    started.append(SubmititRank(watched, args.rank, 0))
        except BaseException:
            for rank in started:
                rank.kill()
                rank.close()
            raise
        return list(started)


class Packed:
    """A value pickled with this process's ``sys.path``, put back in the job before unpickling,
    so env makers from modules found on the caller's own path load there too."""

    def __init__(self, value: Any) -> None:
        import cloudpickle  # submitit's own dependency

        self.path = list(sys.path)
        self.blob = cloudpickle.dumps(value)

    def unpack(self) -> Any:
        sys.path.extend(p for p in self.path if p not in sys.path)
        return pickle.loads(self.blob)


def serve_job(packed: Packed) -> None:
    """What a submitit job runs: its rank (see ``_serve``)."""
    _serve(packed.unpack())


def serve_task(packed: Packed) -> None:
    """What each task of ``submitit_delayed``'s job runs: its rank (extra tasks do nothing)."""
    import submitit

    ranks = packed.unpack()
    index = submitit.JobEnvironment().global_rank
    if index < len(ranks):
        _serve(ranks[index])


def _serve(args: RankArgs) -> None:
    """``serve_rank(args)``, but SIGTERM ends it: rank 0 is outside the job, so SIGTERM means
    SLURM ends it, and a rank collecting on until SIGKILL would pass for alive."""
    serve_rank(args, stop_on_sigterm=True)
    freeze_survivors()


def _asked_cluster(value: Any) -> str | None:
    """The executor asked for (``slurm_kwargs['cluster']``, else the environment), if any."""
    if value is None:
        value = os.environ.get("HPCCOLLECT_SUBMITIT_CLUSTER") or None
    if value is not None and value not in CLUSTERS:
        raise ArgumentValueError(
            f"slurm_kwargs['cluster'] (or HPCCOLLECT_SUBMITIT_CLUSTER) must be one of "
            f"{list(CLUSTERS)}, got {value!r}."
        )
    return value


def _run_folder(base: Any) -> Path:
    """A new folder for this run's jobs (job ids restart with a fresh cluster: never reuse)."""
    if base is None:
        base = os.environ.get("HPCCOLLECT_SUBMITIT_DIR") or "hpccollect-submitit"
    if not isinstance(base, (str, os.PathLike)):
        raise ArgumentTypeError(
            f"slurm_kwargs['folder'] must be a path (str), got {type(base).__name__}."
        )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(base).expanduser().absolute() / f"{stamp}-{uuid.uuid4().hex[:8]}"
