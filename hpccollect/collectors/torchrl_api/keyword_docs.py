"""The collectors' constructor keywords, described once.

Five collectors share most of their ~50 keywords; ``with_args`` gives each collector's
docstring an ``Args:`` section (Google style, read by the API reference) listing the keywords
of its own ``__init__``, from ``KEYWORDS`` and the collector's own wording where a keyword
means something else there. A keyword with no description fails the import, so a new keyword
cannot go undocumented (``tests/collectors/torchrl_api/test_keyword_docs.py``).
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from typing import TypeVar

__all__ = ["DISTRIBUTED", "KEYWORDS", "MULTI", "SINGLE", "with_args"]

T = TypeVar("T")

#: every collector keyword: what it does here (TorchRL's meaning unless said otherwise)
KEYWORDS: dict[str, str] = {
    # what is collected
    "create_env_fn": (
        "the env: a gymnasium env id, env or vector env, a ``GymEnv``, a TorchRL env, a "
        "callable returning one of those (an ``EnvCreator`` too), or a list of callables, "
        "stepped as one vector env (``[N, T]`` batches)."
    ),
    "policy": (
        "what picks the actions: a ``TensorDictModule`` (TorchRL's or tensordict's), an "
        "``nn.Module`` or a callable taking a TensorDict, or one taking the observation and "
        "returning the action (wrapped as TorchRL wraps it). None: uniform random actions from "
        "the env's action spec."
    ),
    "policy_factory": (
        "a callable with no argument that builds the policy where it runs (here, in each "
        "worker, on each rank); with a ``policy`` too, a ``TypeError`` as in TorchRL, except "
        "where the collector sends weights (the policy is then their source)."
    ),
    "frames_per_batch": "frames in each batch (required).",
    "total_frames": "frames to collect before the iterator ends; -1 (the default): endless.",
    "create_env_kwargs": "keyword arguments for ``create_env_fn``.",
    "max_frames_per_traj": (
        "cut an episode after this many steps, its last one marked truncated, counting them in "
        "``step_count`` (TorchRL's ``StepCounter``); None or -1: never."
    ),
    "init_random_frames": (
        "frames collected with random actions before the policy is used (None, -1 or 0: none)."
    ),
    "reset_at_each_iter": "reset every env at the start of each batch.",
    "reset_when_done": (
        "reset an env whose episode ended (True, as in TorchRL); False leaves it to the policy "
        "or the caller."
    ),
    "exploration_type": (
        "the ``ExplorationType``/``InteractionType`` the policy runs under (``RANDOM`` by "
        "default), or its name."
    ),
    "exploration_mode": "the former name of ``exploration_type`` (a string); folded into it.",
    "set_truncated": (
        "mark the last step of each batch truncated (and done), as TorchRL does for rollouts "
        "cut by the batch."
    ),
    "categorical_action_encoding": (
        "discrete actions as integer indices rather than one-hot (gymnasium envs made from an "
        "id or a callable)."
    ),
    "compact_obs": (
        'leave the next step\'s observations (and step count) out of ``"next"`` in the stored '
        "frames: they are the following frame's own."
    ),
    # devices
    "device": "where env, policy and batches live unless the three below say otherwise.",
    "storing_device": (
        "where each batch is kept and yielded (default: ``device``; with neither, the env's "
        "device when env and policy share one)."
    ),
    "env_device": (
        "where the env steps; a TorchRL env is moved there (default: ``device``; with neither, "
        "the env's own device)."
    ),
    "policy_device": (
        "where the policy runs: a policy that lives elsewhere is copied there, and the given "
        "module stays where it is (default: ``device``)."
    ),
    # the output
    "postproc": "a callable applied to each batch before it is yielded (or stored).",
    "split_trajs": (
        "yield each batch split into trajectories, ``[n_traj, max_len]`` padded with "
        '``("collector", "mask")``; refused without trajectory ids.'
    ),
    "return_same_td": (
        "yield the same TensorDict object at each iteration, overwritten by the next batch "
        "(no new allocation; clone what you keep)."
    ),
    "track_traj_ids": (
        'add ``("collector", "traj_ids")``, each frame\'s trajectory id, unique across '
        "workers and ranks (True)."
    ),
    "trajs_per_batch": (
        "yield batches of exactly this many complete trajectories instead of "
        "``frames_per_batch`` frames (episodes still running are held back until they end)."
    ),
    "traj_format": (
        'the layout of ``trajs_per_batch`` batches: ``"padded"`` ``[n, max_len]`` with '
        '``("collector", "mask")``, or ``"cat"`` laid end to end; unset warns as TorchRL '
        "0.14 does."
    ),
    "trajs_per_write": (
        "with ``trajs_per_batch`` and a ``replay_buffer``: complete trajectories per ``extend``."
    ),
    "track_policy_version": (
        'add ``policy_version`` and ``("next", "policy_version")`` (int64) to every '
        "frame: the number of weight updates it was collected after; a TorchRL "
        "``PolicyVersion`` is kept in step."
    ),
    "replay_buffer": (
        "an object with ``extend`` (hpccollect's or TorchRL's ``ReplayBuffer``): each batch "
        "goes into it and the iterator yields None; ``start()`` fills it in the background."
    ),
    "extend_buffer": (
        "False: each step goes into ``replay_buffer`` with ``add``, in time order "
        "(``postproc`` and ``split_trajs`` are then refused, as in TorchRL)."
    ),
    # the policy's call
    "trust_policy": (
        "call the policy with the TensorDict as it is, without the wrapping rules (default: "
        "True only for a ``CudaGraphModule`` or a ``RandomPolicy``)."
    ),
    "use_buffers": (
        "accepted (True, False or None) without effect: batches are always written into "
        "buffers (shared ones in worker processes), so the output is the same either way."
    ),
    "compile_policy": (
        "``torch.compile`` the policy: True, or a dict of ``torch.compile``'s keywords (and "
        "``warmup``, the eager calls first)."
    ),
    "cudagraph_policy": (
        "wrap the policy in tensordict's ``CudaGraphModule`` (True, or a dict of its "
        "keywords); without CUDA the policy is called as it is, as tensordict does. Where "
        "there is CUDA the policy's input must be on it (``policy_device='cuda'``, or a TorchRL "
        "env on CUDA): other inputs are refused at construction, not at the first step."
    ),
    "no_cuda_sync": "accepted and kept; changes nothing on the CPU.",
    "auto_register_policy_transforms": (
        "True: append to a TorchRL env the ``InitTracker`` and ``TensorDictPrimer`` its policy "
        "needs (recurrent modules); None leaves the env and warns as TorchRL 0.14 does; True "
        "on a gymnasium env is refused."
    ),
    "interruptor": (
        "an ``Interruptor``: once its ``stop_collection()`` is called, the batch under way "
        "stops after the current env step (the rest is padded, as TorchRL does)."
    ),
    "pre_collect_hook": "called with no argument before each batch, where it is collected.",
    "post_collect_hook": "called with each batch once collected, where it is collected.",
    # weights
    "weight_updater": (
        "a ``WeightUpdaterBase`` (or its constructor) that ``update_policy_weights_()`` uses "
        "to move the weights."
    ),
    "local_weight_updater": (
        "TorchRL's former split updater, the receiving side (``LocalWeightsUpdaterBase``)."
    ),
    "remote_weight_updater": (
        "TorchRL's former split updater, the sending side (``RemoteWeightsUpdaterBase``)."
    ),
    "weight_sync_schemes": (
        '``{"policy": scheme}``: ``SharedMemWeightSyncScheme()`` (TorchRL\'s default) sends '
        "the policy's weights over hpccollect's own transport, ``NoWeightSyncScheme()`` keeps "
        "the workers' weights; other model ids are refused, saying why."
    ),
    "weight_recv_schemes": (
        'the receiving side of ``weight_sync_schemes``: ``{"policy": scheme}``, checked and '
        "kept (the weights arrive over hpccollect's own transport); other model ids are "
        "refused."
    ),
    # ids and threads
    "traj_id_offset": (
        "the first trajectory id this collector hands out (set by a collector that runs this "
        "one in a worker or on a rank, so ids stay unique)."
    ),
    "traj_id_stride": "the step between this collector's trajectory ids (with ``traj_id_offset``).",
    "worker_idx": "this collector's index among its siblings; accepted and kept.",
    "num_threads": (
        "torch threads of this process while the collector lives (None: the current count less "
        "one per worker, at least 1, as TorchRL); restored by ``shutdown()``."
    ),
    # choosing the collector (``Collector``)
    "backend": (
        'what runs the collection when this class is called as ``Collector``: ``"direct"`` '
        '(this collector; the default without ``num_collectors``), ``"process"`` (a '
        '``MultiCollector``, one worker per env; the default with it), ``"distributed"`` or '
        '``"submitit"`` (a ``DistributedDataCollector``), ``"rpc"`` (an ``RPCCollector``), '
        "or a name given to ``register_execution``."
    ),
    "backend_options": "keyword arguments for the collector ``backend`` builds.",
    "num_collectors": "with ``backend``: how many workers or ranks collect.",
    "sync": (
        "with ``backend``: gather every worker's batch into one (``MultiSyncDataCollector``) "
        "or yield each as it is ready (``MultiaSyncDataCollector``, the default)."
    ),
    # worker processes
    "num_workers": (
        "worker processes when ``create_env_fn`` is one constructor (it is then copied); "
        "otherwise one worker per constructor in the list."
    ),
    "collector_class": (
        "what each worker runs: ``SyncDataCollector`` (the default) or a subclass of it."
    ),
    "init_fn": "called with no argument first in each worker process.",
    "num_sub_threads": "torch threads in each worker process (1).",
    "mp_start_method": (
        'how worker processes start: ``"spawn"`` (the default), ``"fork"`` or ``"forkserver"``.'
    ),
    "update_at_each_batch": "send the policy's weights to the workers before each batch.",
    "preemptive_threshold": (
        "between 0.0 and 1.0 (``MultiSyncDataCollector``; accepted without effect on the "
        "others, as in TorchRL): once this share of the workers delivered, the rest stop after "
        "their current env step."
    ),
    "cat_results": (
        'how the workers\' batches are joined: ``"stack"`` (the default, ``[num_workers, T]``) '
        "or a dim to concatenate along (``-1``: time); ``MultiSyncDataCollector`` only, the "
        'others accept None or ``"stack"``.'
    ),
    "worker_timeout": (
        "seconds a worker may take for one batch or one answer before ``CollectorTimeoutError`` "
        "names it (600)."
    ),
    "start_timeout": "seconds the workers may take to start (120).",
    # collector ranks (``DistributedDataCollector``)
    "collector_kwargs": (
        "keywords for each rank's collector (one dict, or one per rank); its device keywords "
        "are that rank's own, and a rank's ``device`` fills the others it does not give."
    ),
    "num_workers_per_collector": (
        "copies of its env each rank runs: one vector env (``[k, T]`` batches) for a "
        "``SyncDataCollector``, worker processes for a multi-process ``collector_class``."
    ),
    "launcher": (
        'how the ranks start: ``"mp"`` (local processes), ``"mpi"`` (the ranks of the '
        'MPI job this runs in), ``"submitit"``/``"submitit_delayed"`` (submitit jobs), '
        "a name given to ``register_launcher``, or a ``Launcher``."
    ),
    "slurm_kwargs": "submitit executor parameters of the rank jobs (submitit launchers).",
    "tcp_port": (
        "the port rank 0 listens on, an int or a string of digits (None: ``MASTER_PORT`` or "
        "``TCP_PORT`` under MPI, the port agreed with the jobs inside "
        "``submitit_delayed_launcher``, else a free port)."
    ),
    "update_after_each_batch": (
        "send weights before each round to every rank (sync), or to the rank that just "
        "delivered (async)."
    ),
    "max_weight_update_interval": (
        "no rank collects more than this many batches without fresh weights (-1: no bound)."
    ),
    "update_interval": (
        "each rank gets the policy's weights once it has collected this many batches, "
        "without a call (TorchRL's; None: no such pushes, ``update_after_each_batch`` and "
        "``max_weight_update_interval`` still apply)."
    ),
    "on_worker_failure": (
        '``"raise"`` (the default) a ``WorkerError`` naming the rank, or ``"continue"`` '
        "with the ranks left, warning once per lost rank (listed in ``lost_ranks``); losing "
        "the last rank raises."
    ),
    "liveness_timeout": (
        "seconds a rank may stay silent, heartbeats included, before it counts as lost (a "
        "lost node, a cut network, a stopped process); a rank whose rank 0 is silent that "
        "long ends. None: no heartbeats (``worker_timeout`` alone)."
    ),
    "rank_sink": (
        "``rank_sink(rank)`` is called on each collector rank; the object it returns gets "
        "``extend(batch)`` with every batch that rank collects, before the batch is sent, and "
        "``close()`` when the rank ends (a dataset shard per rank: ``collect --shards``)."
    ),
    "rank_reports": (
        "with ``rank_sink``: the batches stay on the ranks and rank 0 gets a report of them "
        "instead (rank, frames, batches, ended episodes and returns, the sink's committed "
        "counts; stacked ``[N]`` with ``sync=True``)."
    ),
    "report_interval": "with ``rank_reports``: a rank reports at least this often, in seconds (2).",
}

#: the multi-process collectors' own meaning of keywords shared with ``SyncDataCollector``
MULTI: dict[str, str] = {
    "create_env_fn": (
        "one env constructor per worker (a list), or one for ``num_workers`` workers; each is "
        "anything ``SyncDataCollector`` takes."
    ),
    "create_env_kwargs": "keyword arguments for the env constructors: one dict, or one per worker.",
    "device": (
        "as for ``SyncDataCollector``; this and the three below take one device, or a list of "
        "one per worker."
    ),
    "replay_buffer": (
        "an object with ``extend``: each batch goes into it and the iterator yields None; "
        "after ``start()`` the workers fill it themselves (a TorchRL ``ReplayBuffer`` is shared "
        "with them)."
    ),
}


#: ``SyncDataCollector``'s own meaning of keywords the collectors with workers share
SINGLE: dict[str, str] = {
    "weight_sync_schemes": (
        "refused unless empty, as in TorchRL: this collector has no workers to send weights "
        "to (use a multi-process or distributed collector)."
    ),
}

#: ``DistributedDataCollector``'s own meaning of keywords the other collectors have
DISTRIBUTED: dict[str, str] = {
    "create_env_fn": (
        "one env constructor per collector rank (a list), or one for a single rank; with "
        '``launcher="mpi"``, one for every rank also.'
    ),
    "policy": (
        "the trainer's policy: its weights are what ``update_policy_weights_()`` sends; each "
        "rank gets a copy, or builds its own with ``policy_factory``."
    ),
    "policy_factory": (
        "builds each rank's policy on that rank; with a ``policy`` too (as TorchRL takes them), "
        "the policy is where the ranks' weights come from."
    ),
    "frames_per_batch": (
        "frames in each batch: the total over ranks with ``sync=True`` (one row per rank), "
        "each rank's batch with ``sync=False``."
    ),
    "device": (
        "the ranks' device (one, or a list of one per rank), where ``collector_kwargs`` give a "
        "rank none of its own; ``env_device`` and ``policy_device`` likewise."
    ),
    "storing_device": (
        "where rank 0 puts the batches it yields (None: where they arrive, the CPU); a rank "
        "keeps its own on the CPU unless its ``collector_kwargs`` say otherwise."
    ),
    "collector_class": (
        'what each rank runs: ``SyncDataCollector`` (``"single"``, the default), '
        '``MultiSyncDataCollector`` (``"sync"``), ``MultiaSyncDataCollector`` (``"async"``), '
        "a subclass, or a registered collector kind."
    ),
    "sync": (
        "yield one batch from every rank stacked ``[N, ...]`` (True), or each rank's batch as "
        "soon as it is ready (False, the default)."
    ),
    "backend": (
        'the transport: ``"gloo"`` (the default), ``"nccl"``, ``"ucc"`` or '
        '``"mpi"`` (torch\'s, or mpi4py where torch has none), or a name given to '
        "``register_backend``."
    ),
    "replay_buffer": "an object with ``extend``: each batch goes into it on rank 0, and the "
    "iterator yields None.",
    "trajs_per_batch": (
        "yield batches of exactly this many complete trajectories, assembled on rank 0 from "
        "the ranks' batches."
    ),
    "track_policy_version": (
        "True: add ``policy_version`` to every frame, the number of weight updates its rank "
        "had received when it collected it."
    ),
    "worker_timeout": "seconds a rank may take for one batch or one answer (600).",
    "start_timeout": "seconds the ranks may take to start and connect (120).",
    "num_threads": (
        "torch threads of rank 0 while the collector lives (None: as for the multi-process "
        "collectors with local ranks, unchanged with remote ones)."
    ),
}


def with_args(**wording: str) -> Callable[[T], T]:
    """A class (or function) decorator that appends an ``Args:`` section to the docstring.

    Args:
        **wording: the decorated object's own description of a keyword, where it differs
            from ``KEYWORDS`` (``args="..."``, ``kwargs="..."`` for its ``*args`` and
            ``**kwargs``, left out unless given).

    Returns:
        The decorator; it returns the object, its ``__doc__`` extended.

    Raises:
        KeyError: a keyword of the signature has no description, or ``wording`` describes
            one the signature lacks.
    """

    def decorate(obj: T) -> T:
        call = obj.__init__ if inspect.isclass(obj) else obj
        entries = []
        for name, param in inspect.signature(call).parameters.items():
            if name == "self":
                continue
            stars = {param.VAR_POSITIONAL: "*", param.VAR_KEYWORD: "**"}.get(param.kind)
            if stars:
                if name in wording:
                    entries.append((stars + name, wording[name]))
                continue
            if name not in wording and name not in KEYWORDS:
                raise KeyError(f"{obj.__qualname__}: no description of keyword {name!r}")
            entries.append((name, wording[name] if name in wording else KEYWORDS[name]))
        unused = set(wording) - {name.lstrip("*") for name, _ in entries}
        if unused:
            raise KeyError(f"{obj.__qualname__}: no keyword {sorted(unused)} to describe")
        obj.__doc__ = _with_section(obj.__doc__ or "", _args_section(entries))
        return obj

    return decorate


def _args_section(entries: list[tuple[str, str]]) -> str:
    lines = ["Args:"]
    for name, text in entries:
        lines += textwrap.wrap(
            f"{name}: {text}",
            width=92,
            initial_indent="    ",
            subsequent_indent="        ",
            break_on_hyphens=False,
        )
    return "\n".join(lines)


def _with_section(doc: str, section: str) -> str:
    """``doc`` (cleaned of its indentation) with ``section`` before its ``Example:``, if any."""
    doc = inspect.cleandoc(doc)
    head, sep, example = doc.partition("\nExample:")
    return f"{head.rstrip()}\n\n{section}\n" + (f"\n{sep.strip()}{example}" if sep else "")
