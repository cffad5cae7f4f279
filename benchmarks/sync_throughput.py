"""Frames/s of SyncDataCollector against a plain gymnasium loop calling the same policy.

CartPole-v1, a one-hot categorical actor over a 2x64 MLP. The plain loop steps the same env
(1 env, or a 32-env SyncVectorEnv) and calls the same policy object the same way a bare training
script would; the collector additionally records TorchRL's full batch layout. Both run
interleaved in one process, best of ``--repeats``.

    python benchmarks/sync_throughput.py            # both policy kinds, 1 and 32 envs
    python benchmarks/sync_throughput.py --frames 50000 --repeats 5

Targets (issue 2): collector >= 0.6x the plain loop with 1 env, >= 0.8x with 32 envs.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import gymnasium as gym
import torch
from _common import Actor, mlp
from tensordict import TensorDict
from tensordict.nn import (
    InteractionType,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    set_interaction_type,
)
from torch.distributions import OneHotCategorical

from hpccollect import SyncDataCollector


def td_actor() -> ProbabilisticTensorDictSequential:
    """The same actor as a TensorDict module, as TorchRL users write it."""
    return ProbabilisticTensorDictSequential(
        TensorDictModule(mlp(), in_keys=["observation"], out_keys=["logits"]),
        ProbabilisticTensorDictModule(
            in_keys=["logits"], out_keys=["action"], distribution_class=OneHotCategorical
        ),
    )


def make_env(num_envs: int):
    if num_envs == 1:
        return gym.make("CartPole-v1")
    return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * num_envs)


def plain_loop(policy, kind: str, num_envs: int, frames: int) -> float:
    """Step the env with the policy, no collector; return frames/s."""
    env = make_env(num_envs)
    obs, _ = env.reset(seed=0)
    steps = frames // num_envs
    start = time.perf_counter()
    # Sample actions, as the collector does by default (ExplorationType.RANDOM); outside this
    # context tensordict's probabilistic modules would take the cheaper deterministic mode.
    with torch.no_grad(), set_interaction_type(InteractionType.RANDOM):
        for _ in range(steps):
            if kind == "module":
                action = policy(torch.from_numpy(obs))
            else:
                td = TensorDict(observation=torch.from_numpy(obs), batch_size=obs.shape[:-1])
                action = policy(td)["action"]
            index = action.argmax(-1).numpy()
            if num_envs == 1:
                obs, _, term, trunc, _ = env.step(int(index))
                if term or trunc:
                    obs, _ = env.reset()
            else:
                obs, _, _, _, _ = env.step(index)
    elapsed = time.perf_counter() - start
    env.close()
    return steps * num_envs / elapsed


def collector_loop(policy, num_envs: int, frames: int) -> float:
    """The same policy and env through SyncDataCollector; return frames/s."""
    fpb = 1000 if num_envs == 1 else 32 * 100
    total = max(fpb, frames // fpb * fpb)
    collector = SyncDataCollector(
        lambda: make_env(num_envs), policy, frames_per_batch=fpb, total_frames=total
    )
    collector.set_seed(0)
    start = time.perf_counter()
    n = 0
    for batch in collector:
        n += batch.numel()
    elapsed = time.perf_counter() - start
    collector.shutdown()
    return n / elapsed


@dataclass
class Result:
    kind: str
    num_envs: int
    plain: float
    collector: float

    @property
    def ratio(self) -> float:
        return self.collector / self.plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=20_000, help="frames per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (best kept)")
    parser.add_argument("--policy", choices=["module", "td", "both"], default="both")
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 32])
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    kinds = ["module", "td"] if args.policy == "both" else [args.policy]
    results = []
    for kind in kinds:
        policy = Actor() if kind == "module" else td_actor()
        for num_envs in args.envs:
            frames = args.frames * (4 if num_envs > 1 else 1)
            plain, coll = [], []
            for _ in range(args.repeats):
                plain.append(plain_loop(policy, kind, num_envs, frames))
                coll.append(collector_loop(policy, num_envs, frames))
            results.append(Result(kind, num_envs, max(plain), max(coll)))
            r = results[-1]
            target = 0.6 if num_envs == 1 else 0.8
            verdict = "meets" if r.ratio >= target else "BELOW"
            print(
                f"policy={kind:6s} envs={num_envs:3d}  plain={r.plain:9.0f} f/s  "
                f"collector={r.collector:9.0f} f/s  ratio={r.ratio:.3f}x  "
                f"({verdict} the {target}x target)",
                flush=True,
            )


if __name__ == "__main__":
    main()
