"""TorchRL 0.14.1's weight-sync-scheme keywords: ``weight_sync_schemes`` and
``weight_recv_schemes``.

TorchRL chooses how each model's weights reach a collector's workers with scheme objects keyed
by model id (``{"policy": SharedMemWeightSyncScheme()}``, its default). hpccollect syncs one
model, the policy, over its own transport (shared memory for local workers, the rank transport
for ranks), so a scheme for ``"policy"`` is taken with that meaning whatever its kind, except
``NoWeightSyncScheme``, which keeps the workers' weights as they are. Other model ids are
refused, naming the way here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpccollect.errors import ArgumentTypeError, ArgumentValueError

__all__ = ["check_weight_schemes"]

_MODEL = "policy"


def check_weight_schemes(owner: str, sync_schemes: Any, recv_schemes: Any, *, leaf: bool) -> bool:
    """Check both keywords; return whether ``update_policy_weights_`` sends weights to workers
    (False only for ``weight_sync_schemes={"policy": NoWeightSyncScheme()}``). A ``leaf``
    collector (no workers) takes no ``weight_sync_schemes``, as in TorchRL."""
    sends = True
    for name, schemes in (
        ("weight_sync_schemes", sync_schemes),
        ("weight_recv_schemes", recv_schemes),
    ):
        if schemes is None:
            continue
        if not isinstance(schemes, Mapping):
            raise ArgumentTypeError(
                f"{owner}: {name} must be a dict of model id -> weight sync scheme, such as "
                f'{{"policy": SharedMemWeightSyncScheme()}}; got {type(schemes).__name__}.'
            )
        if name == "weight_sync_schemes" and leaf and schemes:
            raise ArgumentValueError(
                f"{owner} runs its policy in this process and has no workers to send weights "
                "to (TorchRL refuses weight_sync_schemes here too): drop it, or use "
                "MultiSyncCollector/MultiAsyncCollector/DistributedCollector."
            )
        others = sorted(str(k) for k in schemes if k != _MODEL)
        if others:
            raise ArgumentValueError(
                f"{owner}: {name} has schemes for {others}; hpccollect syncs the policy's "
                'weights only ({"policy": scheme}). Send other models\' weights yourself.'
            )
        scheme = schemes.get(_MODEL)
        if name == "weight_sync_schemes" and type(scheme).__name__ == "NoWeightSyncScheme":
            sends = False
    return sends
