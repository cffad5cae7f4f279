"""FlatLayout: a TensorDict laid over one flat byte buffer, and a batch's copy of its own;
Spares: the buffers large batches landed in, received into again once no one holds them."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from tensordict import TensorDict

from hpccollect.transport.batches import HEADER, FlatLayout, Spares


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


@pytest.mark.parametrize("copy", [True, False])
def test_an_owned_batch_is_the_batch_with_no_storage_seen_as_two_dtypes_so_torch_saves_it(copy):
    """``own``: what the collector yields. ``copy=False`` leaves the dtype with the most bytes
    (here the uint8 pixels) in the buffer, which no one writes again; every other leaf is
    copied out into a storage of its own, so ``torch.save`` takes the batch."""
    td = _batch()
    layout = FlatLayout.of(td)
    flat, views = layout.allocate()
    views.update_(td)
    mine = layout.own(layout.leaf_views(flat), copy=copy)
    assert (mine == td).all() and mine.names == [None, "time"]
    storages: dict[int, set] = {}
    for key in td.keys(True, True):
        leaf = mine.get(key)
        storages.setdefault(leaf.untyped_storage().data_ptr(), set()).add(leaf.dtype)
    assert all(len(dtypes) == 1 for dtypes in storages.values())
    assert len(storages) == 7  # one per leaf, as TensorDict.clone gives
    in_flat = mine["pixels"].untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
    assert in_flat is not copy
    assert mine["observation"].untyped_storage().data_ptr() != flat.data_ptr()
    saved = io.BytesIO()
    torch.save(mine, saved)
    saved.seek(0)
    assert (torch.load(saved, weights_only=False) == td).all()
    if copy:
        flat.fill_(7)  # the next batch arrives in the buffer
        assert (mine == td).all()


def test_a_layout_travels_without_its_recipe_and_builds_the_same_views():
    td = _batch()
    layout = FlatLayout.of(td)
    flat, views = layout.allocate()  # made the recipe on this side
    views.update_(td)
    blob = pickle.dumps(layout)
    assert b"_made" not in blob
    other = pickle.loads(blob)
    assert other == layout
    assert (other.views(flat) == td).all()


def test_a_landed_buffer_is_received_into_again_only_once_no_view_of_it_is_left():
    layout = FlatLayout.of(_batch())
    # what a channel keeps of each buffer (its header view, its wire array, each leaf's view,
    # which batches are made from) is no holder
    spares = Spares(
        lambda buffer: (
            buffer[:40].view(torch.int64),
            buffer.numpy(),
            layout.leaf_views(buffer),
        ),
        keep=2,
    )
    first = spares.slot(torch.empty(layout.nbytes, dtype=torch.uint8))
    assert len(first.made) == 3
    # as a channel calls it: each slot handed out lands a batch, then the next is asked for
    second = spares.next_after(first)  # nothing to reuse yet: a new one
    assert second.buffer.data_ptr() != first.buffer.data_ptr()
    assert second.buffer.shape == first.buffer.shape and len(second.made) == 3
    kept = layout.own(first.made[2], copy=False)  # a batch yielded in ``first``, kept
    third = spares.next_after(second)
    assert third.buffer.data_ptr() not in (first.buffer.data_ptr(), second.buffer.data_ptr())
    del kept  # dropped: ``first`` is free again; ``second`` just took a batch
    fourth = spares.next_after(third)
    assert fourth is first
    views = layout.alias(second.made[2])  # a batch over ``second`` is still held ...
    array = second.buffer.numpy()  # ... and an array made elsewhere
    fifth = spares.next_after(fourth)
    assert fifth is not second
    del views
    sixth = spares.next_after(fifth)
    assert sixth is not second
    del array
    assert spares.next_after(sixth) is second
    other = spares.slot(torch.empty(layout.nbytes + 64, dtype=torch.uint8))  # never mixed
    assert spares.next_after(other).buffer.shape == other.buffer.shape


def test_one_leaf_kept_of_a_batch_holds_the_buffer_it_came_in():
    layout = FlatLayout.of(_batch())
    spares = Spares(lambda buffer: (layout.leaf_views(buffer),), keep=4)
    first = spares.slot(torch.empty(layout.nbytes, dtype=torch.uint8))
    second = spares.next_after(first)
    pixels = layout.own(first.made[0], copy=False)["pixels"]  # the batch dropped, not its leaf
    third = spares.next_after(second)
    assert third is not first
    del pixels
    assert spares.next_after(third) is first


def test_a_buffer_whose_memory_moved_to_shared_memory_is_never_received_into_again():
    """A taker that shares a batch (``share_memory_()``, a queue to another process) moves
    the buffer's memory: the slot's header view and wire array point to the old memory, and
    another process may read the new one."""
    layout = FlatLayout.of(_batch())
    spares = Spares(lambda buffer: (buffer.numpy(),), keep=4)
    first = spares.slot(torch.empty(layout.nbytes, dtype=torch.uint8))
    second = spares.next_after(first)
    batch = layout.own(layout.leaf_views(first.buffer), copy=False)
    batch.share_memory_()
    assert first.buffer.is_shared()
    del batch
    third = spares.next_after(second)
    assert third is not first
    assert spares.next_after(third) is second  # the others still go round
