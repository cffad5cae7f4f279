"""ReplayBuffer: circular storage, sampling, thread safety."""

from __future__ import annotations

import threading

import pytest
import torch
from tensordict import TensorDict

from hpccollect import ReplayBuffer
from hpccollect.errors import ArgumentTypeError, ArgumentValueError


def batch(start, n, envs=None):
    shape = [n] if envs is None else [envs, n]
    x = torch.arange(start, start + torch.Size(shape).numel()).reshape(shape).float()
    return TensorDict({"x": x, ("next", "y"): x.unsqueeze(-1) * 2}, shape)


def test_extend_flattens_and_wraps_around():
    rb = ReplayBuffer(10)
    rb.extend(batch(0, 6))
    assert len(rb) == 6 and rb.write_count == 6
    rb.extend(batch(6, 3, envs=2))  # [2, 3] -> 6 transitions
    assert len(rb) == 10 and rb.write_count == 12
    assert sorted(rb[:]["x"].tolist()) == list(range(2, 12))
    torch.testing.assert_close(rb[:]["next", "y"].squeeze(-1), rb[:]["x"] * 2)


def test_sample_and_errors():
    rb = ReplayBuffer(5, batch_size=4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ArgumentValueError, match="empty"):
        rb.sample()
    rb.extend(batch(0, 3))
    s = rb.sample()
    assert s.batch_size == (4,) and set(s["x"].tolist()) <= {0.0, 1.0, 2.0}
    assert rb.sample(2).batch_size == (2,)
    with pytest.raises(ArgumentValueError, match="batch_size"):
        ReplayBuffer(5).sample()
    with pytest.raises(ArgumentTypeError, match="TensorDict"):
        rb.extend({"x": 1})
    with pytest.raises(ArgumentValueError, match="capacity must be >= 1"):
        ReplayBuffer(0)
    with pytest.raises(ArgumentValueError, match="keys or shapes"):
        rb.extend(TensorDict({"z": torch.zeros(2)}, [2]))


def test_add_and_empty():
    rb = ReplayBuffer(3)
    rb.add(batch(0, 1)[0])
    assert len(rb) == 1
    rb.empty()
    assert len(rb) == 0


@pytest.mark.timeout(60)
def test_concurrent_extend_and_sample_stay_consistent():
    rb = ReplayBuffer(1000)
    rb.extend(batch(0, 10))
    stop = threading.Event()
    errors = []

    def writer():
        i = 10
        while not stop.is_set():
            rb.extend(batch(i, 50))
            i += 50

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(300):
            s = rb.sample(64)
            if not torch.equal(s["next", "y"].squeeze(-1), s["x"] * 2):
                errors.append("torn transition")
    finally:
        stop.set()
        thread.join(10)
    assert not errors and not thread.is_alive()
