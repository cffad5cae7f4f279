"""``hpccollect/_compat.py``: what the package takes of other packages beyond their public API,
each checked on the installed versions by what it must do, so that a release that changes one
fails here first (and not as a slow or wrong collection)."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import threading

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torch import nn

from hpccollect._compat import (
    can_reset_one_sub_env,
    foreach_copy_,
    has_hooks,
    lay_out_on_first_write,
    new_unchecked,
    reset_one_sub_env,
    stop_fd_passing,
    storage_holds,
)


def test_an_unchecked_tensordict_is_the_checked_one():
    leaves = {"a": torch.arange(6.0).reshape(3, 2), "b": torch.zeros(3, dtype=torch.bool)}
    fast = new_unchecked(dict(leaves), batch_size=torch.Size([3]), device=None, names=["time"])
    slow = TensorDict(dict(leaves), batch_size=[3], names=["time"])
    assert type(fast) is TensorDict and fast.batch_size == slow.batch_size
    assert fast.names == ["time"] and (fast == slow).all()
    assert fast["a"] is leaves["a"]  # no copy


def test_a_fused_copy_copies_every_leaf():
    dst = [torch.zeros(3), torch.zeros(2, 2, dtype=torch.int64)]
    src = [torch.arange(3.0), torch.ones(2, 2, dtype=torch.int64)]
    foreach_copy_(dst, src)
    assert all(torch.equal(d, s) for d, s in zip(dst, src, strict=True))


def test_the_holds_on_a_tensors_memory_are_counted():
    buffer = torch.zeros(16, dtype=torch.uint8)
    alone = storage_holds(buffer)
    assert alone is not None, "this torch cannot count holds: batch buffers are never reused"
    view = buffer[4:]
    array = buffer.numpy()
    assert storage_holds(buffer) == alone + 2
    del view, array
    assert storage_holds(buffer) == alone


def test_a_modules_hooks_are_seen():
    module = nn.Linear(2, 2)
    assert not has_hooks(module)
    handle = module.register_forward_hook(lambda *_: None)
    assert has_hooks(module)
    handle.remove()
    module.register_forward_pre_hook(lambda *_: None)
    assert has_hooks(module)


def test_one_sub_env_reset_alone_is_the_masked_reset():
    """A ``SyncVectorEnv`` whose sub-env 0 finished: resetting it alone and recording it gives
    the next step that ``reset(options={"reset_mask": ...})`` gives, the other sub-env
    untouched."""

    def make() -> gym.vector.SyncVectorEnv:
        venv = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)
        venv.reset(seed=[1, 2])
        return venv

    alone, masked = make(), make()
    assert can_reset_one_sub_env(alone)
    actions = np.array([1, 0])
    for venv in (alone, masked):
        done = np.zeros(2, dtype=bool)
        while not done[0]:
            _, _, terminated, truncated, _ = venv.step(actions)
            done = terminated | truncated
    obs, _ = alone.envs[0].reset(seed=7)
    reset_one_sub_env(alone, 0, obs)
    masked.reset(seed=[7, None], options={"reset_mask": np.array([True, False])})
    first, *_ = alone.step(actions)
    second, *_ = masked.step(actions)
    # sub-env 0 stepped from its reset (not reset again by the step), sub-env 1 as it was
    assert np.allclose(first, second), (first, second)
    alone.close()
    masked.close()


def test_the_fd_passing_thread_stops_and_starts_again():
    """Sending a shared tensor down a pipe starts the thread that passes its descriptor;
    ``stop_fd_passing`` ends it, and the next send starts it again."""
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    before = threading.active_count()
    try:
        for _ in range(2):
            here.send(torch.zeros(4).share_memory_())
            assert threading.active_count() == before + 1
            there.recv()
            stop_fd_passing()
            assert threading.active_count() == before
    finally:
        here.close()
        there.close()


def test_a_torchrl_storage_is_laid_out_by_its_first_writer():
    if os.environ.get("HPCCOLLECT_REQUIRE_TORCHRL") != "1":
        pytest.importorskip("torchrl")
    from torchrl.data import LazyTensorStorage

    storage = LazyTensorStorage(8)
    assert lay_out_on_first_write(storage)
    assert storage.shared_init and os.path.isdir(storage.scratch_dir)
    shutil.rmtree(storage.scratch_dir, ignore_errors=True)
