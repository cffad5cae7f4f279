"""TorchRL's ready-made weight updaters (``VanillaWeightUpdater``, ``MultiProcessedWeightUpdater``,
``RemoteModuleWeightUpdater``) and the hooks of ``WeightUpdaterBase`` they run on."""

from __future__ import annotations

import pytest
import torch
from conftest import BiasPolicy, CounterEnv
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from hpccollect.collectors import (
    MultiProcessedWeightUpdater,
    MultiSyncDataCollector,
    RemoteModuleWeightUpdater,
    RemoteWeightsUpdaterBase,
    SyncDataCollector,
    VanillaWeightUpdater,
    WeightUpdaterBase,
)
from hpccollect.errors import ArgumentValueError, PolicyError


def counter() -> CounterEnv:
    return CounterEnv(4)


def bias_policy() -> TensorDictModule:
    return TensorDictModule(BiasPolicy(), ["observation"], ["action"])


def flipped() -> TensorDict:
    return TensorDict({"module": {"bias": torch.tensor([0.0, 1.0])}}, [])


def actions(batch: TensorDict) -> set[int]:
    return set(batch["action"].argmax(-1).tolist())


def test_vanilla_given_as_a_class_is_built_from_the_collectors_policy():
    collector = SyncDataCollector(
        counter, bias_policy(), frames_per_batch=8, weight_updater=VanillaWeightUpdater
    )
    try:
        assert isinstance(collector.local_weight_updater, VanillaWeightUpdater)
        it = iter(collector)
        assert actions(next(it)) == {0}
        collector.update_policy_weights_(flipped())
        assert actions(next(it)) == {1}
    finally:
        collector.shutdown()


def test_vanilla_loads_what_its_weight_getter_returns_when_given_nothing():
    policy = bias_policy()
    updater = VanillaWeightUpdater(
        weight_getter=flipped, policy_weights=TensorDict.from_module(policy)
    )
    collector = SyncDataCollector(counter, policy, frames_per_batch=8, weight_updater=updater)
    try:
        it = iter(collector)
        assert actions(next(it)) == {0}
        collector.update_policy_weights_()
        assert actions(next(it)) == {1}
    finally:
        collector.shutdown()


def test_vanilla_for_a_policy_without_parameters_says_so():
    with pytest.raises(ArgumentValueError, match="no parameters"):
        SyncDataCollector(counter, None, frames_per_batch=8, weight_updater=VanillaWeightUpdater)
    with pytest.raises(TypeError, match="policy_weights must be a TensorDict"):
        VanillaWeightUpdater(policy_weights={"bias": torch.zeros(2)})


def test_multi_processed_writes_each_named_workers_weights_in_place():
    weights = {i: TensorDict({"bias": torch.zeros(2)}, []) for i in range(2)}
    updater = MultiProcessedWeightUpdater(
        get_server_weights=lambda: TensorDict({"bias": torch.ones(2)}, []), policy_weights=weights
    )
    assert updater.all_worker_ids() == [0, 1]
    updater.push_weights(TensorDict({"bias": torch.full((2,), 2.0)}, []), worker_ids=1)
    assert weights[0]["bias"].tolist() == [0, 0] and weights[1]["bias"].tolist() == [2, 2]
    updater.push_weights()  # the server's, to every worker
    assert all(w["bias"].tolist() == [1, 1] for w in weights.values())
    with pytest.raises(ArgumentValueError, match="worker_ids: 5 has no weights"):
        updater.push_weights(worker_ids=[5])


def test_remote_module_takes_weights_only_as_given():
    collector = SyncDataCollector(
        counter, bias_policy(), frames_per_batch=8, weight_updater=RemoteModuleWeightUpdater()
    )
    try:
        collector.update_policy_weights_(flipped())  # checked, moved nowhere
        with pytest.raises(RuntimeError, match=r"update_policy_weights_\(weights\)") as err:
            collector.update_policy_weights_()
        assert isinstance(err.value, PolicyError)
    finally:
        collector.shutdown()


def test_push_weights_runs_torchrls_hooks_in_torchrls_order():
    """No worker ids: one sync without an id; ids: each but the skipped; then the post hooks."""
    calls: list = []

    class Mine(WeightUpdaterBase):
        ids = None

        def _get_server_weights(self):
            return "w"

        def all_worker_ids(self):
            return self.ids

        def _skip_update(self, worker_id):
            return worker_id == 1

        def _sync_weights_with_worker(self, *, worker_id=None, server_weights):
            calls.append((worker_id, server_weights))

    updater = Mine()
    updater.register_post_hook(lambda: calls.append("hook"))
    updater.push_weights()
    updater.ids = [0, 1, 2]
    updater.push_weights("given")
    assert calls == [(None, "w"), "hook", (0, "given"), (2, "given"), "hook"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("given", ["instance", "constructor"])
def test_a_remote_updater_given_as_weight_updater_takes_the_default_senders_place(given):
    sent: list = []

    class Recording(RemoteWeightsUpdaterBase):
        def _get_server_weights(self):
            return TensorDict({"bias": torch.ones(2)}, [])

        def _maybe_map_weights(self, weights):
            return weights

        def all_worker_ids(self):
            return [0, 1]

        def _sync_weights_with_worker(self, worker_id, server_weights):
            sent.append(worker_id)

    updater = Recording()
    collector = MultiSyncDataCollector(
        [counter, counter],
        bias_policy(),
        frames_per_batch=8,
        weight_updater=updater if given == "instance" else lambda: updater,
    )
    try:
        assert collector.remote_weight_updater is updater
        assert updater.collector is collector
        collector.update_policy_weights_()
        assert sent == [0, 1]
    finally:
        collector.shutdown()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["sync", "multi-sync"])
def test_a_weight_updater_constructor_is_called_once_per_collector(kind):
    """TorchRL takes a constructor for ``weight_updater``; each collector builds it once (the
    multi-process path once built it twice, and the second updater was the one registered)."""
    built = []

    class Counted(WeightUpdaterBase):
        def __init__(self) -> None:
            super().__init__()
            built.append(self)

    if kind == "sync":
        collector = SyncDataCollector(counter, None, frames_per_batch=4, weight_updater=Counted)
    else:
        collector = MultiSyncDataCollector(
            [counter], None, frames_per_batch=4, total_frames=8, weight_updater=Counted
        )
    try:
        assert len(built) == 1
        assert built[0] in (collector.local_weight_updater, collector.remote_weight_updater)
    finally:
        collector.shutdown()
