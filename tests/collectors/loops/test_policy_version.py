"""``track_policy_version``: each frame carries the version of the policy that chose it."""

from __future__ import annotations

import pytest
from conftest import BiasPolicy, CounterEnv, until_each_gave
from tensordict.nn import TensorDictModule

from hpccollect import Collector, MultiaSyncDataCollector, MultiSyncDataCollector
from hpccollect.errors import ArgumentTypeError


def counter() -> CounterEnv:
    return CounterEnv(3)


def policy() -> TensorDictModule:
    return TensorDictModule(BiasPolicy(), ["observation"], ["action"])


def versions(batch) -> tuple[list, list]:
    return batch["policy_version"].tolist(), batch["next", "policy_version"].tolist()


@pytest.mark.parametrize("return_same_td", [False, True])
def test_each_update_is_one_more_version(return_same_td: bool) -> None:
    """As TorchRL's PolicyVersion transform: the next-step version is the one acting; the root
    one, at a batch's first step, the version of the step before it."""
    collector = Collector(
        counter,
        policy(),
        frames_per_batch=4,
        track_policy_version=True,
        return_same_td=return_same_td,
    )
    it = iter(collector)
    first = versions(next(it))
    collector.update_policy_weights_()
    second = versions(next(it))
    collector.update_policy_weights_()
    collector.update_policy_weights_()
    third = versions(next(it))
    assert collector.policy_version == collector.get_policy_version() == 3
    state = collector.state_dict()
    collector.shutdown()
    assert first == ([0, 0, 0, 0], [0, 0, 0, 0])
    assert second == ([0, 1, 1, 1], [1, 1, 1, 1])
    assert third == ([1, 3, 3, 3], [3, 3, 3, 3])
    assert state["policy_version"] == 3


def test_envs_reset_before_a_batch_start_under_the_current_version() -> None:
    collector = Collector(
        counter, policy(), frames_per_batch=4, track_policy_version=True, reset_at_each_iter=True
    )
    it = iter(collector)
    next(it)
    collector.update_policy_weights_()
    after = versions(next(it))
    collector.shutdown()
    assert after == ([1, 1, 1, 1], [1, 1, 1, 1])


def test_the_version_is_saved_and_restored() -> None:
    collector = Collector(counter, policy(), frames_per_batch=4, track_policy_version=True)
    collector.load_state_dict({"policy_version": 7})
    assert collector.policy_version == 7
    batch = next(iter(collector))
    collector.increment_version()
    collector.shutdown()
    assert versions(batch) == ([7] * 4, [7] * 4)
    assert collector.policy_version == 8


def test_off_by_default_and_bad_values_refused() -> None:
    collector = Collector(counter, None, frames_per_batch=4)
    batch = next(iter(collector))
    assert "policy_version" not in batch.keys() and collector.policy_version is None
    assert "policy_version" not in collector.state_dict()
    collector.shutdown()
    with pytest.raises(ArgumentTypeError, match="track_policy_version"):
        Collector(counter, None, frames_per_batch=4, track_policy_version="yes")


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("collector_class", [MultiSyncDataCollector, MultiaSyncDataCollector])
def test_workers_count_the_updates_they_received(collector_class) -> None:
    """Worker 1 got two updates, worker 0 one. A worker's first batch after the updates may
    have started before them (a worker collects ahead); its second started after them. The
    async collector serves whichever worker is ready, and a busy machine may keep one worker
    waiting for many batches, so batches are taken until each worker has delivered two."""
    collector = collector_class(
        [counter, counter], policy(), frames_per_batch=8, track_policy_version=True
    )
    seen: dict[int, int] = {}
    try:
        it = iter(collector)
        next(it)
        collector.update_policy_weights_(worker_ids=[1])
        collector.update_policy_weights_()
        for workers, batch in until_each_gave(it, workers_of, (0, 1), 2):
            ids = batch["collector", "traj_ids"] % 2
            now = batch["next", "policy_version"]
            for worker in workers:
                seen[worker] = max(seen.get(worker, 0), int(now[ids == worker].max()))
    finally:
        collector.shutdown()
    assert seen == {0: 1, 1: 2}


def workers_of(batch) -> set[int]:
    """The workers (of two) whose rows a batch holds: their trajectory ids are theirs mod 2."""
    return set((batch["collector", "traj_ids"] % 2).unique().tolist())
