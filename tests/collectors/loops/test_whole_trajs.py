"""``trajs_per_batch``: whole trajectories out of fixed-frame batches, in every local collector."""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest
import torch
from conftest import CounterEnv
from tensordict import TensorDict

import hpccollect
from hpccollect import Collector, MultiaSyncDataCollector, MultiSyncDataCollector
from hpccollect.collectors.loops.whole_trajs import TrajectoryAssembler
from hpccollect.errors import ArgumentValueError


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def counter(length: int = 5):
    return lambda: CounterEnv(length)


def rows(batch: TensorDict, traj_format: str) -> list[TensorDict]:
    """The trajectories of a yielded batch, without padding."""
    if traj_format == "padded":
        return [row[row["collector", "mask"]] for row in batch.unbind(0)]
    ids = batch["collector", "traj_ids"]
    return [batch[ids == i] for i in ids.unique_consecutive().tolist()]


def assert_whole(traj: TensorDict) -> None:
    """One trajectory: one id, done only at its last step, each step following the last."""
    ids = traj["collector", "traj_ids"]
    assert (ids == ids[0]).all()
    done = traj["next", "done"].reshape(-1)
    assert done[-1] and not done[:-1].any()
    assert torch.equal(traj["observation"][1:], traj["next", "observation"][:-1])


@pytest.mark.parametrize("traj_format", ["padded", "cat"])
def test_sync_yields_whole_trajectories(traj_format: str) -> None:
    collector = Collector(
        cartpole,
        None,
        frames_per_batch=50,
        total_frames=1000,
        trajs_per_batch=3,
        traj_format=traj_format,
    )
    collector.set_seed(0)
    batches = list(collector)
    collector.shutdown()
    assert batches
    seen = []
    for batch in batches:
        trajs = rows(batch, traj_format)
        assert len(trajs) == 3
        for traj in trajs:
            assert_whole(traj)
            assert traj["observation"][0].abs().max() <= 0.05  # starts at a reset
        seen += [int(t["collector", "traj_ids"][0]) for t in trajs]
        if traj_format == "padded":
            longest = max(t.shape[0] for t in trajs)
            assert batch.batch_size == torch.Size([3, longest])
            assert batch["collector", "mask"].sum() == sum(t.shape[0] for t in trajs)
        else:
            assert batch.ndim == 1 and "mask" not in batch["collector"].keys()
    assert len(set(seen)) == len(seen)


def test_the_trajectories_are_those_of_the_fixed_frame_batches() -> None:
    """Same seed, same envs: the whole trajectories are the fixed-frame run's completed ones."""
    kwargs = dict(frames_per_batch=40, total_frames=400)
    fixed = Collector(cartpole, None, **kwargs)
    fixed.set_seed(3)
    frames = torch.cat([b for b in fixed], 0)
    fixed.shutdown()
    whole = Collector(cartpole, None, trajs_per_batch=1, traj_format="cat", **kwargs)
    whole.set_seed(3)
    trajs = list(whole)
    whole.shutdown()
    ends = frames["next", "done"].reshape(-1).nonzero().reshape(-1).tolist()
    assert len(trajs) == len(ends) > 3
    start = 0
    for traj, end in zip(trajs, ends, strict=True):
        expected = frames[start : end + 1]
        for key in expected.keys(True, True):
            assert torch.equal(traj.get(key), expected.get(key)), key
        start = end + 1


def test_pieces_from_several_batches_and_envs_are_joined() -> None:
    """Episodes of 5 steps across batches of 3 steps of 2 envs: each comes out whole, in order."""
    collector = Collector(
        lambda: gym.vector.SyncVectorEnv([lambda: CounterEnv(5)] * 2),
        None,
        frames_per_batch=6,
        total_frames=60,
        trajs_per_batch=2,
        traj_format="padded",
    )
    batches = list(collector)
    collector.shutdown()
    assert len(batches) == 6  # 60 frames: 2 envs x 6 episodes of 5 steps
    for batch in batches:
        assert batch.batch_size == torch.Size([2, 5])
        assert batch["collector", "mask"].all()
        assert batch["next", "observation"].squeeze(-1).tolist() == [[1, 2, 3, 4, 5]] * 2


def test_with_a_replay_buffer_whole_trajectories_go_in_flat() -> None:
    class Recording:
        def __init__(self) -> None:
            self.writes: list[TensorDict] = []

        def extend(self, data: TensorDict) -> None:
            self.writes.append(data.clone())

    buffer = Recording()
    collector = Collector(
        counter(4),
        None,
        frames_per_batch=10,
        total_frames=40,
        trajs_per_batch=3,
        trajs_per_write=2,
        replay_buffer=buffer,
    )
    out = list(collector)
    collector.shutdown()
    assert out == [None] * 4
    # episodes end at frames 4, 8 | 12, 16, 20 | 24, 28 | 32, 36, 40: at most 2 per write
    assert [w.shape[0] for w in buffer.writes] == [8, 8, 4, 8, 8, 4]
    flat = torch.cat(buffer.writes)
    done = flat["next", "done"].reshape(-1)
    assert flat["next", "observation"].reshape(-1).tolist() == [1.0, 2.0, 3.0, 4.0] * 10
    assert done.sum() == 10 and done[-1]


