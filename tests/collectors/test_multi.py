"""Multi-process collectors: real worker processes, real envs, real shared memory."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import pytest
import torch
from conftest import CounterEnv, alive, assert_none_started_left, parent, started_here
from tensordict import TensorDict
from torch import nn

from hpccollect import (
    MultiaSyncDataCollector,
    MultiSyncDataCollector,
    ReplayBuffer,
    SyncDataCollector,
    aSyncDataCollector,
)
from hpccollect.errors import ArgumentValueError, CollectorTimeoutError, WorkerError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def cartpole():
    return gym.make("CartPole-v1")


def shm_entries() -> set[str]:
    """/dev/shm's entries but MPICH's (MPI jobs elsewhere on the machine make and remove those;
    the mpi tests check them)."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return {name for name in names if not name.startswith("mpich_shm_")}


def assert_gone(pids: list[int]) -> None:
    """Every worker pid has exited and been reaped."""
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not mp.active_children()


@pytest.fixture
def no_leaks():
    """The test leaves no child process and no new /dev/shm entry behind."""
    before = shm_entries()
    yield
    assert not mp.active_children()
    assert shm_entries() <= before, f"left in /dev/shm: {shm_entries() - before}"


def test_multisync_layout_stack_and_cat(no_leaks):
    collector = MultiSyncDataCollector(
        [cartpole, cartpole], None, frames_per_batch=100, total_frames=300
    )
    batches = list(collector)
    assert len(batches) == 3 and sum(b.numel() for b in batches) == 300
    for b in batches:
        assert b.batch_size == (2, 50) and b.names == [None, "time"]
        assert b["next", "reward"].shape == (2, 50, 1)
    ids = torch.cat([b["collector", "traj_ids"] for b in batches], 1)
    assert set(ids[0].tolist()).isdisjoint(ids[1].tolist())  # unique across workers
    pids = collector.worker_pids
    collector.shutdown()
    assert_gone(pids)
    cat = MultiSyncDataCollector(
        cartpole, None, num_workers=2, frames_per_batch=100, cat_results=-1, total_frames=100
    )
    (b,) = list(cat)
    assert b.batch_size == (100,) and b.names == ["time"]
    cat.shutdown()


def test_multiasync_and_async_layout(no_leaks):
    collector = MultiaSyncDataCollector([cartpole] * 2, None, frames_per_batch=40, total_frames=200)
    batches = list(collector)
    assert [b.batch_size for b in batches] == [torch.Size([40])] * 5
    assert all(b.names == ["time"] for b in batches)
    collector.shutdown()
    single = aSyncDataCollector(cartpole, None, frames_per_batch=30, total_frames=90)
    assert [b.numel() for b in single] == [30, 30, 30]
    single.shutdown()


def test_vector_env_workers_stack_to_three_dims(no_leaks):
    make = lambda: gym.vector.SyncVectorEnv([cartpole] * 3)  # noqa: E731
    collector = MultiSyncDataCollector([make, make], None, frames_per_batch=120, total_frames=120)
    (b,) = list(collector)
    assert b.batch_size == (2, 3, 20) and b.names == [None, None, "time"]
    assert collector.set_seed(0) == 5  # 2 workers x 3 envs: seeds 0..5
    collector.shutdown()


def test_same_seeds_give_the_same_data_as_sync_collectors(no_leaks):
    fns = [cartpole, lambda: gym.make("CartPole-v1", sutton_barto_reward=True)]
    multi = MultiSyncDataCollector(fns, None, frames_per_batch=60, total_frames=180)
    assert multi.set_seed(10) == 11
    got = list(multi)
    multi.shutdown()
    for worker, fn in enumerate(fns):
        sync = SyncDataCollector(fn, None, frames_per_batch=30, total_frames=90)
        sync.set_seed(10 + worker)
        for ours, ref in zip([b[worker] for b in got], sync, strict=True):
            ids = ours.pop(("collector", "traj_ids"))
            ref_ids = ref.pop(("collector", "traj_ids"))
            assert (ids == ref_ids * 2 + worker).all()  # worker i's ids: i, i + 2, ...
            assert (ours == ref).all()
        sync.shutdown()


