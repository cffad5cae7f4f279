"""SyncDataCollector: every argument and method of TorchRL's, on real gymnasium envs."""

from __future__ import annotations

import threading
import warnings

import gymnasium as gym
import pytest
import torch
from conftest import CounterEnv
from tensordict import TensorDict
from tensordict.nn import (
    InteractionType,
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
)
from torch import nn
from torch.distributions import OneHotCategorical

from hpccollect import (
    ExplorationType,
    GymEnv,
    Interruptor,
    LocalWeightsUpdaterBase,
    ReplayBuffer,
    SyncDataCollector,
)
from hpccollect._compat import pad_keeps_names
from hpccollect.errors import ArgumentTypeError, ArgumentValueError, EnvError

# The batch printed in ../shared/seeds/SyncDataCollector.txt (Pendulum-v1, max_frames_per_traj=50,
# frames_per_batch=200): key -> (shape, dtype). TorchRL's gym wrapper also writes `terminated`.
SEED_LAYOUT = {
    "action": ((200, 1), torch.float32),
    ("collector", "traj_ids"): ((200,), torch.int64),
    "done": ((200, 1), torch.bool),
    ("next", "done"): ((200, 1), torch.bool),
    ("next", "observation"): ((200, 3), torch.float32),
    ("next", "reward"): ((200, 1), torch.float32),
    ("next", "step_count"): ((200, 1), torch.int64),
    ("next", "truncated"): ((200, 1), torch.bool),
    "observation": ((200, 3), torch.float32),
    "step_count": ((200, 1), torch.int64),
    "truncated": ((200, 1), torch.bool),
}
TERMINATED = {"terminated": ((200, 1), torch.bool), ("next", "terminated"): ((200, 1), torch.bool)}


def counter(length=3, **kw):
    return lambda: CounterEnv(length, **kw)


def first(collector):
    batch = next(iter(collector))
    return batch


def test_seed_pendulum_example_gives_seed_layout():
    env_maker = lambda: GymEnv("Pendulum-v1", device="cpu")  # noqa: E731
    policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    collector = SyncDataCollector(
        create_env_fn=env_maker,
        policy=policy,
        total_frames=2000,
        max_frames_per_traj=50,
        frames_per_batch=200,
        init_random_frames=-1,
        reset_at_each_iter=False,
        device="cpu",
        storing_device="cpu",
    )
    for i, data in enumerate(collector):
        if i == 2:
            break
    layout = {k: (tuple(v.shape), v.dtype) for k, v in data.items(True, True)}
    assert layout == {**SEED_LAYOUT, **TERMINATED}
    assert data.batch_size == (200,) and data.device == torch.device("cpu")
    assert data["collector"].batch_size == (200,)
    assert data.names[-1] == "time"
    # 50-step trajectories, 4 per batch, ids continuing from the two earlier batches
    assert data["collector", "traj_ids"].unique().tolist() == [8, 9, 10, 11]
    assert data["next", "truncated"].squeeze(-1).nonzero().squeeze(-1).tolist() == [
        49,
        99,
        149,
        199,
    ]
    collector.shutdown()


def test_vector_env_layout_and_names():
    collector = SyncDataCollector(
        lambda: gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 4),
        None,
        frames_per_batch=40,
        total_frames=80,
    )
    batches = list(collector)
    assert len(batches) == 2
    for b in batches:
        assert b.batch_size == (4, 10) and b.names == [None, "time"]
        assert b["action"].shape == (4, 10, 2) and b["action"].dtype == torch.int64
        assert b["next", "reward"].shape == (4, 10, 1)
        assert b["collector", "traj_ids"].shape == (4, 10)
    collector.shutdown()


def test_total_frames_exact_and_endless():
    collector = SyncDataCollector(counter(), None, frames_per_batch=25, total_frames=100)
    assert len(collector) == 4
    assert sum(b.numel() for b in collector) == 100
    assert collector.state_dict()["frames"] == 100
    endless = SyncDataCollector(counter(), None, frames_per_batch=10)
    for i, _ in enumerate(endless):
        if i == 7:
            break
    assert endless.state_dict()["frames"] == 80
    with pytest.raises(TypeError):
        len(endless)
    collector.shutdown()
    endless.shutdown()


