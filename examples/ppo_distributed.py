"""PPO on CartPole-v1 with a DistributedDataCollector: rank 0 trains, collector ranks act.

    mpiexec -n 3 .venv/bin/python examples/ppo_distributed.py     # launcher="mpi": 2 collector ranks
    python examples/ppo_distributed.py                            # launcher="mp": 2 local ranks
    sbatch jobs/train.sh                                          # srun, as under mpiexec

Under ``mpiexec``/``srun`` every rank runs this script; ranks 1..N-1 serve rank 0 inside the
collector's constructor and exit there, so everything after it runs on rank 0 only. Each batch
(``[ranks, envs, T]``) gives one PPO update (GAE, clipped policy loss, value loss, entropy bonus,
a few epochs of minibatches), then ``collector.update_policy_weights_()`` sends the new actor
weights to every rank for its next batch. The critic stays on rank 0.

Mean return: the mean of the returns of the last 20 episodes that ended in the batches seen so
far (a return is the sum of ``("next", "reward")`` over the steps of one trajectory id, which may
span several batches). The run writes ``curve.csv`` (frames, mean return after each batch),
``evals.csv`` (frames, greedy mean return) and ``curve.png`` in ``--out``. Every
``--eval-every`` batches rank 0 plays ``--eval-episodes`` episodes with the actor's most likely
actions and keeps the best policy so far (late in a run PPO's policy may drift away from a
perfect one); the last line, ``final mean return R over F frames``, is that policy's greedy
mean return on twice as many fresh episodes.
"""

from __future__ import annotations

import argparse
import copy
import csv
import sys
import time
from collections import deque
from pathlib import Path

import gymnasium as gym
import torch
from tensordict import TensorDict
from tensordict.nn import (
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
)
from torch import nn
from torch.distributions import OneHotCategorical

from hpccollect import DistributedDataCollector
from hpccollect.launchers.rendezvous import launched_ranks

ENV_ID = "CartPole-v1"
ENVS_PER_RANK = 4
LAST_EPISODES = 20


def make_env() -> gym.vector.VectorEnv:
    """Each collector rank steps ENVS_PER_RANK CartPoles as one vector env."""
    return gym.vector.SyncVectorEnv([lambda: gym.make(ENV_ID)] * ENVS_PER_RANK)


def mlp(out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, out)
    )


