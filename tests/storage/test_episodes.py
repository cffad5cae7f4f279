"""``EpisodeAssembler``: batches in, whole episodes out, whatever format writes them."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from conftest import CounterEnv

from hpccollect import SyncDataCollector
from hpccollect.errors import ArgumentValueError
from hpccollect.storage.episodes import EpisodeAssembler


def batches(lengths, frames_per_batch, total, **kwargs):
    """A real collector's batches over one CounterEnv per entry of ``lengths``."""
    envs = [partial(CounterEnv, n) for n in lengths]
    collector = SyncDataCollector(
        envs if len(envs) > 1 else envs[0],
        None,
        frames_per_batch=frames_per_batch,
        total_frames=total,
        **kwargs,
    )
    try:
        return [b.clone() for b in collector]
    finally:
        collector.shutdown()


def check_whole(episodes, lengths):
    """Each episode's observations count 0, 1, ... and it ends where its env ends one."""
    offsets = np.concatenate([[0], np.cumsum(episodes.lengths)])
    for i, n in enumerate(episodes.lengths):
        obs = episodes.data["observations"][offsets[i] : offsets[i + 1]].reshape(-1)
        assert obs.tolist() == list(range(n)), obs
        assert n in lengths


@pytest.mark.parametrize("split_trajs", [False, True])
def test_episodes_across_batches_and_env_rows_come_out_whole(split_trajs):
    assembler = EpisodeAssembler()
    seen = []
    for batch in batches([3, 5], 8, 48, split_trajs=split_trajs):
        episodes = assembler.take(batch)
        if episodes is not None:
            check_whole(episodes, (3, 5))
            assert not episodes.data["timeouts"].any()  # each ended by its env
            seen += episodes.ids.tolist()
    assert len(seen) == len(set(seen)) and len(seen) >= 10
    assert episodes.returns() == [float(sum(range(1, n + 1))) for n in episodes.lengths]
    rest = assembler.finish()
    if rest is not None:  # open at the end: kept, ended as truncated
        assert rest.data["timeouts"][np.cumsum(rest.lengths) - 1].all()
        assert not set(rest.ids.tolist()) & set(seen)
    assert assembler.open_episodes == 0 and assembler.finish() is None


def test_an_episode_longer_than_a_batch_waits_for_its_end():
    assembler = EpisodeAssembler()
    first, second = batches([7], 4, 8)
    assert assembler.take(first) is None and assembler.open_episodes == 1
    episodes = assembler.take(second)
    assert episodes.lengths.tolist() == [7] and assembler.open_episodes == 1


def test_a_batch_without_trajectory_ids_or_with_other_keys_is_refused():
    assembler = EpisodeAssembler()
    batch = batches([3], 6, 6)[0]
    with pytest.raises(ArgumentValueError, match="no \\('collector', 'traj_ids'\\)"):
        assembler.take(batch.exclude(("collector", "traj_ids")))
    assembler.take(batch)
    with pytest.raises(ArgumentValueError, match="keys differ from the first batch's"):
        assembler.take(batch.exclude("observation"))
