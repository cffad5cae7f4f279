"""``RPCCollector``: TorchRL's RPC collector over hpccollect's own transport: its ranks are
``DistributedDataCollector``'s (same launchers, links, liveness and weight broadcast), and no
``torch.distributed.rpc`` agent is started."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from hpccollect.distributed.collector import DistributedDataCollector
from hpccollect.errors import ArgumentTypeError, ArgumentValueError

__all__ = ["RPCCollector"]

#: the keys of TorchRL's ``tensorpipe_options`` (``TensorPipeRpcBackendOptions``' arguments)
TENSORPIPE_KEYS = (
    "_channels",
    "_transports",
    "device_maps",
    "devices",
    "init_method",
    "num_worker_threads",
    "rpc_timeout",
)


class RPCCollector(DistributedDataCollector):
    """TorchRL's RPC collector: ``DistributedDataCollector`` with two keywords of its own, and
    a sync round's batches concatenated along their first dim (TorchRL's ``torch.cat``).

    Args:
        create_env_fn: one env constructor per collector rank (or one for every rank).
        policy: the policy, as for ``DistributedDataCollector``.
        visible_devices: TorchRL's RPC device map, one device per rank. Not needed (batches
            land on ``storing_device``); checked and kept as ``self.visible_devices``.
        tensorpipe_options: TorchRL's RPC agent options. ``rpc_timeout`` (s) is
            ``worker_timeout`` where that is not given; other keys are only checked by name.
        trajs_per_batch: yield whole trajectories end to end: this many per batch (async),
            per rank per round (sync), as TorchRL's; rank 0 assembles them.
        **kwargs: ``DistributedDataCollector``'s keywords (``frames_per_batch``, ``sync``, ...).

    Example:
        >>> collector = RPCCollector([make_env, make_env], policy, frames_per_batch=200,
        ...                          total_frames=2_000, sync=True, launcher="mp")
        >>> for batch in collector:  # 200 frames: both ranks' 100, one after the other
        ...     ...
        >>> collector.shutdown()
    """

    _sync_layout = 0
    _release_after_yield = False  # TorchRL's RPC collector asks a rank again before the yield

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        visible_devices: Sequence[Any] | None = None,
        tensorpipe_options: dict[str, Any] | None = None,
        trajs_per_batch: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.tensorpipe_options = _check_tensorpipe(tensorpipe_options)
        if "rpc_timeout" in self.tensorpipe_options and "worker_timeout" not in kwargs:
            kwargs["worker_timeout"] = self.tensorpipe_options["rpc_timeout"]
        ranks = len(create_env_fn) if isinstance(create_env_fn, (list, tuple)) else None
        self.visible_devices = _check_visible_devices(visible_devices, ranks)
        super().__init__(create_env_fn, policy, trajs_per_batch=trajs_per_batch, **kwargs)
        if trajs_per_batch is not None and self.sync:  # each rank's trajectories, end to end
            self.trajs_per_batch = trajs_per_batch * self.num_workers
            self.options = dataclasses.replace(self.options, trajs_per_batch=self.trajs_per_batch)
        if self.visible_devices is not None and len(self.visible_devices) != self.num_workers:
            n = len(self.visible_devices)
            self.shutdown()
            raise ArgumentValueError(
                f"visible_devices lists {n} device(s) but the collector has "
                f"{self.num_workers} ranks: give one per rank."
            )


def _check_tensorpipe(options: Any) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ArgumentTypeError(
            f"tensorpipe_options must be a dict of TensorPipe options (e.g. "
            f"{{'rpc_timeout': 600}}), got {type(options).__name__}."
        )
    unknown = sorted(set(options) - set(TENSORPIPE_KEYS))
    if unknown:
        raise ArgumentValueError(
            f"tensorpipe_options has unknown keys {unknown}; TensorPipe takes "
            f"{list(TENSORPIPE_KEYS)}."
        )
    out = dict(options)
    if "rpc_timeout" in out:
        timeout = out["rpc_timeout"]
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ArgumentValueError(
                f"tensorpipe_options['rpc_timeout'] must be a number of seconds > 0, got "
                f"{timeout!r}."
            )
        out["rpc_timeout"] = float(timeout)
    return out


def _check_visible_devices(devices: Any, ranks: int | None) -> list[torch.device] | None:
    if devices is None:
        return None
    if isinstance(devices, (str, torch.device)) or not isinstance(devices, Sequence):
        raise ArgumentTypeError(
            f"visible_devices must be a list with one device per collector rank, got {devices!r}."
        )
    try:
        parsed = [torch.device(d) for d in devices]
    except (RuntimeError, TypeError) as err:
        raise ArgumentValueError(f"visible_devices: {err}; give devices such as 'cuda:0'.") from err
    if ranks is not None and len(parsed) != ranks:
        raise ArgumentValueError(
            f"visible_devices lists {len(parsed)} device(s) but create_env_fn {ranks} ranks: "
            "give one per rank."
        )
    return parsed