def test_total_frames_not_divisible_collects_whole_batches():
    """As TorchRL: a warning, and the last batch is whole (110 frames for 105)."""
    with pytest.warns(UserWarning, match=r"total_frames \(105\).*frames_per_batch \(10\).*110"):
        collector = SyncDataCollector(counter(), None, frames_per_batch=10, total_frames=105)
    assert len(collector) == 11
    assert sum(b.numel() for b in collector) == 110
    collector.shutdown()


def test_frames_per_batch_rounded_up_to_env_multiple():
    make = lambda: gym.vector.SyncVectorEnv([counter()] * 4)  # noqa: E731
    with pytest.warns(UserWarning, match="not divisible by the number of envs"):
        collector = SyncDataCollector(make, None, frames_per_batch=10, total_frames=20)
    sizes = [b.batch_size for b in collector]
    assert sizes == [torch.Size([4, 3])] * 2
    collector.shutdown()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"frames_per_batch": 0}, "frames_per_batch must be >= 1"),
        ({"frames_per_batch": -3}, "frames_per_batch must be >= 1"),
        ({"frames_per_batch": "10"}, "frames_per_batch must be an int"),
        ({"frames_per_batch": 2.5}, "frames_per_batch must be an int"),
        ({"frames_per_batch": 10, "total_frames": 0}, "total_frames must be positive"),
        (
            {"frames_per_batch": 10, "max_frames_per_traj": "5"},
            "max_frames_per_traj must be an int",
        ),
        ({"frames_per_batch": 10, "init_random_frames": 1.0}, "init_random_frames must be an int"),
        ({"frames_per_batch": 10, "reset_at_each_iter": "yes"}, "reset_at_each_iter must be True"),
        ({"frames_per_batch": 10, "postproc": 3}, "postproc must be callable"),
        ({"frames_per_batch": 10, "replay_buffer": object()}, "replay_buffer must have an extend"),
        ({"frames_per_batch": 10, "interruptor": 1}, "interruptor must have"),
        ({"frames_per_batch": 10, "device": 1.5}, "device must be a torch.device"),
        ({"frames_per_batch": 10, "storing_device": "gpu"}, "storing_device='gpu' is not a device"),
        ({"frames_per_batch": 10, "exploration_type": "greedy"}, "exploration_type='greedy'"),
        ({"frames_per_batch": 10, "split_trajs": 1}, "split_trajs must be True"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises((ArgumentTypeError, ArgumentValueError), match=match):
        SyncDataCollector(counter(), None, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_device_without_cuda_is_clear():
    for name in ("device", "policy_device", "storing_device", "env_device"):
        # the argument the user passed is named, not one that device filled in
        with pytest.raises(ArgumentValueError, match=rf"^{name}='cuda' asks for CUDA.*available"):
            SyncDataCollector(counter(), None, frames_per_batch=10, **{name: "cuda"})


def test_transitions_are_exact_on_a_counter_env():
    collector = SyncDataCollector(counter(3), None, frames_per_batch=10, total_frames=20)
    data = torch.cat(list(collector))
    obs = data["observation"].squeeze(-1).tolist()
    assert obs == [0, 1, 2] * 6 + [0, 1]
    torch.testing.assert_close(data["next", "observation"], data["observation"] + 1)
    torch.testing.assert_close(data["next", "reward"], data["observation"] + 1)
    ends = data["next", "observation"].squeeze(-1) == 3
    assert (data["next", "terminated"].squeeze(-1) == ends).all()
    assert (data["next", "done"].squeeze(-1) == ends).all()
    assert not data["next", "truncated"].any() and not data["done"].any()
    assert data["collector", "traj_ids"].tolist() == [i // 3 for i in range(20)]
    collector.shutdown()


@pytest.mark.parametrize(
    "mode", [gym.vector.AutoresetMode.NEXT_STEP, gym.vector.AutoresetMode.SAME_STEP]
)
def test_vector_env_never_records_the_autoreset_step(mode):
    lengths = [2, 3, 5]
    make = lambda: gym.vector.SyncVectorEnv(  # noqa: E731
        [counter(n) for n in lengths], autoreset_mode=mode
    )
    collector = SyncDataCollector(make, None, frames_per_batch=60, total_frames=120)
    for batch in collector:
        for row, length in enumerate(lengths):
            obs = batch["observation"][row].squeeze(-1)
            nxt = batch["next", "observation"][row].squeeze(-1)
            torch.testing.assert_close(nxt, obs + 1)
            assert (obs < length).all()
            assert ((nxt == length) == batch["next", "done"][row].squeeze(-1)).all()
    collector.shutdown()


def test_traj_ids_unique_and_increasing_as_trajectories_start():
    make = lambda: gym.vector.SyncVectorEnv([counter(n) for n in (2, 3, 4)])  # noqa: E731
    collector = SyncDataCollector(make, None, frames_per_batch=30, total_frames=90)
    data = torch.cat(list(collector), 1)
    ids, done = data["collector", "traj_ids"], data["next", "done"].squeeze(-1)
    owner = {}
    for row in range(3):
        for t in range(ids.shape[1]):
            assert owner.setdefault(int(ids[row, t]), row) == row, "an id is used by two envs"
            if t:
                # a new id starts exactly after a done step, and is larger than every id before
                assert (ids[row, t] != ids[row, t - 1]) == bool(done[row, t - 1])
                if done[row, t - 1]:
                    assert ids[row, t] > ids[:, :t].max()
    assert ids[:, 0].tolist() == [0, 1, 2]
    collector.shutdown()


def test_max_frames_per_traj_counts_and_truncates():
    collector = SyncDataCollector(
        counter(100), None, frames_per_batch=12, max_frames_per_traj=4, total_frames=24
    )
    data = torch.cat(list(collector))
    assert data["step_count"].squeeze(-1).tolist() == [0, 1, 2, 3] * 6
    assert data["next", "step_count"].squeeze(-1).tolist() == [1, 2, 3, 4] * 6
    trunc = data["next", "truncated"].squeeze(-1)
    assert trunc.tolist() == [False, False, False, True] * 6
    assert (data["next", "done"].squeeze(-1) == trunc).all()
    assert not data["next", "terminated"].any()
    assert data["collector", "traj_ids"].tolist() == [i // 4 for i in range(24)]
    collector.shutdown()
    plain = SyncDataCollector(counter(), None, frames_per_batch=5, max_frames_per_traj=-1)
    assert "step_count" not in first(plain).keys()
    plain.shutdown()


class CountingPolicy(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, observation):
        self.calls += 1
        return torch.nn.functional.one_hot(torch.tensor(1), 2)


def test_init_random_frames_skips_the_policy():
    policy = CountingPolicy()
    collector = SyncDataCollector(
        counter(), policy, frames_per_batch=10, total_frames=40, init_random_frames=20
    )
    calls = []
    for batch in collector:
        calls.append(policy.calls)
        last = batch
    assert calls[0] == calls[1] == 1  # only the construction-time check
    assert calls[2] == 11 and calls[3] == 21
    assert (last["action"].argmax(-1) == 1).all()
    collector.shutdown()


def test_reset_at_each_iter_starts_new_trajectories():
    collector = SyncDataCollector(
        counter(100), None, frames_per_batch=5, total_frames=15, reset_at_each_iter=True
    )
    batches = list(collector)
    for b in batches:
        assert b["observation"].squeeze(-1).tolist() == [0, 1, 2, 3, 4]
    assert [b["collector", "traj_ids"].unique().item() for b in batches] == [0, 1, 2]
    collector.shutdown()


def test_postproc_is_applied():
    def postproc(td):
        td["double_reward"] = td["next", "reward"] * 2
        return td

    collector = SyncDataCollector(counter(), None, frames_per_batch=6, postproc=postproc)
    batch = first(collector)
    torch.testing.assert_close(batch["double_reward"], batch["next", "reward"] * 2)
    collector.shutdown()


def test_split_trajs_pads_and_masks():
    collector = SyncDataCollector(counter(3), None, frames_per_batch=10, split_trajs=True)
    batch = first(collector)
    # named as TorchRL names it: [None, "time"], unnamed on tensordict 0.14 (whose pad drops names)
    assert batch.batch_size == (4, 3)
    assert batch.names == [None, "time" if pad_keeps_names() else None]
    mask = batch["collector", "mask"]
    assert mask.sum(-1).tolist() == [3, 3, 3, 1]
    assert batch["observation"][3, 1:].abs().sum() == 0
    assert batch["collector", "traj_ids"][:, 0].tolist() == [0, 1, 2, 3]
    collector.shutdown()


def _td_actor():
    return ProbabilisticTensorDictSequential(
        TensorDictModule(nn.Linear(4, 2), in_keys=["observation"], out_keys=["logits"]),
        ProbabilisticTensorDictModule(
            in_keys=["logits"], out_keys=["action"], distribution_class=OneHotCategorical
        ),
    )


def test_exploration_type_mode_vs_random():
    torch.manual_seed(0)
    actor = _td_actor()
    actor[0].module.weight.data.mul_(0.01)  # near-uniform logits: random differs from mode
    mode = SyncDataCollector(
        "CartPole-v1", actor, frames_per_batch=200, exploration_type=ExplorationType.MODE
    )
    batch = first(mode)
    assert "logits" in batch.keys()  # policy outputs are recorded, as in TorchRL
    assert (batch["action"].argmax(-1) == batch["logits"].argmax(-1)).all()
    rand = SyncDataCollector(
        "CartPole-v1", actor, frames_per_batch=200, exploration_type=InteractionType.RANDOM
    )
    batch = first(rand)
    assert (batch["action"].argmax(-1) != batch["logits"].argmax(-1)).any()
    mode.shutdown()
    rand.shutdown()


def test_return_same_td():
    collector = SyncDataCollector(counter(100), None, frames_per_batch=4, return_same_td=True)
    it = iter(collector)
    a = next(it)
    first_obs = a["observation"].clone()
    b = next(it)
    assert a is b and not torch.equal(first_obs, b["observation"])
    marked = SyncDataCollector(
        counter(100), None, frames_per_batch=4, return_same_td=True, set_truncated=True
    )
    it = iter(marked)
    for _ in range(3):
        assert next(it)["next", "truncated"].squeeze(-1).tolist() == [False] * 3 + [True]
    marked.shutdown()
    fresh = SyncDataCollector(counter(100), None, frames_per_batch=4)
    it = iter(fresh)
    assert next(it) is not next(it)
    collector.shutdown()
    fresh.shutdown()


def test_reset_when_done_false_keeps_stepping():
    collector = SyncDataCollector(counter(2), None, frames_per_batch=5, reset_when_done=False)
    batch = first(collector)
    assert batch["observation"].squeeze(-1).tolist() == [0, 1, 2, 3, 4]
    assert batch["done"].squeeze(-1).tolist() == [False, False, True, True, True]
    assert batch["collector", "traj_ids"].unique().tolist() == [0]
    collector.shutdown()


def test_interruptor_cuts_the_batch():
    """As in TorchRL the cut batch keeps its length: the steps not taken have trajectory id -1
    (and zeros); only the real frames are counted."""
    interruptor = Interruptor()
    collector = SyncDataCollector(counter(), None, frames_per_batch=10, interruptor=interruptor)
    interruptor.stop_collection()
    it = iter(collector)
    cut = next(it)
    assert cut.batch_size == (10,) and cut.names == ["time"]
    ids = cut["collector", "traj_ids"]
    assert ids[0] == 0 and (ids[1:] == -1).all() and not cut["observation"][1:].any()
    assert collector.stats()["frames"] == 1
    interruptor.start_collection()
    full = next(it)
    assert full.batch_size == (10,) and (full["collector", "traj_ids"] >= 0).all()
    assert collector.stats()["frames"] == 11
    collector.shutdown()


def test_set_truncated_marks_last_step():
    collector = SyncDataCollector(counter(100), None, frames_per_batch=5, set_truncated=True)
    batch = first(collector)
    assert batch["next", "truncated"].squeeze(-1).tolist() == [False] * 4 + [True]
    assert batch["next", "done"].squeeze(-1).tolist() == [False] * 4 + [True]
    assert not batch["next", "terminated"].any()
    collector.shutdown()


def test_replay_buffer_iteration_yields_none_and_fills():
    rb = ReplayBuffer(1000)
    collector = SyncDataCollector(
        counter(), None, frames_per_batch=10, total_frames=30, replay_buffer=rb
    )
    assert list(collector) == [None, None, None]
    assert len(rb) == 30 and rb.sample(5).batch_size == (5,)
    collector.shutdown()


@pytest.mark.timeout(60)
def test_start_and_async_shutdown_leave_no_thread():
    rb = ReplayBuffer(100_000)
    before = threading.active_count()
    collector = SyncDataCollector("CartPole-v1", None, frames_per_batch=50, replay_buffer=rb)
    collector.start()
    deadline = threading.Event()
    for _ in range(200):
        if len(rb) >= 500:
            break
        deadline.wait(0.05)
    sample = rb.sample(32)  # sampling while the collector thread writes
    assert sample["observation"].shape == (32, 4)
    with pytest.raises(RuntimeError, match=r"filling its replay_buffer \(start\(\)\): call"):
        iter(collector)  # a second iterator would step the same env and policy at once
    with pytest.raises(RuntimeError, match="filling its replay_buffer"):
        collector.next()
    collector.async_shutdown(timeout=10)
    assert len(rb) >= 500
    assert threading.active_count() == before
    collector.async_shutdown()  # twice is fine
    with pytest.raises(RuntimeError, match="needs a replay_buffer"):
        SyncDataCollector("CartPole-v1", None, frames_per_batch=5).start()


def test_background_error_is_raised_by_async_shutdown():
    rb = ReplayBuffer(1000)
    collector = SyncDataCollector(
        counter(3, fail_at=20), None, frames_per_batch=5, replay_buffer=rb
    )
    collector.start()
    for _ in range(100):
        if not collector._background.alive:
            break
        threading.Event().wait(0.05)
    with pytest.raises(EnvError, match="CounterEnv failed on purpose"):
        collector.async_shutdown(timeout=10)


def test_set_seed_returns_last_seed_and_reproduces_batches():
    def run(seed):
        torch.manual_seed(0)
        collector = SyncDataCollector(
            lambda: gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 3),
            _td_actor(),
            frames_per_batch=30,
            total_frames=90,
        )
        assert collector.set_seed(seed) == seed + 2
        out = torch.cat(list(collector), 1)
        collector.shutdown()
        return out

    a, b, c = run(7), run(7), run(8)
    assert (a == b).all()
    assert not torch.equal(a["observation"], c["observation"])


def test_set_seed_static_and_random_policy_reproducible():
    runs = []
    for _ in range(2):
        collector = SyncDataCollector("CartPole-v1", None, frames_per_batch=50)
        assert collector.set_seed(3, static_seed=True) == 3
        runs.append(first(collector))
        collector.shutdown()
    assert (runs[0] == runs[1]).all()


def test_state_dict_roundtrip():
    policy = nn.Linear(1, 2)
    collector = SyncDataCollector(counter(), policy, frames_per_batch=5, total_frames=20)
    it = iter(collector)
    next(it)
    next(it)
    state = collector.state_dict()
    assert set(state) == {"policy_state_dict", "env_state_dict", "frames", "iter", "traj_pool"}
    assert state["frames"] == 10 and state["iter"] == 1  # TorchRL's: the last batch's index
    other = SyncDataCollector(counter(), nn.Linear(1, 2), frames_per_batch=5, total_frames=20)
    other.load_state_dict(state)
    torch.testing.assert_close(other.policy.module.weight, policy.weight)
    saved = int(state["traj_pool"]["traj_id"])
    assert int(other.state_dict()["traj_pool"]["traj_id"]) > saved
    rest = list(other)
    assert len(rest) == 2  # resumes: 10 of 20 frames left
    # the running trajectory goes on under an id not saved before (TorchRL's)
    assert (rest[0]["collector", "traj_ids"] >= saved).all()
    collector.shutdown()
    other.shutdown()


def test_update_policy_weights_reaches_the_policy():
    policy = TensorDictModule(nn.Linear(1, 2), in_keys=["observation"], out_keys=["action"])
    collector = SyncDataCollector(counter(100), policy, frames_per_batch=5)
    trained = nn.Linear(1, 2)
    collector.update_policy_weights_(TensorDictModule(trained, ["observation"], ["action"]))
    torch.testing.assert_close(policy.module.weight, trained.weight)
    batch = first(collector)
    torch.testing.assert_close(batch["action"], trained(batch["observation"]).detach())
    collector.update_policy_weights_(trained.state_dict())
    other = nn.Linear(1, 2)
    collector.update_policy_weights_(policy_weights=TensorDict.from_module(other))  # old keyword
    torch.testing.assert_close(policy.module.weight, other.weight)
    collector.update_policy_weights_()  # shared weights: nothing to fetch, no error
    with pytest.raises(TypeError, match="worker_ids"):
        collector.update_policy_weights_(worker_ids=[0])
    random = SyncDataCollector(counter(), None, frames_per_batch=5)
    with pytest.raises(ArgumentValueError, match="no parameters"):
        random.update_policy_weights_(trained)
    collector.shutdown()
    random.shutdown()


def test_custom_local_weight_updater_and_init_updater():
    class FromServer(LocalWeightsUpdaterBase):
        def __init__(self):
            self.server = None
            self.initialised = None

        def init(self, server):
            self.server = server

        def _get_server_weights(self):
            return TensorDict.from_module(self.server)

        def _get_local_weights(self):
            return TensorDict.from_module(self.collector.policy)

        def _maybe_map_weights(self, w):
            return TensorDict({"module": w}, [])  # server: bare net; local: TensorDictModule

        def _update_local_weights(self, local, mapped):
            local.update_(mapped)

    updater = FromServer()
    policy = nn.Linear(1, 2)
    collector = SyncDataCollector(
        counter(), policy, frames_per_batch=5, local_weight_updater=updater
    )
    assert updater.collector is collector
    server = nn.Linear(1, 2)
    collector.init_updater(server)
    collector.update_policy_weights_()
    torch.testing.assert_close(policy.weight, server.weight)
    assert updater.server is server
    collector.shutdown()


def test_shutdown_twice_and_context_manager():
    with SyncDataCollector(counter(), None, frames_per_batch=5) as collector:
        first(collector)
    assert collector.env._closed
    collector.shutdown()
    collector.shutdown()
    assert list(collector) == []  # a closed collector yields nothing


def test_env_error_names_env_and_step():
    collector = SyncDataCollector(
        lambda: gym.make("hpccollect-test/Counter-v0", fail_at=7), None, frames_per_batch=5
    )
    with pytest.raises(EnvError, match=r"Counter-v0.*RuntimeError in step\(\) at step 6") as info:
        list(zip(range(3), collector))
    assert info.value.step == 6 and "Counter" in info.value.env_name
    collector.shutdown()


def test_policy_forms_end_to_end():
    for policy in (
        lambda td: td.set("action", torch.nn.functional.one_hot(torch.tensor(0), 2)),
        lambda observation: torch.nn.functional.one_hot(torch.tensor(1), 2),
        nn.Sequential(nn.Linear(4, 2), nn.Softmax(-1)),
    ):
        collector = SyncDataCollector("CartPole-v1", policy, frames_per_batch=8)
        assert first(collector)["action"].shape[0] == 8
        collector.shutdown()


def test_dict_observation_env_with_module_policy():
    class DictPolicy(nn.Module):
        def forward(self, position, sensors_lidar, velocity):
            return torch.tanh(position + sensors_lidar[..., :2] + velocity)

    collector = SyncDataCollector("hpccollect-test/DictObs-v0", None, frames_per_batch=20)
    batch = first(collector)
    assert {"position", "velocity", ("sensors", "lidar"), ("next", "sensors", "lidar")} <= set(
        batch.keys(True, True)
    )
    assert "observation" not in batch.keys()
    collector.shutdown()
    policy = TensorDictModule(
        DictPolicy(), in_keys=["position", ("sensors", "lidar"), "velocity"], out_keys=["action"]
    )
    collector = SyncDataCollector("hpccollect-test/DictObs-v0", policy, frames_per_batch=20)
    batch = first(collector)
    assert batch["action"].shape == (20, 2)
    collector.shutdown()


def test_storing_device_and_create_env_kwargs():
    collector = SyncDataCollector(
        lambda length: CounterEnv(length),
        None,
        frames_per_batch=8,
        create_env_kwargs={"length": 4},
        storing_device="cpu",
    )
    batch = first(collector)
    assert batch.device == torch.device("cpu")
    assert batch["next", "observation"].max() == 4
    collector.shutdown()
    nodev = SyncDataCollector(counter(), None, frames_per_batch=4)
    assert first(nodev).device is None
    nodev.shutdown()


def test_rollout_next_and_iterator():
    collector = SyncDataCollector(counter(), None, frames_per_batch=4, total_frames=8)
    assert collector.rollout().batch_size == (4,)
    assert collector.state_dict()["frames"] == 0  # rollout() does not count frames
    assert collector.next().batch_size == (4,)
    assert collector.next().batch_size == (4,)
    assert collector.next() is None
    assert [b.numel() for b in collector.iterator()] == []  # exhausted: total reached
    collector.shutdown()


def test_no_warnings_on_the_common_path():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        collector = SyncDataCollector(
            "CartPole-v1", nn.Linear(4, 2), frames_per_batch=16, total_frames=32
        )
        list(collector)
        collector.shutdown()


def test_any_object_with_extend_is_a_replay_buffer():
    class Sink:
        def __init__(self):
            self.frames = 0

        def extend(self, batch):
            self.frames += batch.numel()

    sink = Sink()
    collector = SyncDataCollector(
        counter(), None, frames_per_batch=6, total_frames=18, replay_buffer=sink
    )
    assert list(collector) == [None] * 3 and sink.frames == 18
    collector.shutdown()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_policy_and_storing_device_cuda():
    policy = nn.Linear(4, 2)  # on CPU: the collector runs a CUDA copy
    collector = SyncDataCollector(
        "CartPole-v1", policy, frames_per_batch=16, policy_device="cuda", storing_device="cuda"
    )
    batch = first(collector)
    assert batch.device.type == "cuda" and batch["action"].device.type == "cuda"
    assert collector.policy.module.weight.device.type == "cuda"
    with torch.no_grad():
        policy.weight.add_(1.0)
    collector.update_policy_weights_()  # copies the CPU policy into the CUDA copy
    torch.testing.assert_close(collector.policy.module.weight.cpu(), policy.weight)
    collector.shutdown()


def test_policy_inputs_follow_declared_in_keys():
    seen = {}

    class ReadsDone(nn.Module):
        def forward(self, observation, done):
            seen["done"] = done.shape
            return torch.nn.functional.one_hot(torch.tensor(0), 2)

    policy = TensorDictModule(ReadsDone(), in_keys=["observation", "done"], out_keys=["action"])
    collector = SyncDataCollector("CartPole-v1", policy, frames_per_batch=4)
    first(collector)
    assert seen["done"] == (1,)
    collector.shutdown()

    keys = set()

    def td_policy(td):
        keys.update(td.keys())
        return td.set("action", torch.nn.functional.one_hot(torch.tensor(0), 2))

    collector = SyncDataCollector(counter(), td_policy, frames_per_batch=4, max_frames_per_traj=9)
    first(collector)
    assert {"observation", "done", "terminated", "truncated", "step_count"} <= keys
    collector.shutdown()


def test_wrapped_policy_is_what_the_collector_calls():
    """TorchRL's ``_wrapped_policy``: a plain module, wrapped to write the action."""
    policy = nn.Linear(4, 2)
    collector = SyncDataCollector("CartPole-v1", policy, frames_per_batch=4)
    try:
        wrapped = collector._wrapped_policy
        assert isinstance(wrapped, TensorDictModule) and wrapped.out_keys == ["action"]
        assert wrapped.module is policy
    finally:
        collector.shutdown()


class _RefusesToClose(CounterEnv):
    def close(self):
        raise RuntimeError("trying to close an environment that never started")


def test_a_set_up_failure_shows_its_own_error_not_the_envs_close():
    """When the set-up fails after the env exists, the env is closed and the set-up's error is
    raised; an env that then refuses to close must not hide it (a TorchRL ``ParallelEnv``
    whose workers never started does)."""

    def factory():
        raise ValueError("the policy factory failed")

    with pytest.raises(ValueError, match="the policy factory failed") as caught:
        SyncDataCollector(_RefusesToClose, policy_factory=factory, frames_per_batch=4)
    assert "never started" not in str(caught.value)
