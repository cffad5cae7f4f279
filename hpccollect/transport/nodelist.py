"""SLURM's compressed host lists (``SLURM_JOB_NODELIST``): ``node[01-02,07],gpu3``."""

from __future__ import annotations

import re
from collections.abc import Iterator

from hpccollect.errors import ArgumentValueError

__all__ = ["expand_nodelist"]


def expand_nodelist(nodelist: str, name: str = "SLURM_JOB_NODELIST") -> Iterator[str]:
    """The host names of SLURM's compressed form, in order: ``"node[01-02,07],gpu3"`` gives
    node01, node02, node07, gpu3. ``name``: the variable it came from, for the error."""
    for item in _top_level_split(nodelist, name):
        yield from _expand_item(item, nodelist, name)


def _top_level_split(nodelist: str, name: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ArgumentValueError(f"{name}={nodelist!r}: brackets do not match")
        if char == "," and depth == 0:
            items.append(nodelist[start:i])
            start = i + 1
    items.append(nodelist[start:])
    if depth or not all(item.strip() for item in items):
        raise ArgumentValueError(f"{name}={nodelist!r} is not a SLURM host list")
    return [item.strip() for item in items]


_GROUP = re.compile(r"\[([^\[\]]*)\]")


def _expand_item(item: str, nodelist: str, name: str) -> Iterator[str]:
    """``node[01-02]-ib[1,3]`` gives node01-ib1, node01-ib3, node02-ib1, node02-ib3."""
    match = _GROUP.search(item)
    if match is None:
        if "[" in item or "]" in item:
            raise ArgumentValueError(f"{name}={nodelist!r}: brackets do not match")
        yield item
        return
    head, tail = item[: match.start()], item[match.end() :]
    for part in match.group(1).split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise ArgumentValueError(
                f"{name}={nodelist!r}: {part!r} is not a number or a range like 01-04"
            )
        for number in range(int(lo), int(hi or lo) + 1):
            for rest in _expand_item(tail, nodelist, name):
                yield f"{head}{number:0{len(lo)}d}{rest}"
