"""Run configuration of the ``python -m hpccollect`` job: one frozen dataclass, from defaults,
a TOML file and command-line options (later ones win). The only place the application reads
environment variables (``HPCCOLLECT_DATA_DIR``); the library reads its own, each where its
concern lives (docs/errors.md, "Environment variables")."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpccollect.collectors.torchrl_api.kinds import COLLECTOR_KINDS, collector_kinds
from hpccollect.errors import ArgumentValueError, HpcCollectError
from hpccollect.launchers import job_launchers
from hpccollect.launchers.mpi_gather import check_gather
from hpccollect.launchers.rendezvous import launched_ranks
from hpccollect.transport.backends import backend_names

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "BACKENDS",
    "COLLECTORS",
    "LAUNCHERS",
    "MAX_SEED",
    "RUN_OPTIONS",
    "RunConfig",
    "current_spelling",
    "data_dir",
    "load_toml",
    "wants_mpi",
]

COLLECTORS = tuple(COLLECTOR_KINDS)
COMPRESSIONS = ("none", "gzip", "lzf")
#: ``none``: one process runs the whole job; a launcher's name: every rank it started runs it
LAUNCHERS = ("none", *job_launchers())
#: the earlier spellings, still accepted (option -> {old: new}): ``--collector sync`` meant
#: ``single``, where TorchRL's ``collector_class="sync"`` means MultiSync; ``--launcher local``
#: was no launcher at all, where the library's local launcher is ``mp``
RENAMED = {"collector": {"sync": "single"}, "launcher": {"local": "none"}}
BACKENDS = backend_names()
#: options that only a distributed run (mpiexec/srun, or --launcher mpi) uses
DISTRIBUTED_OPTIONS = (
    "shards",
    "gather",
    "backend",
    "master_addr",
    "interface",
    "on_rank_failure",
    "liveness_timeout",
    "report_interval",
)
RANK_FAILURES = ("raise", "continue")
#: what a process needs before rank 0 has read the run: how the job runs
RUN_OPTIONS = (
    "resume",
    "launcher",
    "backend",
    "master_addr",
    "interface",
    "worker_timeout",
    "on_rank_failure",
    "liveness_timeout",
    "report_interval",
    "gather",
)
#: how a job's multi-* collectors start their workers: forked from a server of the job's own
#: (one import of torch, not one a worker; TorchRL's default is spawn)
WORKER_START = "forkserver"


#: the largest --seed: the job adds worker and rank offsets to it, and torch takes seeds below
#: 2**64 (a resumed attempt's offset wraps around, see ``resume.py``)
MAX_SEED = 2**63 - 1


def _seconds(value: Any, above: float | None = None, at_least: float | None = None) -> bool:
    """Whether ``value`` is a finite number of seconds ``> above`` (or ``>= at_least``): every
    wait the job makes is bounded, and NaN compares false with every bound."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if not math.isfinite(value):
        return False
    return value > above if above is not None else value >= at_least


def data_dir() -> Path:
    """Where datasets go by default: ``$HPCCOLLECT_DATA_DIR``, else ``./data``."""
    return Path(os.environ.get("HPCCOLLECT_DATA_DIR", "data"))


