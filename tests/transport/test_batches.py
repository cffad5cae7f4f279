"""FlatLayout: a TensorDict laid over one flat byte buffer, and a batch's copy of its own."""

from __future__ import annotations

import pickle

import torch
from tensordict import TensorDict

from hpccollect.transport.batches import HEADER, FlatLayout


def _batch() -> TensorDict:
    td = TensorDict(
        {
            "observation": torch.randn(5, 3, 4),
            "action": torch.randint(0, 9, (5, 3)),
            "next": {"reward": torch.randn(5, 3, 1), "done": torch.rand(5, 3, 1) > 0.5},
            "pixels": torch.randint(0, 255, (5, 3, 2, 7, 7), dtype=torch.uint8),
            "half": torch.randn(5, 3, 3).to(torch.float16),
            "scalar": torch.arange(15, dtype=torch.float64).reshape(5, 3),
        },
        batch_size=[5, 3],
    )
    td.names = [None, "time"]
    return td


def test_views_lie_in_the_flat_buffer_with_every_key_shape_dtype_and_name():
    td = _batch()
    layout = FlatLayout.of(td)
    flat, views = layout.allocate()
    views.update_(td)
    assert (views == td).all()
    assert views.batch_size == td.batch_size and views.names == [None, "time"]
    assert views["next"].batch_size == td.batch_size and views["next"].names == [None, "time"]
    for key in td.keys(True, True):
        assert views.get(key).dtype == td.get(key).dtype
        assert views.get(key).is_contiguous()
        ptr = views.get(key).data_ptr()
        assert flat.data_ptr() + HEADER <= ptr < flat.data_ptr() + layout.nbytes
    flat[HEADER:].zero_()  # the views see the buffer's bytes
    assert not views["observation"].any()


def test_copy_is_the_batch_as_it_was_and_its_own():
    td = _batch()
    layout = FlatLayout.of(td)
    flat, views = layout.allocate()
    views.update_(td)
    mine = layout.copy(flat)
    flat.fill_(7)  # the next batch arrives in the buffer
    assert (mine == td).all() and mine.names == [None, "time"]
    assert mine["pixels"].data_ptr() != views["pixels"].data_ptr()


def test_a_layout_travels_without_its_recipe_and_builds_the_same_views():
    td = _batch()
    layout = FlatLayout.of(td)
    flat, views = layout.allocate()  # made the recipe on this side
    views.update_(td)
    blob = pickle.dumps(layout)
    assert b"_recipe" not in blob
    other = pickle.loads(blob)
    assert other == layout
    assert (other.views(flat) == td).all()
