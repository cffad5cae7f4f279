"""The CUDA paths of the distributed collector, checked and timed on a machine with a GPU.

Three checks, each over gloo with two collector ranks (``launcher="mp"``), CartPole, and an
MLP policy whose action shows its weights (its output layer's bias):

* ``policy_device="cuda"`` on the ranks (their ``collector_kwargs``): the policy runs there;
* ``storing_device="cuda"`` on rank 0: every batch yielded is on the GPU;
* a CUDA policy's weight updates: the trainer's policy lives on the GPU, its weights change
  after every batch, and each rank's next batch takes them (sync and async).

Prints one JSON line per check and writes them to ``--out`` (frames a second, the devices
seen, the batches that showed the new weights). Without a GPU, ``--device cpu`` runs the same
checks on the CPU (what CI can run).

    python benchmarks/cuda_paths.py --out cuda_paths.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import gymnasium as gym
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from hpccollect import DistributedDataCollector


class Policy(nn.Module):
    """An MLP whose output layer reads nothing but its bias (weights zeroed): the action, one-hot
    of the larger output, shows which weights the policy had. Its hidden layer still runs."""

    def __init__(self, hidden: int = 256) -> None:
        super().__init__()
        self.hidden = nn.Linear(4, hidden)
        self.out = nn.Linear(hidden, 2)
        with torch.no_grad():
            self.out.weight.zero_()
            self.out.bias.copy_(torch.tensor([1.0, 0.0]))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        logits = self.out(torch.tanh(self.hidden(observation)))
        return nn.functional.one_hot(logits.argmax(-1), 2)


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def check(device: str, sync: bool, batches: int) -> dict:
    policy = TensorDictModule(Policy(), ["observation"], ["action"]).to(device)
    collector = DistributedDataCollector(
        [cartpole, cartpole],
        policy,
        frames_per_batch=1000,
        total_frames=1000 * batches,
        sync=sync,
        launcher="mp",
        storing_device=device,
        collector_kwargs={"policy_device": device},
        update_after_each_batch=True,
        track_policy_version=True,
    )
    devices, flipped, first, frames = set(), [], None, 0
    try:
        started = time.perf_counter()
        for i, batch in enumerate(collector):
            if i == 0:
                first = time.perf_counter()
            devices.add(str(batch.device))
            action = int(batch["action"].reshape(-1, 2)[0].argmax())
            flipped.append(action)
            frames += batch.numel()
            with torch.no_grad():  # the other action, for the next batches
                policy.module.out.bias.copy_(policy.module.out.bias.flip(0))
        elapsed = time.perf_counter() - first
        startup = first - started
    finally:
        collector.shutdown()
    changes = sum(a != b for a, b in itertools.pairwise(flipped))
    return dict(
        device=device,
        sync=sync,
        batches=len(flipped),
        batch_devices=sorted(devices),
        frames_per_s=round((frames - 1000) / elapsed),
        startup_s=round(startup, 2),
        actions=flipped,
        action_changes=changes,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    info = dict(torch=torch.__version__)
    if args.device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
    print(json.dumps(info), flush=True)
    results = [info]
    for sync in (True, False):
        result = check(args.device, sync, args.batches)
        print(json.dumps(result), flush=True)
        results.append(result)
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