def make_actor() -> ProbabilisticTensorDictSequential:
    """observation -> logits -> a one-hot action sampled from them (what the ranks run)."""
    return ProbabilisticTensorDictSequential(
        TensorDictModule(mlp(2), in_keys=["observation"], out_keys=["logits"]),
        ProbabilisticTensorDictModule(
            in_keys=["logits"], out_keys=["action"], distribution_class=OneHotCategorical
        ),
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--total-frames", type=positive, default=300_000)
    p.add_argument(
        "--frames-per-batch", type=positive, default=2000, help="over all ranks (8 envs)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3, help="Adam, annealed linearly to 0")
    p.add_argument("--epochs", type=positive, default=4)
    p.add_argument("--minibatch", type=positive, default=512)
    p.add_argument("--ent-coef", type=float, default=0.01, help="entropy bonus weight")
    p.add_argument(
        "--eval-every", type=positive, default=10, help="batches between greedy evaluations"
    )
    p.add_argument(
        "--eval-episodes", type=positive, default=10, help="episodes of each greedy evaluation"
    )
    p.add_argument(
        "--launcher",
        choices=["mp", "mpi"],
        default=None,
        help="default: mpi under mpiexec/srun, else mp with 2 local ranks",
    )
    p.add_argument("--out", type=Path, default=None, help="run directory (curve.csv, curve.png)")
    p.add_argument("--no-plot", action="store_true", help="write the CSV only")
    args = p.parse_args(argv)
    if not args.lr > 0:
        p.error(f"--lr must be > 0, got {args.lr}")
    return args


def positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def gae(
    td: TensorDict,
    values: torch.Tensor,
    next_values: torch.Tensor,
    gamma: float = 0.99,
    lam: float = 0.95,
) -> torch.Tensor:
    """Advantages over ``[rows, T]``: no bootstrap past a terminal step, no trace past any end
    of episode (termination or truncation); the last step of a row bootstraps from its value."""
    reward = td["next", "reward"].squeeze(-1)
    terminated = td["next", "terminated"].squeeze(-1).float()
    done = td["next", "done"].squeeze(-1).float()
    delta = reward + gamma * next_values * (1 - terminated) - values
    adv = torch.zeros_like(delta)
    running = torch.zeros_like(delta[:, 0])
    for t in reversed(range(delta.shape[1])):
        running = delta[:, t] + gamma * lam * (1 - done[:, t]) * running
        adv[:, t] = running
    return adv


def ppo_update(
    batch: TensorDict,
    actor: nn.Module,
    critic: nn.Module,
    optim: torch.optim.Optimizer,
    args: argparse.Namespace,
) -> dict[str, float]:
    """One PPO update on a batch: clip 0.2, value loss weight 0.5, entropy ``--ent-coef``."""
    td = batch.reshape(-1, batch.shape[-1])  # [rows, T]
    with torch.no_grad():
        values = critic(td["observation"]).squeeze(-1)
        next_values = critic(td["next", "observation"]).squeeze(-1)
        adv = gae(td, values, next_values)
        returns = adv + values
        old_logp = torch.log_softmax(td["logits"], -1)
    flat = TensorDict(
        {
            "obs": td["observation"],
            "action": td["action"].float(),
            "old_logp": old_logp,
            "adv": adv,
            "ret": returns,
        },
        batch_size=adv.shape,
    ).reshape(-1)
    net = actor[0].module
    losses = {"policy": float("nan"), "value": float("nan"), "entropy": float("nan")}
    for _ in range(args.epochs):
        for idx in torch.randperm(flat.numel()).split(args.minibatch):
            mb = flat[idx]
            logp_all = torch.log_softmax(net(mb["obs"]), -1)
            logp = (logp_all * mb["action"]).sum(-1)
            old = (mb["old_logp"] * mb["action"]).sum(-1)
            a = (mb["adv"] - mb["adv"].mean()) / (mb["adv"].std() + 1e-8)
            ratio = (logp - old).exp()
            policy_loss = -torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a).mean()
            value_loss = (critic(mb["obs"]).squeeze(-1) - mb["ret"]).pow(2).mean()
            entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
            loss = policy_loss + 0.5 * value_loss - args.ent_coef * entropy
            optim.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), 0.5)  # each on its own: the value loss
            nn.utils.clip_grad_norm_(critic.parameters(), 0.5)  # must not shrink the policy step
            optim.step()
            losses = {"policy": policy_loss.item(), "value": value_loss.item()}
            losses["entropy"] = entropy.item()
    return losses


class EpisodeReturns:
    """Returns of the episodes that ended, summed per trajectory id across batches."""

    def __init__(self) -> None:
        self.open: dict[int, float] = {}
        self.last: deque[float] = deque(maxlen=LAST_EPISODES)

    def add(self, batch: TensorDict) -> None:
        ids = batch["collector", "traj_ids"].reshape(-1, batch.shape[-1])
        reward = batch["next", "reward"].reshape(*ids.shape)
        done = batch["next", "done"].reshape(*ids.shape)
        for row_ids, row_r, row_d in zip(ids.tolist(), reward.tolist(), done.tolist(), strict=True):
            for i, r, d in zip(row_ids, row_r, row_d, strict=True):
                self.open[i] = self.open.get(i, 0.0) + r
                if d:
                    self.last.append(self.open.pop(i))

    def mean(self) -> float:
        return sum(self.last) / len(self.last) if self.last else float("nan")


