"""split_trajectories and TrajIdPool."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from hpccollect.collectors.loops.trajectories import TrajIdPool, split_trajectories
from hpccollect.errors import ArgumentValueError


def test_split_two_env_rows():
    ids = torch.tensor([[0, 0, 2, 2, 2], [1, 1, 1, 3, 3]])
    td = TensorDict({"x": torch.arange(10.0).reshape(2, 5), ("collector", "traj_ids"): ids}, [2, 5])
    out = split_trajectories(td)
    assert out.batch_size == (4, 3) and out.names == [None, None]  # TorchRL's names
    assert out["collector", "traj_ids"][:, 0].tolist() == [0, 2, 1, 3]
    assert out["collector", "mask"].sum(-1).tolist() == [2, 3, 3, 2]
    assert out["x"].tolist() == [[0, 1, 0], [2, 3, 4], [5, 6, 7], [8, 9, 0]]


def test_split_one_env_and_whole_rows_keep_time_name():
    one = TensorDict(
        {"x": torch.arange(5.0), ("collector", "traj_ids"): torch.tensor([3] * 5)}, [5]
    )
    one.names = ["time"]
    out = split_trajectories(one)
    assert out.batch_size == (1, 5) and out.names == [None, "time"]
    rows = TensorDict({("collector", "traj_ids"): torch.tensor([[0] * 4, [1] * 4])}, [2, 4])
    rows.names = [None, "time"]
    out = split_trajectories(rows)  # every trajectory spans the batch: kept as is, as TorchRL
    assert out.batch_size == (2, 4) and out.names == [None, "time"]
    assert out["collector", "mask"].all()


def test_split_leaves_out_preempted_padding():
    ids = torch.tensor([[0, 0, 0, 2], [1, 1, -1, -1]])
    td = TensorDict({"x": torch.arange(8.0).reshape(2, 4), ("collector", "traj_ids"): ids}, [2, 4])
    out = split_trajectories(td)
    assert out["collector", "traj_ids"][:, 0].tolist() == [0, 2, 1]
    assert out["collector", "mask"].sum().item() == 6


def test_split_needs_traj_ids():
    with pytest.raises(ArgumentValueError, match="traj_ids"):
        split_trajectories(TensorDict({"x": torch.zeros(3)}, [3]))


def test_pool_offsets_never_collide():
    pools = [TrajIdPool(i, 3) for i in range(3)]
    ids = [pool.take(4).tolist() for pool in pools]
    flat = sum(ids, [])
    assert len(set(flat)) == 12 and ids[1] == [1, 4, 7, 10]
    state = pools[0].state_dict()
    fresh = TrajIdPool()
    fresh.load_state_dict(state)
    assert fresh.take(1).tolist() == [12]
    with pytest.raises(ArgumentValueError):
        TrajIdPool(3, 3)


def test_split_takes_torchrl_keys_and_ids_from_done_flags() -> None:
    """TorchRL's trajectory_key (the mask goes beside it) and done_key (ids from the done
    flags when the batch has none)."""
    done = torch.tensor([False, False, True, False, True, False])
    td = TensorDict(
        {
            "x": torch.arange(6),
            "meta": {"ids": torch.tensor([4, 4, 4, 7, 7, 9])},
            "next": {"done": done.unsqueeze(-1)},
        },
        [6],
    )
    by_key = split_trajectories(td, trajectory_key=("meta", "ids"))
    assert by_key["x"].tolist() == [[0, 1, 2], [3, 4, 0], [5, 0, 0]]
    assert by_key["meta", "mask"].sum(-1).tolist() == [3, 2, 1]
    by_done = split_trajectories(td.exclude("meta"), done_key=("next", "done"))
    assert by_done["x"].tolist() == by_key["x"].tolist()
    assert by_done["traj_ids"][:, 0].tolist() == [0, 1, 2]
    with pytest.raises(ArgumentValueError, match="as_nested"):
        split_trajectories(td, as_nested=True)
