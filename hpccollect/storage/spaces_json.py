"""gymnasium spaces to and from JSON, in the format Minari uses for its dataset metadata."""

from __future__ import annotations

import functools
import json
from typing import Any

import gymnasium as gym
import numpy as np

from hpccollect.errors import ArgumentValueError

__all__ = ["space_from_json", "space_to_json"]


@functools.singledispatch
def _encode(space: gym.Space) -> dict:
    raise ArgumentValueError(f"cannot describe space {space!r} in JSON")


@_encode.register
def _(space: gym.spaces.Box) -> dict:
    return {
        "type": "Box",
        "dtype": str(space.dtype),
        "shape": list(space.shape),
        "low": space.low.tolist(),
        "high": space.high.tolist(),
    }


@_encode.register
def _(space: gym.spaces.Discrete) -> dict:
    return {"type": "Discrete", "dtype": "int64", "start": int(space.start), "n": int(space.n)}


@_encode.register
def _(space: gym.spaces.MultiDiscrete) -> dict:
    return {
        "type": "MultiDiscrete",
        "dtype": str(space.dtype),
        "nvec": space.nvec.tolist(),
        "start": space.start.tolist(),
    }


@_encode.register
def _(space: gym.spaces.MultiBinary) -> dict:
    n = space.n
    return {"type": "MultiBinary", "n": n.tolist() if isinstance(n, np.ndarray) else n}


@_encode.register
def _(space: gym.spaces.Dict) -> dict:
    return {"type": "Dict", "subspaces": {k: _encode(v) for k, v in space.spaces.items()}}


@_encode.register
def _(space: gym.spaces.Tuple) -> dict:
    return {"type": "Tuple", "subspaces": [_encode(s) for s in space.spaces]}


def space_to_json(space: gym.Space) -> str:
    """The JSON string describing ``space``."""
    return json.dumps(_encode(space))


def _decode(d: dict) -> gym.Space:
    kind = d["type"]
    if kind == "Box":
        return gym.spaces.Box(
            np.array(d["low"], dtype=d["dtype"]),
            np.array(d["high"], dtype=d["dtype"]),
            tuple(d["shape"]),
            dtype=d["dtype"],
        )
    if kind == "Discrete":
        return gym.spaces.Discrete(d["n"], start=d.get("start", 0))
    if kind == "MultiDiscrete":
        return gym.spaces.MultiDiscrete(d["nvec"], dtype=d["dtype"], start=d.get("start"))
    if kind == "MultiBinary":
        return gym.spaces.MultiBinary(d["n"])
    if kind == "Dict":
        return gym.spaces.Dict({k: _decode(v) for k, v in d["subspaces"].items()})
    if kind == "Tuple":
        return gym.spaces.Tuple([_decode(v) for v in d["subspaces"]])
    raise ArgumentValueError(f"unknown space type {kind!r} in dataset metadata")


def space_from_json(text: str | dict) -> gym.Space:
    """The space a ``space_to_json`` string describes."""
    return _decode(json.loads(text) if isinstance(text, str) else text)


def describe(value: Any) -> str:
    """A JSON string for metadata attributes (collector configuration and the like)."""
    return json.dumps(value, default=str, sort_keys=True)
