"""Frames/s on a TorchRL env: hpccollect's collectors against the env's own ``rollout`` and
torchrl's ``Collector``, in one run (needs torchrl: the second test environment has it).

The env is TorchRL's tutorial CartPole, ``TransformedEnv(GymEnv("CartPole-v1"), StepCounter())``,
alone and as a ``SerialEnv`` of 8; the policy a ``ProbabilisticActor`` over a 2x64 MLP sampling
``OneHotCategorical``. The limit is ``env.rollout(T, policy, break_when_any_done=False)``: the
same steps with nothing recorded beyond what the env returns. Rows interleave, best of
``--repeats``.

    .venv-torchrl/bin/python benchmarks/torchrl_env_throughput.py
    .venv-torchrl/bin/python benchmarks/torchrl_env_throughput.py --frames 20000 --repeats 5

Targets (issue 18): hpccollect's Collector >= 0.95x env.rollout with 1 env and with the
SerialEnv, never below torchrl's Collector; MultiSyncCollector with 2 workers >= 1.6x
hpccollect's Collector.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from _common import mlp
from tensordict.nn import InteractionType, TensorDictModule, set_interaction_type
from torchrl.collectors import Collector as TorchRLCollector
from torchrl.envs import GymEnv, SerialEnv, StepCounter, TransformedEnv
from torchrl.modules import OneHotCategorical, ProbabilisticActor

import hpccollect

warnings.filterwarnings("ignore")


def cartpole() -> TransformedEnv:
    return TransformedEnv(GymEnv("CartPole-v1"), StepCounter())


def serial8() -> SerialEnv:
    return SerialEnv(8, cartpole)


def actor(env) -> ProbabilisticActor:
    net = TensorDictModule(mlp(), in_keys=["observation"], out_keys=["logits"])
    return ProbabilisticActor(
        net,
        in_keys=["logits"],
        out_keys=["action"],
        distribution_class=OneHotCategorical,
        spec=env.action_spec,
    )


def env_rollout(make, frames: int) -> float:
    env = make()
    policy = actor(env)
    steps = frames // 4 // env.batch_size.numel()  # four "batches", as the collectors run
    start = time.perf_counter()
    with torch.no_grad(), set_interaction_type(InteractionType.RANDOM):
        for _ in range(4):
            env.rollout(steps, policy, break_when_any_done=False)
    seconds = time.perf_counter() - start
    env.close()
    return 4 * steps * env.batch_size.numel() / seconds


def collector(cls, make, frames: int, **kwargs) -> float:
    env = make()
    c = cls(env, actor(env), frames_per_batch=frames // 4, total_frames=frames, **kwargs)
    start = time.perf_counter()
    n = sum(b.numel() for b in c)
    seconds = time.perf_counter() - start
    c.shutdown()
    return n / seconds


def multi(frames: int) -> float:
    env = cartpole()
    policy = actor(env)
    env.close()
    c = hpccollect.MultiSyncCollector(
        [cartpole, cartpole], policy, frames_per_batch=frames // 8, total_frames=frames
    )
    it = iter(c)
    first = next(it)  # start-up excluded, as for the one-process rows
    start = time.perf_counter()
    n = sum(b.numel() for b in it)
    seconds = time.perf_counter() - start
    c.shutdown()
    return n / seconds if first is not None else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = {
        ("1 env", "env.rollout"): lambda: env_rollout(cartpole, args.frames),
        ("1 env", "torchrl Collector"): lambda: collector(TorchRLCollector, cartpole, args.frames),
        ("1 env", "hpccollect Collector"): lambda: collector(
            hpccollect.Collector, cartpole, args.frames
        ),
        ("SerialEnv(8)", "env.rollout"): lambda: env_rollout(serial8, args.frames),
        ("SerialEnv(8)", "torchrl Collector"): lambda: collector(
            TorchRLCollector, serial8, args.frames
        ),
        ("SerialEnv(8)", "hpccollect Collector"): lambda: collector(
            hpccollect.Collector, serial8, args.frames
        ),
        ("1 env x 2 workers", "hpccollect MultiSyncCollector"): lambda: multi(args.frames * 2),
    }
    best = dict.fromkeys(rows, 0.0)
    for _ in range(args.repeats):
        for key, run in rows.items():
            best[key] = max(best[key], run())
    print(f"{'env':<18} {'collector':<30} {'frames/s':>9} {'vs env.rollout':>15}")
    for (env, name), fps in best.items():
        ref = best.get((env, "env.rollout"))
        ratio = f"{fps / ref:.2f}x" if ref else "-"
        print(f"{env:<18} {name:<30} {fps:>9.0f} {ratio:>15}")
    one = best[("1 env", "hpccollect Collector")]
    two = best[("1 env x 2 workers", "hpccollect MultiSyncCollector")]
    print(f"MultiSyncCollector(2 workers) / hpccollect Collector (1 env): {two / one:.2f}x")


if __name__ == "__main__":
    main()