def test_reset_at_each_iter_drops_the_interrupted_episodes() -> None:
    collector = Collector(
        counter(4),
        None,
        frames_per_batch=6,
        total_frames=30,
        reset_at_each_iter=True,
        trajs_per_batch=1,
        traj_format="cat",
    )
    trajs = list(collector)
    collector.shutdown()
    assert len(trajs) == 5  # one whole episode per batch; the 2 steps after it are dropped
    for traj in trajs:
        assert traj["next", "observation"].reshape(-1).tolist() == [1, 2, 3, 4]


def test_reset_forgets_the_trajectories_held_back() -> None:
    collector = Collector(
        counter(5), None, frames_per_batch=3, trajs_per_batch=1, traj_format="cat"
    )
    it = iter(collector)
    first = next(it)  # 6 steps taken: one episode out, the next one 1 step in
    assert first["next", "observation"].reshape(-1).tolist() == [1, 2, 3, 4, 5]
    assert collector._assembler.in_flight()
    collector.reset()
    assert not collector._assembler.in_flight()
    second = next(it)
    collector.shutdown()
    assert second["next", "observation"].reshape(-1).tolist() == [1, 2, 3, 4, 5]
    assert second["collector", "traj_ids"][0] > first["collector", "traj_ids"][0] + 1


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("collector_class", "traj_format"),
    [(MultiSyncDataCollector, "padded"), (MultiaSyncDataCollector, "cat")],
)
def test_multi_collectors_yield_whole_trajectories(collector_class, traj_format) -> None:
    collector = collector_class(
        [cartpole, cartpole],
        None,
        frames_per_batch=60,
        total_frames=1200,
        trajs_per_batch=4,
        traj_format=traj_format,
    )
    collector.set_seed(0)
    batches = list(collector)
    collector.shutdown()
    assert batches
    ids = []
    for batch in batches:
        trajs = rows(batch, traj_format)
        assert len(trajs) == 4
        for traj in trajs:
            assert_whole(traj)
        ids += [int(t["collector", "traj_ids"][0]) for t in trajs]
    assert len(set(ids)) == len(ids)
    assert {i % 2 for i in ids} == {0, 1}  # both workers' trajectories


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_workers_fill_a_shared_buffer_with_whole_trajectories() -> None:
    import time

    buffer = hpccollect.ReplayBuffer(2000)
    collector = MultiSyncDataCollector(
        [counter(4), counter(4)],
        None,
        frames_per_batch=6,
        total_frames=-1,
        trajs_per_batch=2,
        replay_buffer=buffer,
    )
    collector.start()
    deadline = time.monotonic() + 30
    while len(buffer) < 40 and time.monotonic() < deadline:
        time.sleep(0.05)
    collector.async_shutdown(timeout=20)
    assert len(buffer) >= 40
    stored = buffer[: len(buffer) - len(buffer) % 4]
    # every write is whole episodes of 4 steps, so the buffer is episodes back to back
    assert stored["next", "observation"].reshape(-1, 4).tolist() == [[1, 2, 3, 4]] * (
        stored.shape[0] // 4
    )


def test_assembler_leaves_out_the_padding_of_a_preempted_worker() -> None:
    def frames(ids: list[int], done: list[bool]) -> TensorDict:
        n = len(ids)
        return TensorDict(
            {
                "x": torch.arange(n),
                "collector": {"traj_ids": torch.tensor(ids)},
                "next": {"done": torch.tensor(done).unsqueeze(-1)},
            },
            [n],
        )

    assembler = TrajectoryAssembler(2, "cat")
    assembler.ingest(frames([0, 0, -1], [False, False, False]))
    assembler.ingest(frames([0, 1, 1], [True, False, True]))
    (out,) = list(assembler.ready())
    assert out["collector", "traj_ids"].tolist() == [0, 0, 0, 1, 1]
    assert out["x"].tolist() == [0, 1, 0, 1, 2]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"trajs_per_batch": 0}, "trajs_per_batch"),
        ({"trajs_per_batch": 2, "traj_format": "ragged"}, "traj_format"),
        ({"traj_format": "cat"}, "only applies to whole-trajectory batches"),
        ({"trajs_per_batch": 2, "split_trajs": True}, "split_trajs"),
        ({"trajs_per_batch": 2, "track_traj_ids": False}, "track_traj_ids"),
    ],
)
def test_bad_trajectory_options_are_refused_at_construction(kwargs, match) -> None:
    with pytest.raises((ArgumentValueError, TypeError), match=match):
        Collector(counter(), None, frames_per_batch=4, **kwargs)


def test_no_traj_format_warns_as_torchrl_does() -> None:
    with pytest.warns(FutureWarning, match="traj_format"):
        Collector(counter(), None, frames_per_batch=4, trajs_per_batch=2).shutdown()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Collector(
            counter(), None, frames_per_batch=4, trajs_per_batch=2, traj_format="cat"
        ).shutdown()