def test_weight_update_reaches_named_workers_before_their_next_batch(no_leaks):
    torch.manual_seed(0)
    old, new = nn.Linear(4, 2), nn.Linear(4, 2)
    collector = MultiSyncDataCollector([cartpole] * 2, old, frames_per_batch=40)
    it = iter(collector)
    next(it)
    collector.update_policy_weights_(new, worker_ids=[1])
    for _ in range(3):
        b = next(it)
        with torch.no_grad():
            torch.testing.assert_close(b[0]["action"], old(b[0]["observation"]))
            torch.testing.assert_close(b[1]["action"], new(b[1]["observation"]))
    collector.update_policy_weights_(new.state_dict())  # all workers
    for _ in range(2):
        b = next(it)
        with torch.no_grad():
            torch.testing.assert_close(b["action"], new(b["observation"]))
    with pytest.raises(ArgumentValueError, match="worker_ids"):
        collector.update_policy_weights_(new, worker_ids=[5])
    collector.update_policy_weights_(new, worker_ids="cpu")  # by device
    collector.shutdown()


def test_update_policy_weights_without_argument_sends_the_trainer_policy(no_leaks):
    policy = nn.Linear(4, 2)
    collector = MultiaSyncDataCollector(
        [cartpole] * 2, policy, frames_per_batch=20, policy_device=["cpu", "cpu"]
    )
    it = iter(collector)
    next(it)
    with torch.no_grad():
        policy.weight.mul_(-1)
    collector.update_policy_weights_()
    seen = set()
    for _ in range(6):  # batches in flight during the update may predate it; later ones not
        b = next(it)
        with torch.no_grad():
            seen.add(bool(torch.allclose(b["action"], policy(b["observation"]))))
    assert True in seen
    collector.shutdown()


def test_replay_buffer_filled_by_workers_after_start(no_leaks):
    rb = ReplayBuffer(50_000)
    collector = MultiaSyncDataCollector([cartpole] * 2, None, frames_per_batch=50, replay_buffer=rb)
    collector.start()
    deadline = time.monotonic() + 60
    while len(rb) < 1000 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(rb) >= 1000 and rb.is_shared
    assert rb.sample(64)["observation"].shape == (64, 4)
    with pytest.raises(RuntimeError, match=r"filling its replay_buffer \(start\(\)\): call"):
        next(iter(collector))
    pids = collector.worker_pids
    collector.async_shutdown(timeout=30)
    written = rb.write_count
    time.sleep(0.3)
    assert rb.write_count == written  # nothing writes after async_shutdown
    assert_gone(pids)


def test_replay_buffer_with_iteration_yields_none(no_leaks):
    rb = ReplayBuffer(1000)
    collector = MultiSyncDataCollector(
        [cartpole] * 2, None, frames_per_batch=50, total_frames=150, replay_buffer=rb
    )
    assert list(collector) == [None, None, None] and len(rb) == 150
    collector.shutdown()


def test_state_dict_per_worker(no_leaks):
    collector = MultiSyncDataCollector(
        [cartpole] * 2, nn.Linear(4, 2), frames_per_batch=40, total_frames=120
    )
    it = iter(collector)
    next(it)
    state = collector.state_dict()
    assert set(state) == {"worker0", "worker1", "frames", "iter", "traj_pool"}
    assert state["frames"] == 40 and state["iter"] == 0  # TorchRL's: the last batch's index
    assert "policy_state_dict" in state["worker0"] and state["worker1"]["frames"] == 20
    assert "traj_pool" not in state["worker0"]  # one pool for the collector, as TorchRL's
    collector.load_state_dict(state)
    rest = list(it)
    assert len(rest) == 2
    saved = int(state["traj_pool"]["traj_id"])
    assert (rest[0]["collector", "traj_ids"] >= saved).all(), "no id saved before is reused"
    collector.shutdown()


def test_worker_exception_is_raised_with_index_host_and_traceback(no_leaks):
    fns = [lambda: CounterEnv(3), lambda: CounterEnv(3, fail_at=25)]
    collector = MultiSyncDataCollector(fns, None, frames_per_batch=20)
    pids = collector.worker_pids
    with pytest.raises(WorkerError, match="Worker 1 on .*CounterEnv failed on purpose") as info:
        list(collector)
    assert info.value.worker == 1 and "Traceback" in info.value.remote_traceback
    collector.shutdown()
    assert_gone(pids)


