"""gymnasium spaces -> specs, and the per-leaf encode/decode between numpy and stored tensors.

Each supported space type registers one converter (``functools.singledispatch``), so adding a
space is one function. Observations are encoded on the way in (a ``Discrete`` observation becomes
one-hot, as in TorchRL); actions are decoded on the way out (one-hot -> index + ``start``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from hpccollect.envs.specs import (
    Binary,
    Bounded,
    Categorical,
    MultiCategorical,
    MultiOneHot,
    OneHot,
    TensorSpec,
    torch_dtype,
)
from hpccollect.errors import ArgumentValueError

__all__ = [
    "LeafCodec",
    "action_codec",
    "is_image",
    "observation_codecs",
    "single_observation_key",
]

Key = tuple[str, ...]


@dataclass(frozen=True)
class LeafCodec:
    """How one gymnasium leaf space is stored: its spec, and numpy converters both ways.

    ``encode`` maps what the env returns to what is stored (None: store as is); ``decode`` maps a
    stored value (numpy, possibly batched) back to what ``env.step`` accepts.
    """

    spec: TensorSpec
    np_dtype: np.dtype
    encode: Callable[[Any], np.ndarray] | None
    decode: Callable[[np.ndarray], Any]


@functools.singledispatch
def leaf_codec(space: gym.Space, categorical: bool) -> LeafCodec:
    raise ArgumentValueError(
        f"gymnasium space {space!r} is not supported. Supported: Box, Discrete, MultiDiscrete, "
        "MultiBinary and Dict of those; flatten others with gymnasium.wrappers.FlattenObservation."
    )


@leaf_codec.register
def _(space: gym.spaces.Box, categorical: bool) -> LeafCodec:
    dtype = np.dtype(space.dtype)
    spec = Bounded(space.low, space.high, space.shape, torch_dtype(dtype))
    return LeafCodec(spec, dtype, None, lambda a: np.asarray(a, dtype=dtype))


@leaf_codec.register
def _(space: gym.spaces.Discrete, categorical: bool) -> LeafCodec:
    n, start = int(space.n), int(space.start)
    if categorical:
        return LeafCodec(
            Categorical(n), np.dtype(np.int64), lambda v: np.asarray(v) - start, lambda a: a + start
        )
    eye = np.eye(n, dtype=np.int64)
    return LeafCodec(
        OneHot(n),
        np.dtype(np.int64),
        lambda v: eye[np.asarray(v) - start],
        lambda a: np.argmax(a, -1) + start,
    )


@leaf_codec.register
def _(space: gym.spaces.MultiDiscrete, categorical: bool) -> LeafCodec:
    if space.nvec.ndim != 1:
        raise ArgumentValueError(
            f"MultiDiscrete spaces must be 1-D, got nvec of shape {space.nvec.shape}; "
            "flatten it with gymnasium.wrappers.FlattenObservation."
        )
    nvec = [int(n) for n in space.nvec]
    start = np.asarray(space.start, dtype=np.int64)
    if categorical:
        return LeafCodec(
            MultiCategorical(nvec),
            np.dtype(np.int64),
            lambda v: np.asarray(v) - start,
            lambda a: a + start,
        )
    offsets = np.cumsum([0, *nvec])[:-1]
    eyes = [np.eye(n, dtype=np.int64) for n in nvec]

    def encode(v: Any) -> np.ndarray:
        v = np.asarray(v) - start
        return np.concatenate([eye[v[..., i]] for i, eye in enumerate(eyes)], -1)

    def decode(a: np.ndarray) -> np.ndarray:
        parts = [np.argmax(a[..., o : o + n], -1) for o, n in zip(offsets, nvec, strict=True)]
        return np.stack(parts, -1) + start

    return LeafCodec(MultiOneHot(nvec), np.dtype(np.int64), encode, decode)


@leaf_codec.register
def _(space: gym.spaces.MultiBinary, categorical: bool) -> LeafCodec:
    dtype = np.dtype(space.dtype)
    spec = Binary(int(np.prod(space.shape)), tuple(space.shape), torch_dtype(dtype))
    return LeafCodec(spec, dtype, None, lambda a: np.asarray(a, dtype=dtype))


def is_image(space: gym.Space) -> bool:
    """TorchRL's gym wrapper's test for an image observation: a ``Box`` of shape ``(H, W, 3)``
    whose every low bound is 0 and every high bound 255 (of any dtype)."""
    return (
        isinstance(space, gym.spaces.Box)
        and len(space.shape) == 3
        and space.shape[-1] == 3
        and bool(np.all(space.low == 0))
        and bool(np.all(space.high == 255))
    )


def single_observation_key(space: gym.Space) -> Key:
    """The key of a non-Dict observation: ``pixels`` for an image (as TorchRL names it), else
    ``observation``."""
    return ("pixels",) if is_image(space) else ("observation",)


def observation_codecs(space: gym.Space, categorical: bool = False) -> dict[Key, LeafCodec]:
    """Leaf codecs of an observation space: a Dict gives one key per entry at the root (nested
    Dicts give nested keys), any other space the single key ``single_observation_key`` names
    (``pixels`` for an image, ``observation`` otherwise)."""
    if not isinstance(space, gym.spaces.Dict):
        return {single_observation_key(space): leaf_codec(space, categorical)}
    out: dict[Key, LeafCodec] = {}
    for name, sub in space.spaces.items():
        if isinstance(sub, gym.spaces.Dict):
            for key, codec in observation_codecs(sub, categorical).items():
                out[(name, *key)] = codec
        else:
            out[(name,)] = leaf_codec(sub, categorical)
    return out


def action_codec(space: gym.Space, categorical: bool = False) -> LeafCodec:
    """The codec of the action space (stored under the key ``action``)."""
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        raise ArgumentValueError(
            f"action space {space!r} is a {type(space).__name__}; hpccollect supports Box, "
            "Discrete, MultiDiscrete and MultiBinary actions. Wrap the env in a "
            "gymnasium.ActionWrapper that maps a flat Box or MultiDiscrete action to it."
        )
    return leaf_codec(space, categorical)