def evaluate(actor: ProbabilisticTensorDictSequential, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` episodes of the actor's most likely actions, on rank 0
    (seeds ``seed``, ``seed + 1``, ...)."""
    env, net, total = gym.make(ENV_ID), actor[0].module, 0.0
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + k)
        done = False
        while not done:
            with torch.no_grad():
                action = int(net(torch.as_tensor(obs)).argmax())
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
    env.close()
    return total / episodes


def write_curve(
    out: Path, curve: list[tuple[int, float]], evals: list[tuple[int, float]], plot: bool
) -> None:
    """``curve.csv`` (training), ``evals.csv`` (greedy evaluations) and ``curve.png``."""
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("curve.csv", curve), ("evals.csv", evals)):
        with open(out / name, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["frames", "mean_return"])
            w.writerows(rows)
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(
            [c[0] for c in curve],
            [c[1] for c in curve],
            label=f"training (last {LAST_EPISODES} episodes)",
        )
        ax.plot([e[0] for e in evals], [e[1] for e in evals], "o", ms=3, label="greedy evaluation")
        ax.legend(loc="lower right", fontsize=8)
        ax.axhline(450, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlabel("frames")
        ax.set_ylabel("mean return")
        ax.set_title(f"PPO on {ENV_ID}, DistributedDataCollector, 2 collector ranks")
        fig.tight_layout()
        fig.savefig(out / "curve.png", dpi=100)
        plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    launcher = args.launcher or ("mpi" if launched_ranks() > 1 else "mp")
    torch.manual_seed(args.seed)
    actor, critic = make_actor(), mlp(1)
    collector = DistributedDataCollector(
        make_env if launcher == "mpi" else [make_env, make_env],
        actor,
        frames_per_batch=args.frames_per_batch,
        total_frames=args.total_frames,
        sync=True,
        launcher=launcher,
        backend="gloo",
    )
    # Only rank 0 gets here (under MPI the collector ranks served inside the constructor).
    collector.set_seed(args.seed)
    optim = torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=args.lr)
    returns, curve, frames, start = EpisodeReturns(), [], 0, time.perf_counter()
    best = (-1.0, 0, copy.deepcopy(actor.state_dict()))  # greedy return, frames, weights
    evals: list[tuple[int, float]] = []
    try:
        for i, batch in enumerate(collector):
            frames += batch.numel()
            returns.add(batch)
            for group in optim.param_groups:  # linear annealing to 0 at total_frames
                group["lr"] = args.lr * max(0.0, 1 - frames / args.total_frames)
            losses = ppo_update(batch, actor, critic, optim, args)
            collector.update_policy_weights_()
            curve.append((frames, returns.mean()))
            if (i + 1) % args.eval_every == 0 or frames >= args.total_frames:
                score = evaluate(actor, args.eval_episodes, args.seed + 1_000 * (i + 1))
                evals.append((frames, score))
                if score >= best[0]:  # a tie goes to the policy trained longer
                    best = (score, frames, copy.deepcopy(actor.state_dict()))
            if i % 10 == 0:
                print(
                    f"batch {i:4d}  frames {frames:7d}  mean return {returns.mean():6.1f}  "
                    f"policy {losses['policy']:+.3f}  value {losses['value']:.2f}  "
                    f"entropy {losses['entropy']:.3f}  {time.perf_counter() - start:5.0f} s",
                    flush=True,
                )
    finally:
        collector.shutdown()
    if args.out is not None:
        write_curve(args.out, curve, evals, plot=not args.no_plot)
    # PPO's policy on CartPole can drift away from a perfect one late in a run: the result is
    # the best policy seen, judged again on fresh episodes
    actor.load_state_dict(best[2])
    final = evaluate(actor, 2 * args.eval_episodes, args.seed + 10_000_000)
    print(
        f"training: mean return {returns.mean():.1f} (last {LAST_EPISODES} episodes); best "
        f"policy after {best[1]} frames (greedy mean return {best[0]:.1f})"
    )
    print(f"final mean return {final:.1f} over {frames} frames", flush=True)


if __name__ == "__main__":
    sys.exit(main())