def test_worker_failing_at_start_raises_at_construction(no_leaks):
    with pytest.raises(WorkerError, match="Worker 0 .*NoSuchEnv"):
        MultiSyncDataCollector(["NoSuchEnv-v0"], None, frames_per_batch=10)


def test_killed_worker_is_detected_quickly(no_leaks):
    collector = MultiSyncDataCollector([cartpole] * 2, None, frames_per_batch=100)
    it = iter(collector)
    next(it)
    pids = collector.worker_pids
    os.kill(pids[0], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerError, match="Worker 0 .*killed by signal SIGKILL"):
        next(it)
    assert time.monotonic() - start < 10
    collector.shutdown()
    assert_gone(pids)


def test_shutdown_twice_early_stop_and_bounded(no_leaks):
    collector = MultiaSyncDataCollector([cartpole] * 2, None, frames_per_batch=200)
    for i, _ in enumerate(collector):
        if i == 1:
            break  # batches still in flight
    pids = collector.worker_pids
    start = time.monotonic()
    collector.shutdown()
    collector.shutdown()
    assert time.monotonic() - start < 15
    assert_gone(pids)
    with MultiSyncDataCollector([cartpole], None, frames_per_batch=10) as ctx:
        pids = ctx.worker_pids
        next(iter(ctx))
    assert_gone(pids)


def test_stuck_worker_times_out(no_leaks):
    class Sleepy(CounterEnv):
        def step(self, action):
            time.sleep(30)
            return super().step(action)

    collector = MultiSyncDataCollector([Sleepy], None, frames_per_batch=5, worker_timeout=2)
    with pytest.raises(CollectorTimeoutError, match="within 2 s"):
        next(iter(collector))
    collector.shutdown(timeout=1)


def test_worker_stuck_at_start_times_out_at_construction(no_leaks):
    def slow_env():
        time.sleep(60)
        return CounterEnv(3)

    start = time.monotonic()
    with pytest.raises(CollectorTimeoutError, match="no LAYOUT reply .* within 3 s"):
        MultiSyncDataCollector([slow_env], None, frames_per_batch=5, start_timeout=3)
    assert time.monotonic() - start < 30