@dataclass(frozen=True)
class RunConfig:
    """Everything one collection run needs; the defaults are the embedded default job."""

    env: str = "CartPole-v1"
    env_kwargs: dict = field(default_factory=dict)
    num_envs: int = 1
    num_workers: int = 2
    collector: str = "multi-sync"
    frames_per_batch: int = 1000
    total_frames: int = 20_000
    max_steps: int | None = None
    seed: int = 0
    policy: str = "default"
    out: str | None = None
    compression: str = "none"
    overwrite: bool = False
    worker_timeout: float = 600.0
    imports: tuple[str, ...] = ()
    launcher: str | None = None  # None: mpi when a launcher started several ranks, else none
    backend: str | None = None  # None: gloo
    master_addr: str | None = None
    interface: str | None = None
    shards: bool = False
    gather: str | int | None = None  # None: every collector rank sends rank 0 its batches
    on_rank_failure: str | None = None  # None: raise
    liveness_timeout: float | None = None  # None: DEFAULT_LIVENESS_TIMEOUT
    report_interval: float | None = None  # None: DEFAULT_REPORT_INTERVAL (with shards only)
    resume: str | None = None  # a run to continue (see hpccollect.app.resume)

    def __post_init__(self) -> None:
        self._check_types()
        for name in ("num_envs", "num_workers", "frames_per_batch", "total_frames"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ArgumentValueError(
                    f"--{name.replace('_', '-')} must be a positive integer, got {value!r}."
                )
        if self.max_steps is not None and (
            isinstance(self.max_steps, bool)
            or not isinstance(self.max_steps, int)
            or self.max_steps < 1
        ):
            raise ArgumentValueError(
                f"--max-steps must be a positive integer, got {self.max_steps!r}."
            )
        for name in RENAMED:  # a config built in code: as from_sources, without the warning
            object.__setattr__(self, name, current_spelling(name, getattr(self, name)))
        if self.collector not in collector_kinds():
            raise ArgumentValueError(
                f"--collector must be one of {', '.join(collector_kinds())}; "
                f"got {self.collector!r}."
            )
        if self.compression not in COMPRESSIONS:
            raise ArgumentValueError(
                f"--compression must be one of {', '.join(COMPRESSIONS)}; got {self.compression!r}."
            )
        if not isinstance(self.env_kwargs, dict):
            raise ArgumentValueError(
                f"--env-kwargs must be a JSON object, got {self.env_kwargs!r}."
            )
        if not _seconds(self.worker_timeout, above=0):
            raise ArgumentValueError(
                f"--worker-timeout must be a number of seconds > 0, got {self.worker_timeout!r}."
            )
        if isinstance(self.imports, str) or not all(isinstance(m, str) for m in self.imports):
            raise ArgumentValueError(
                f"--import must name modules (a list in TOML), got {self.imports!r}."
            )
        object.__setattr__(self, "imports", tuple(self.imports))
        if self.resume is not None and self.overwrite:
            raise ArgumentValueError(
                "--overwrite cannot be combined with --resume: a resumed run adds to its "
                "dataset and never replaces it; drop one of them."
            )
        self._check_distributed()
        self._check_batch_split()

    def _check_types(self) -> None:
        """The options a TOML file could give the wrong type of, refused by name (a command
        line gives them as strings already)."""
        for name in ("env", "policy", "compression", "collector", "out", "resume"):
            value = getattr(self, name)
            if value is None and name in ("out", "resume"):
                continue
            flag = "--" + name.replace("_", "-")
            if not isinstance(value, str) or not value.strip():
                raise ArgumentValueError(f"{flag} must be a non-empty string, got {value!r}.")
        if (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, int)
            or not (0 <= self.seed <= MAX_SEED)
        ):
            raise ArgumentValueError(
                f"--seed must be an integer from 0 to {MAX_SEED} (2**63 - 1), got {self.seed!r}."
            )
        if not isinstance(self.overwrite, bool):
            raise ArgumentValueError(f"--overwrite is true or false, got {self.overwrite!r}.")

    def _check_distributed(self) -> None:
        for name, allowed in (("launcher", LAUNCHERS), ("backend", BACKENDS)):
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise ArgumentValueError(
                    f"--{name} must be one of {', '.join(allowed)}; got {value!r}."
                )
        for name in ("master_addr", "interface"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ArgumentValueError(
                    f"--{name.replace('_', '-')} must be a non-empty string, got {value!r}."
                )
        if not isinstance(self.shards, bool):
            raise ArgumentValueError(f"--shards is true or false, got {self.shards!r}.")
        if self.on_rank_failure is not None and self.on_rank_failure not in RANK_FAILURES:
            raise ArgumentValueError(
                f"--on-rank-failure must be one of {', '.join(RANK_FAILURES)}; got "
                f"{self.on_rank_failure!r}."
            )
        timeout = self.liveness_timeout
        if timeout is not None and not _seconds(timeout, at_least=1):
            raise ArgumentValueError(
                f"--liveness-timeout must be a number of seconds >= 1, got {timeout!r}."
            )
        self._check_gather()
        interval = self.report_interval
        if interval is not None:
            if not _seconds(interval, above=0):
                raise ArgumentValueError(
                    f"--report-interval must be a number of seconds > 0, got {interval!r}."
                )
            if not self.shards:
                raise ArgumentValueError(
                    "--report-interval sets how often a --shards rank reports to rank 0; "
                    "without --shards every batch goes to rank 0 as it is collected: add "
                    "--shards, or drop --report-interval."
                )

    def _check_gather(self) -> None:
        gather = self.gather
        if gather is None:
            return
        try:
            check_gather(gather)
        except HpcCollectError:
            raise ArgumentValueError(
                "--gather must be node or a number of collector ranks per group of at least 2 "
                f"(a group's first rank gathers from the others), got {gather!r}."
            ) from None
        for given, why in (
            (self.shards, "--shards already sends rank 0 no batches, only the ranks' reports"),
            (
                self.on_rank_failure == "continue",
                "--on-rank-failure continue cannot drop one rank of a gathered group",
            ),
            (self.launcher not in (None, "mpi"), f"--launcher {self.launcher} has no MPI ranks"),
        ):
            if given:
                raise ArgumentValueError(f"--gather: {why}; drop one of them.")

    def check_local(self) -> None:
        """Refuse the distributed-only options in a single-process run (they would do nothing)."""
        given = [n for n in DISTRIBUTED_OPTIONS if getattr(self, n) not in (None, False)]
        if given:
            names = ", ".join("--" + n.replace("_", "-") for n in given)
            raise ArgumentValueError(
                f"{names}: only for a distributed run; start the job with mpiexec -n N or "
                "srun (N >= 2: rank 0 and N-1 collector ranks), or drop them."
            )

    @property
    def env_copies(self) -> int:
        """How many envs share one batch: a multi-sync batch is split over every worker's envs."""
        return self.num_envs * (self.num_workers if self.collector == "multi-sync" else 1)

    def _check_batch_split(self) -> None:
        """Every env of a batch collects the same number of frames and every batch is whole, so
        ``total_frames`` is collected exactly; refuse what cannot be split, naming values that
        can."""
        fpb, total, unit = self.frames_per_batch, self.total_frames, self.env_copies
        if fpb % unit:
            who = f"{self.num_envs} env(s)"
            if self.collector == "multi-sync":
                who = f"{self.num_workers} workers x {who}"
            fits = _nearest(fpb, [d for d in _divisors(total) if d % unit == 0])
            hint = (
                f"use a multiple of {unit} that divides --total-frames {total}, e.g. "
                + " or ".join(map(str, fits))
                if fits
                else f"e.g. --frames-per-batch {max(unit, fpb - fpb % unit)} with a "
                f"--total-frames that is a multiple of it"
            )
            raise ArgumentValueError(
                f"--frames-per-batch {fpb} cannot be split evenly over {who} "
                f"({self.collector} gives each of the {unit} envs the same share): {hint}."
            )
        if total % fpb:
            low, high = total - total % fpb, total - total % fpb + fpb
            fits = " or ".join(str(v) for v in (low, high) if v > 0)
            raise ArgumentValueError(
                f"--total-frames ({total}) must be a multiple of --frames-per-batch ({fpb}), "
                f"e.g. {fits}."
            )

    @property
    def shards_dir(self) -> Path:
        """Where ``--shards`` puts the collector ranks' files: ``run.h5`` -> ``run.shards/``."""
        out = self.output
        return out.with_name(out.stem + ".shards")

    @property
    def output(self) -> Path:
        """The dataset path: ``out``, or ``<data dir>/<env>-seed<seed>.h5``."""
        if self.out:
            return Path(self.out)
        slug = self.env.replace("/", "_").replace(":", "_")
        return data_dir() / f"{slug}-seed{self.seed}.h5"

    @classmethod
    def from_sources(cls, toml: dict[str, Any], overrides: dict[str, Any]) -> RunConfig:
        """Defaults, then the TOML table, then explicit command-line options."""
        names = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for source, where in ((toml, "the config file"), (overrides, "the command line")):
            for key, value in source.items():
                name = "imports" if key == "import" else key.replace("-", "_")
                if name not in names:
                    raise ArgumentValueError(
                        f"unknown option {key!r} in {where}; known: {', '.join(sorted(names))}."
                    )
                if value is not None:
                    values[name] = current_spelling(name, value, warn=True)
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def current_spelling(name: str, value: Any, warn: bool = False) -> Any:
    """``value`` of option ``name`` in today's words (``RENAMED``); with ``warn``, a
    ``FutureWarning`` for an old one."""
    new = RENAMED.get(name, {}).get(value) if isinstance(value, str) else None
    if new is None:
        return value
    if warn:
        flag = "--" + name.replace("_", "-")
        warnings.warn(
            f"{flag} {value} is now spelled {flag} {new}; the old word will stop being accepted.",
            FutureWarning,
            stacklevel=3,
        )
    return new


def load_toml(path: str | os.PathLike) -> dict[str, Any]:
    """The options in a TOML file (top level, or under a ``[collect]`` table)."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError as err:
        raise ArgumentValueError(f"--config: {path} does not exist.") from err
    except OSError as err:
        raise ArgumentValueError(
            f"--config: cannot read {path} ({err.strerror or type(err).__name__}); give a "
            "TOML file."
        ) from err
    except tomllib.TOMLDecodeError as err:
        raise ArgumentValueError(f"--config: {path} is not valid TOML: {err}") from err
    table = data.get("collect", data)
    if not isinstance(table, dict):
        raise ArgumentValueError(
            f"--config: {path}: 'collect' must be a table ([collect]) of options, got {table!r}."
        )
    return table


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _nearest(value: int, candidates: list[int]) -> list[int]:
    """The closest candidate below ``value`` and the closest above (those that exist)."""
    below = [c for c in candidates if c < value]
    above = [c for c in candidates if c > value]
    return ([max(below)] if below else []) + ([min(above)] if above else [])


def wants_mpi(cfg: RunConfig) -> bool:
    """Whether ``collect`` runs distributed: ``--launcher``, else whether a launcher (mpiexec,
    srun, torchrun) started more than one rank."""
    if cfg.launcher is not None:
        return cfg.launcher != "none"
    return launched_ranks() > 1
