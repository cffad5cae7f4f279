"""Collection jobs submitted before their rank 0 exists: TorchRL's ``submitit_delayed_launcher``.

For clusters where a job may not submit jobs: from a login node, ``num_jobs`` collection jobs
are submitted, then the main as a job of its own. Each collection job waits in a hand-off folder
(shared by the login node and the jobs' nodes) for its rank's arguments, which the main's
``launcher="submitit_delayed"`` (``PrelaunchedLauncher``) writes there. When the main ends,
collection jobs still there are cancelled.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pickle
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hpccollect.errors import ArgumentTypeError, ArgumentValueError, JobError
from hpccollect.launchers.base import LaunchRequest
from hpccollect.launchers.rank import RankArgs
from hpccollect.launchers.submitit import (
    DEFAULT_SLURM_CONF,
    DEFAULT_SLURM_CONF_MAIN,
    Packed,
    SubmititLauncher,
    SubmititRank,
    serve_job,
)
from hpccollect.launchers.submitit_jobs import JobWatch, WatchedJob, cancel
from hpccollect.transport.base import PeerLife

__all__ = ["PrelaunchedLauncher", "submitit_delayed_launcher"]

#: set in the main job: JSON of the hand-off folder and the collection jobs
ENV = "HPCCOLLECT_PRELAUNCHED"
_POLL = 0.2  # s between two looks at the hand-off folder, or at the jobs
_GRACE = 30.0  # s the collection jobs have to end once the main has, before they are cancelled
FRAMEWORKS = ("distributed", "rpc")


class submitit_delayed_launcher:
    """Run the decorated main as its own submitit job, with ``num_jobs`` collection jobs
    submitted before it and waiting for it.

    Inside the main, build the collector with ``launcher="submitit_delayed"`` and ``num_jobs``
    ranks: these jobs. Calling the decorated function submits the jobs, waits for them and
    returns the main's value (or raises its exception); Ctrl-C cancels them. Outside the
    decorator, ``launcher="submitit_delayed"`` submits its rank jobs itself.

    Args:
        num_jobs: the number of collection jobs, one collector rank each.
        framework: ``"distributed"`` (a ``DistributedDataCollector``) or ``"rpc"`` (an
            ``RPCCollector``); both take the ranks alike.
        backend: the transport (``"gloo"``, ``"mpi"``, ...), only checked: ranks take the
            collector's own.
        tcpport: rank 0's port when the collector has no ``tcp_port``; None: a free one (the
            ranks learn it when they join, so TorchRL's fixed ``TCP_PORT`` is not needed).
        submitit_main_conf: submitit executor parameters of the main job.
        submitit_collection_conf: those of each collection job. Both also take ``"cluster"``
            (``"slurm"`` or ``"local"``) and ``"folder"``.

    Example:
        >>> @submitit_delayed_launcher(num_jobs=2)
        ... def main():
        ...     collector = DistributedDataCollector(
        ...         [make_env] * 2, policy, frames_per_batch=200, total_frames=10_000,
        ...         launcher="submitit_delayed",
        ...     )
        ...     for batch in collector:
        ...         ...
        >>> if __name__ == "__main__":
        ...     main()
    """

    def __init__(
        self,
        num_jobs: int,
        framework: str = "distributed",
        backend: str = "gloo",
        tcpport: int | str | None = None,
        submitit_main_conf: dict = DEFAULT_SLURM_CONF_MAIN,
        submitit_collection_conf: dict = DEFAULT_SLURM_CONF,
    ) -> None:
        from hpccollect.transport.backends import check_backend

        if isinstance(num_jobs, bool) or not isinstance(num_jobs, int) or num_jobs < 1:
            raise ArgumentValueError(
                f"submitit_delayed_launcher: num_jobs must be an int >= 1 (the collector's "
                f"ranks), got {num_jobs!r}."
            )
        if framework not in FRAMEWORKS:
            raise ArgumentValueError(
                f"submitit_delayed_launcher: framework must be one of {list(FRAMEWORKS)}, got "
                f"{framework!r}."
            )
        check_backend(backend)
        try:
            port = 0 if tcpport is None else int(tcpport)
        except (TypeError, ValueError):
            port = -1
        if not 0 <= port < 65536:
            raise ArgumentValueError(
                f"submitit_delayed_launcher: tcpport must be a port number, got {tcpport!r}."
            )
        for name, conf in (
            ("submitit_main_conf", submitit_main_conf),
            ("submitit_collection_conf", submitit_collection_conf),
        ):
            if not isinstance(conf, dict):
                raise ArgumentTypeError(
                    f"submitit_delayed_launcher: {name} must be a dict of submitit executor "
                    f"parameters, got {type(conf).__name__}."
                )
        self.num_jobs, self.framework, self.backend = num_jobs, framework, backend
        self.tcpport = port
        self.submitit_main_conf = dict(submitit_main_conf)
        self.submitit_collection_conf = dict(submitit_collection_conf)

    def __call__(self, main_func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(main_func)
        def exec_fun(*args: Any, **kwargs: Any) -> Any:
            return self.launch(main_func, *args, **kwargs)

        return exec_fun

    def launch(self, main_func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Submit the collection jobs and the main job, and wait for them.

        Args:
            main_func: the decorated main, run as a job of its own.
            *args: its positional arguments.
            **kwargs: its keyword arguments.

        Returns:
            What ``main_func(*args, **kwargs)`` returned in its job.

        Raises:
            JobError: the main job failed (naming its traceback and log).
        """
        collection = SubmititLauncher(
            {"name": "hpccollect-collection", **self.submitit_collection_conf}
        )
        main = SubmititLauncher(
            {"name": "hpccollect-main", "cluster": collection.cluster, **self.submitit_main_conf}
        )
        handoff = collection.folder / "handoff"
        handoff.mkdir(parents=True)
        slurm = collection.cluster == "slurm"
        jobs: list[Any] = []
        watched: WatchedJob | None = None
        info = {
            "folder": str(handoff),
            "ranks": self.num_jobs,
            "port": self.tcpport,
            "cluster": collection.cluster,
        }
        try:
            for rank in range(1, self.num_jobs + 1):
                jobs.append(collection.executor.submit(wait_for_rank, str(handoff), rank))
            packed = Packed((main_func, args, kwargs))
            main_job = main.executor.submit(run_main, packed, info, jobs)
            watched = WatchedJob(main_job, [0], float("inf"), slurm)
            JobWatch(period=1.0 if slurm else _POLL).add(watched)
            while not watched.event.wait(_POLL):
                pass
            _end_collection(jobs, handoff, slurm)
        except BaseException:
            if watched is not None:
                cancel(watched)
            _cancel_all(jobs, slurm)
            raise
        finally:
            if watched is not None:
                watched.release()
        return _result(main_job, watched)


