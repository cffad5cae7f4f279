"""Invariants over many batches and configurations, checked with hypothesis."""

from __future__ import annotations

import gymnasium as gym
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpccollect import SyncDataCollector

ENVS = ["CartPole-v1", "Pendulum-v1", "MountainCar-v0", "Acrobot-v1", "hpccollect-test/DictObs-v0"]


def _obs_keys(batch):
    skip = {"action", "done", "terminated", "truncated", "step_count", "collector", "next"}
    return [k for k in batch.keys(True, True) if (k if isinstance(k, str) else k[0]) not in skip]


def check_batch(batch, max_steps):
    """Everything that must hold in any batch, for every env row."""
    rows = batch if batch.ndim == 2 else batch.unsqueeze(0)
    nxt = rows["next"]
    done, term, trunc = (nxt[k].squeeze(-1) for k in ("done", "terminated", "truncated"))
    assert (done == (term | trunc)).all()
    assert not rows["done"].any()  # reset_when_done: every step starts from a live state
    ids = rows["collector", "traj_ids"]
    same_traj = ids[:, 1:] == ids[:, :-1]
    assert (same_traj == ~done[:, :-1]).all(), "an id changes exactly after a done step"
    for key in _obs_keys(rows):
        # within a trajectory, next/observation at t is the observation at t+1
        nkey = ("next", key) if isinstance(key, str) else ("next", *key)
        a, b = rows[nkey][:, :-1], rows[key][:, 1:]
        assert (a == b)[same_traj].all()
    if max_steps is not None:
        sc, nsc = rows["step_count"].squeeze(-1), nxt["step_count"].squeeze(-1)
        assert (nsc == sc + 1).all() and (nsc <= max_steps).all()
        assert (trunc | (nsc < max_steps)).all()
        assert (sc[:, 1:][same_traj] == nsc[:, :-1][same_traj]).all()
        assert (sc[:, 1:][~same_traj] == 0).all()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    env_id=st.sampled_from(ENVS),
    num_envs=st.sampled_from([1, 2, 4]),
    steps=st.integers(1, 40),
    max_steps=st.one_of(st.none(), st.integers(1, 30)),
    batches=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_batch_invariants(env_id, num_envs, steps, max_steps, batches, seed):
    if num_envs == 1:
        make = lambda: gym.make(env_id)  # noqa: E731
    else:
        make = lambda: gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * num_envs)  # noqa: E731
    collector = SyncDataCollector(
        make,
        None,
        frames_per_batch=steps * num_envs,
        total_frames=steps * num_envs * batches,
        max_frames_per_traj=max_steps,
    )
    collector.set_seed(seed)
    all_ids, previous = set(), None
    for batch in collector:
        assert batch.names[-1] == "time"
        check_batch(batch, max_steps)
        ids = set(batch["collector", "traj_ids"].flatten().tolist())
        if previous is not None:
            rows = batch if batch.ndim == 2 else batch.unsqueeze(0)
            prev = previous if previous.ndim == 2 else previous.unsqueeze(0)
            # trajectories continue across batches with the same id, or start a fresh one
            cont = prev["collector", "traj_ids"][:, -1] == rows["collector", "traj_ids"][:, 0]
            assert (cont == ~prev["next", "done"][:, -1, 0]).all()
            fresh = ids - all_ids
            assert not fresh or min(fresh) > max(all_ids)
        all_ids |= ids
        previous = batch
    collector.shutdown()


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), num_envs=st.sampled_from([1, 3]))
def test_same_seed_same_batches(seed, num_envs):
    def run():
        torch.manual_seed(seed)
        make = (
            (lambda: gym.make("CartPole-v1"))
            if num_envs == 1
            else (lambda: gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * num_envs))
        )
        collector = SyncDataCollector(
            make, None, frames_per_batch=30 * num_envs, total_frames=60 * num_envs
        )
        collector.set_seed(seed)
        out = [b for b in collector]
        collector.shutdown()
        return out

    for a, b in zip(run(), run(), strict=True):
        assert (a == b).all()
