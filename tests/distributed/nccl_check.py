"""The GPU check of the data plane: rank 0 and N collector ranks (``launcher="mp"``), batches
on the transport's device, weights from a policy on that device, ``sync`` both ways. It asserts
each batch's device and that every update of the weights reaches every rank's next batch.

    python tests/distributed/nccl_check.py --ranks 1                      # NCCL: ranks + 1 GPUs
    python tests/distributed/nccl_check.py --backend gloo --device cpu    # the same calls on CPU

NCCL needs one GPU per rank (it refuses two ranks on one GPU: "Duplicate GPU detected"), so
rank 0 and one collector rank need two. ``tests/distributed/test_nccl_check.py`` runs the
second line in CI, which has no GPU: the same point-to-point and broadcast calls over gloo.
"""

from __future__ import annotations

import argparse
import sys

import torch
from tensordict.nn import TensorDictModule
from torch import nn

from hpccollect import DistributedDataCollector


class Marked(nn.Module):
    """A CartPole policy whose every step also writes its bias as ``marker``: the weights a
    batch was collected with show in the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.layer(observation)
        action = nn.functional.one_hot(logits.argmax(-1), 2)
        return action, self.bias.expand(*observation.shape[:-1], 1).clone()


def check(backend: str, device: str, ranks: int, sync: bool) -> None:
    policy = TensorDictModule(Marked(), in_keys=["observation"], out_keys=["action", "marker"])
    policy.to(device)
    collector = DistributedDataCollector(
        ["CartPole-v1"] * ranks,
        policy,
        frames_per_batch=64 * ranks if sync else 64,
        total_frames=-1,
        launcher="mp",
        backend=backend,
        sync=sync,
        device=device,
        storing_device=device,
        update_after_each_batch=False,
        track_policy_version=True,
    )
    expected = torch.device(device)
    # a sync round starts as the last one is taken, so only the first batch after an update may
    # hold the old weights; with sync=False each rank may have one batch under way and one
    # waiting on rank 0, both collected with the old ones
    stale_at_most = 1 if sync else 2 * ranks
    try:
        batches = iter(collector)
        for version in range(1, 4):
            with torch.no_grad():
                policy.module.bias.fill_(float(version))
            collector.update_policy_weights_()
            seen = []
            for _ in range(stale_at_most + 2):
                batch = next(batches)
                assert batch.device == expected, (batch.device, expected)
                assert batch["observation"].device.type == expected.type
                # the weights a rank says it collected with are the ones each frame shows
                marker = batch["marker"][..., 0]
                stamp = batch["policy_version"].to(marker.dtype)
                assert torch.equal(marker, stamp), (marker.unique(), stamp.unique())
                seen.extend(batch["policy_version"].unique().tolist())
            assert set(seen) <= {version - 1, version}, (version, seen)
            assert seen.count(version - 1) <= stale_at_most, (version, seen)
            assert version in seen, (version, seen)
        print(f"ok {backend} on {device}, sync={sync}: {ranks} rank(s), 3 weight updates")
    finally:
        collector.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="nccl")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--ranks", type=int, default=None, help="default: GPUs - 1")
    args = parser.parse_args(argv)
    ranks = args.ranks
    if ranks is None:
        ranks = max(1, torch.cuda.device_count() - 1) if args.device == "cuda" else 2
    for sync in (True, False):
        check(args.backend, args.device, ranks, sync)
    return 0


if __name__ == "__main__":
    sys.exit(main())