def _end_collection(jobs: Sequence[Any], handoff: Path, slurm: bool) -> None:
    """Once the main has ended: tell waiting jobs to leave, give the others ``_GRACE`` s, then
    cancel what is left."""
    with contextlib.suppress(OSError):
        (handoff / "main.ended").touch()
    watch = JobWatch(period=1.0 if slurm else _POLL)
    watched = [WatchedJob(job, [], _GRACE, slurm) for job in jobs]
    for job in watched:
        watch.add(job)
    deadline = time.monotonic() + _GRACE
    for job in watched:
        if not job.event.wait(max(0.0, deadline - time.monotonic())):
            cancel(job)
        job.release()


def _cancel_all(jobs: Sequence[Any], slurm: bool) -> None:
    for job in jobs:
        watched = WatchedJob(job, [], 0.0, slurm)
        cancel(watched)
        watched.release()


def _result(job: Any, watched: WatchedJob) -> Any:
    """The main job's return value, or its failure as a ``JobError`` naming its log."""
    result = Path(job.paths.result_pickle)
    if not result.exists():
        raise JobError(
            f"the main job {watched.ended or 'ended'} without a result: see its log "
            f"{job.paths.stderr}."
        )
    with result.open("rb") as f:
        outcome, value = pickle.load(f)
    if outcome == "success":
        return value
    raise JobError(
        f"the main job (submitit job {job.job_id}, log {job.paths.stderr}) failed:\n{value}"
    )