def test_closures_fork_and_stripped_launcher_variables(no_leaks, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    length = 4

    def make():
        leaked = [k for k in os.environ if k.startswith(("SLURM_", "OMPI_"))]
        assert not leaked, f"launcher variables reached the worker: {leaked}"
        return CounterEnv(length)  # a closure over a local

    for method in ("spawn", "fork", "forkserver"):
        collector = MultiSyncDataCollector(
            [make],
            lambda observation: torch.tensor([1, 0]),
            frames_per_batch=8,
            total_frames=8,
            mp_start_method=method,
        )
        (b,) = list(collector)
        assert b["next", "observation"].max() == length
        collector.shutdown()
    assert os.environ["SLURM_JOB_ID"] == "123"  # the parent keeps its own


def test_forkserver_workers_fork_from_the_collectors_own_server_which_ends_with_it(no_leaks):
    """``mp_start_method="forkserver"``: the workers fork from a server this collector started
    (Python's own would outlive it). A scheduler signals every process of a job: the server
    ignores the stop signals, as the workers do (through it they would look dead, exit code
    255). A few seconds after ``shutdown()`` no process the collector started is there, the
    server included, not even unreaped."""
    before = started_here()
    collector = MultiSyncDataCollector(
        [cartpole, cartpole],
        None,
        frames_per_batch=20,
        total_frames=200,
        mp_start_method="forkserver",
    )
    (server,) = {parent(pid) for pid in collector.worker_pids}
    assert server != os.getpid() and server in started_here() - before
    frames = 0
    for i, batch in enumerate(collector):
        frames += batch.numel()
        if i == 1:
            for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
                os.kill(server, signum)
            time.sleep(0.2)
    assert frames == 200
    assert server in started_here()
    collector.shutdown()
    assert_none_started_left(before)


def test_mismatched_worker_layouts_are_refused(no_leaks):
    with pytest.raises(ArgumentValueError, match="worker 1's batches differ.*observation"):
        MultiSyncDataCollector([cartpole, lambda: CounterEnv(3)], None, frames_per_batch=10)


def test_bad_arguments_fail_before_any_process_starts(no_leaks):
    with pytest.raises(ArgumentValueError, match="num_workers"):
        MultiSyncDataCollector(cartpole, None, frames_per_batch=10)
    with pytest.raises(ArgumentValueError, match="num_workers=3 but create_env_fn lists 2"):
        MultiSyncDataCollector([cartpole] * 2, None, num_workers=3, frames_per_batch=10)
    with pytest.raises(ArgumentValueError, match="policy_device is a list of 3 values"):
        MultiSyncDataCollector([cartpole] * 2, None, frames_per_batch=10, policy_device=["cpu"] * 3)
    with pytest.raises(ArgumentValueError, match="mp_start_method"):
        MultiSyncDataCollector([cartpole], None, frames_per_batch=10, mp_start_method="thread")
    with pytest.raises(ArgumentValueError, match="cat_results"):
        MultiSyncDataCollector([cartpole], None, frames_per_batch=10, cat_results="join")
    with pytest.raises(ArgumentValueError, match="total_frames"):
        MultiSyncDataCollector([cartpole], None, frames_per_batch=10, total_frames=-5)


def test_ctrl_c_leaves_no_worker(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent("""
        import gymnasium as gym
        from hpccollect import MultiSyncDataCollector
        if __name__ == "__main__":
            with MultiSyncDataCollector([lambda: gym.make("CartPole-v1")] * 2, None,
                                        frames_per_batch=100) as c:
                print(*c.worker_pids, flush=True)
                for _ in c:
                    pass
    """)
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    finally:
        proc.kill()
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        running = [p for p in pids if alive(p)]
        if not running:
            break
        time.sleep(0.2)
    assert not running, f"workers still running after Ctrl-C: {running}"


def test_sync_collector_arguments_apply_in_workers(no_leaks):
    seen = []

    def postproc(td):
        seen.append(td.batch_size)
        return td

    policy = CountingPolicy()
    collector = MultiSyncDataCollector(
        [lambda length: CounterEnv(length)] * 2,
        policy,
        frames_per_batch=40,
        total_frames=120,
        create_env_kwargs=[{"length": 100}, {"length": 3}],
        max_frames_per_traj=5,
        split_trajs=True,
        postproc=postproc,
        init_random_frames=40,
        update_at_each_batch=True,
    )
    batches = list(collector)
    assert len(seen) == 3
    for b in batches:
        mask = b["collector", "mask"]
        assert mask.sum() == 40  # split_trajs in the parent: padded trajectories, 40 real steps
        assert (b["next", "step_count"][mask] <= 5).all()
        assert (b["next", "observation"][mask] <= 100).all()
    first_actions = batches[0]["action"][batches[0]["collector", "mask"]].argmax(-1)
    last_actions = batches[-1]["action"][batches[-1]["collector", "mask"]].argmax(-1)
    assert (last_actions == 1).all() and not (first_actions == 1).all()  # random, then policy
    collector.shutdown()


class CountingPolicy(nn.Module):
    def forward(self, observation):
        return torch.nn.functional.one_hot(torch.tensor(1), 2)


def test_shared_replay_buffer_removes_its_lock_file(tmp_path):
    import gc

    rb = ReplayBuffer(10).share_memory_()
    path = rb._lock.path
    assert os.path.exists(path)
    del rb
    gc.collect()
    assert not os.path.exists(path)


@pytest.mark.parametrize("cls", [MultiSyncDataCollector, MultiaSyncDataCollector])
def test_cpu_policy_weights_are_shared_live_with_the_workers(cls, no_leaks):
    """As with TorchRL's CPU workers: a change made in place to the policy is seen by the
    workers without update_policy_weights_(), and an update with other weights lands in the
    policy too (it is the one copy of the weights)."""
    policy = nn.Linear(4, 2)
    collector = cls([cartpole] * 2, policy, frames_per_batch=20, total_frames=-1)
    try:
        with torch.no_grad():
            policy.weight.add_(1.0)
        for i in range(2):
            seen = collector.state_dict()[f"worker{i}"]["policy_state_dict"]
            assert torch.equal(seen["weight"], policy.weight)
        new = {k: torch.full_like(v, 0.5) for k, v in policy.state_dict().items()}
        collector.update_policy_weights_(TensorDict(new, []))
        assert (policy.weight == 0.5).all()
        assert collector.get_distant_attr("policy.module.weight")[1].eq(0.5).all()
    finally:
        collector.shutdown()


def test_frames_per_batch_per_worker(no_leaks):
    """TorchRL's list form: MultiSync's worker i collects its own share (the round is a lazy
    stack when the shares differ); MultiaSync's workers each collect the sum."""
    c = MultiSyncDataCollector(
        [cartpole] * 2, None, frames_per_batch=[15, 5], total_frames=40, cat_results="stack"
    )
    try:
        batches = list(c)
    finally:
        c.shutdown()
    assert len(batches) == 2
    for batch in batches:
        assert [part.shape for part in batch.unbind(0)] == [(15,), (5,)]
        assert batch.names[-1] == "time" and batch[1]["observation"].shape == (5, 4)
    assert not torch.equal(batches[0][0]["observation"], batches[1][0]["observation"])
    c = MultiaSyncDataCollector([cartpole] * 2, None, frames_per_batch=[15, 5], total_frames=40)
    try:
        assert [b.numel() for b in c] == [20, 20]
    finally:
        c.shutdown()
    with pytest.raises(ArgumentValueError, match="exactly one value per worker"):
        MultiSyncDataCollector([cartpole] * 2, None, frames_per_batch=[15, 5, 1])


def test_weights_per_worker(no_leaks):
    """TorchRL's ``{worker_index: weights}``: each named worker gets its own."""
    c = MultiSyncDataCollector(
        [cartpole] * 2, policy_factory=lambda: nn.Linear(4, 2), frames_per_batch=20
    )
    try:
        ones = TensorDict({"weight": torch.ones(2, 4), "bias": torch.ones(2)}, [])
        c.update_policy_weights_({1: ones})
        state = c.state_dict()
        assert torch.equal(state["worker1"]["policy_state_dict"]["weight"], torch.ones(2, 4))
        assert not torch.equal(state["worker0"]["policy_state_dict"]["weight"], torch.ones(2, 4))
        with pytest.raises(TypeError, match="leave worker_ids out"):
            c.update_policy_weights_({1: ones}, worker_ids=[1])
    finally:
        c.shutdown()
    shared = MultiSyncDataCollector([cartpole] * 2, nn.Linear(4, 2), frames_per_batch=20)
    try:
        with pytest.raises(ArgumentValueError, match="one copy for all of them"):
            shared.update_policy_weights_({0: ones})
        with pytest.raises(ArgumentValueError, match=r"shapes bias: \(3,\) for \(2,\)"):
            shared.update_policy_weights_(nn.Linear(4, 3))  # another architecture
    finally:
        shared.shutdown()
    with pytest.raises(RuntimeError, match="was shut down: its workers are gone"):
        shared.update_policy_weights_()  # not the report of a worker that failed


class _RecordingFactory:
    """A policy factory that notes the pid of each process it runs in."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self) -> nn.Module:
        open(os.path.join(self.folder, str(os.getpid())), "a").close()
        return nn.Linear(4, 2)


@pytest.mark.parametrize("cls", [MultiSyncDataCollector, MultiaSyncDataCollector])
def test_policy_factory_runs_only_in_the_workers(cls, tmp_path, no_leaks):
    c = cls(
        [cartpole] * 2,
        policy_factory=_RecordingFactory(str(tmp_path)),
        frames_per_batch=20,
        total_frames=40,
    )
    try:
        pids = set(c.worker_pids)
        ones = TensorDict({"weight": torch.ones(2, 4), "bias": torch.ones(2)}, [])
        c.update_policy_weights_(ones)  # weights still reach the workers' own policies
        for i in range(2):
            assert torch.equal(
                c.state_dict()[f"worker{i}"]["policy_state_dict"]["bias"], torch.ones(2)
            )
        assert sum(b.numel() for b in c) == 40
    finally:
        c.shutdown()
    assert {int(name) for name in os.listdir(tmp_path)} == pids