def run_main(packed: Packed, info: dict, jobs: list[Any]) -> Any:
    """What the main job runs: the decorated main, its collection jobs waiting as ranks."""
    main_func, args, kwargs = packed.unpack()
    os.environ[ENV] = json.dumps(info)
    PrelaunchedLauncher.jobs_waiting = list(jobs)
    try:
        return main_func(*args, **kwargs)
    finally:
        with contextlib.suppress(OSError):
            (Path(info["folder"]) / "main.ended").touch()


def wait_for_rank(folder: str, rank: int) -> None:
    """What a collection job runs: wait for ``rank``'s arguments in ``folder`` and serve it;
    leave if the main ends first."""
    args_file = Path(folder) / f"rank-{rank}.args"
    ended = Path(folder) / "main.ended"
    while not args_file.exists():
        if ended.exists():
            return
        time.sleep(_POLL)
    with args_file.open("rb") as f:
        packed = pickle.load(f)
    serve_job(packed)


class PrelaunchedLauncher(SubmititLauncher):
    """``launcher="submitit_delayed"`` inside a main of ``submitit_delayed_launcher``: ``start``
    hands the waiting collection jobs their arguments."""

    #: the collection jobs (submitit ``Job`` objects), set in the main job by ``run_main``
    jobs_waiting: list[Any] = []

    @classmethod
    def active(cls) -> dict | None:
        """The hand-off of the main job this process runs, if it runs one."""
        text = os.environ.get(ENV)
        return None if not text else json.loads(text)

    @classmethod
    def from_request(cls, request: LaunchRequest) -> SubmititLauncher:
        """The pre-launched ranks inside a main of ``submitit_delayed_launcher``; elsewhere
        ``SubmititLauncher(delayed=True)``."""
        info = cls.active()
        if info is None:
            return SubmititLauncher.from_request(request)
        return cls(info)

    def __init__(self, info: dict) -> None:
        from hpccollect.launchers.submitit_jobs import slurm_nodes

        self.folder = Path(info["folder"])
        self.num_jobs = int(info["ranks"])
        self.default_port = int(info["port"])
        self.cluster = info["cluster"]
        self.delayed = True
        self.parameters: dict = {}
        self.master_addr = None
        self._locate(slurm_nodes() if self.cluster == "slurm" else None)

    def start(self, ranks: Sequence[RankArgs]) -> list[PeerLife | None]:
        if len(ranks) != self.num_jobs:
            raise ArgumentValueError(
                f"submitit_delayed_launcher(num_jobs={self.num_jobs}) submitted "
                f"{self.num_jobs} collection job(s), and this collector asks for {len(ranks)} "
                "rank(s): give it as many env makers as num_jobs."
            )
        lives: list[PeerLife | None] = []
        for args in ranks:
            final = self.folder / f"rank-{args.rank}.args"
            part = final.with_name(f"{final.name}.{uuid.uuid4().hex[:8]}.part")
            with part.open("wb") as f:
                pickle.dump(Packed(args), f)
            os.replace(part, final)
            job = self._job(args.rank)
            if job is None:
                lives.append(None)  # the local executor's jobs: seen through heartbeats
            else:
                watched = WatchedJob(job, [args.rank], args.start_timeout, True)
                self._watch.add(watched)
                lives.append(SubmititRank(watched, args.rank, 0))
        return lives

    def _job(self, rank: int) -> Any:
        """Rank ``rank``'s SLURM job, when the collection jobs are SLURM's."""
        jobs = type(self).jobs_waiting
        if self.cluster != "slurm" or len(jobs) < rank:
            return None
        return jobs[rank - 1]
