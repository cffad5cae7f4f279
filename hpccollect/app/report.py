"""What ``python -m hpccollect inspect`` says about a dataset file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from hpccollect.errors import ArgumentValueError

__all__ = ["description", "unfinished_hint"]


def description(ds: Any, file: str) -> list[str]:
    """What ``inspect`` prints above the integrity line (``ds``: a dataset reader, as
    ``storage.read_dataset`` opens it)."""
    return _provenance(ds, file) + _contents(ds)


def _provenance(ds: Any, file: str) -> list[str]:
    """Where the data comes from: file state, env, seed, collector, merged shards."""
    lines: list[str] = []
    meta = ds.metadata
    state = (
        "complete"
        if ds.complete
        else "unfinished: still being written, or its run was killed; if that run is over, "
        f"make it readable with: python -m hpccollect repair {file}"
    )
    lines.append(f"file              {ds.path} ({state})")
    lines.append(
        f"env               {meta.get('env_id', '-')}   format v{meta.get('format_version')}, "
        f"hpccollect {meta.get('hpccollect_version', '-')}, created {meta.get('created', '-')}"
    )
    spec = meta.get("env_spec") if isinstance(meta.get("env_spec"), dict) else {}
    kwargs = meta.get("env_kwargs", spec.get("kwargs"))
    limit = spec.get("max_episode_steps")
    lines.append(
        f"env kwargs        {json.dumps(kwargs) if kwargs is not None else '-'}"
        + (f"   max_episode_steps {limit}" if limit is not None else "")
    )
    hosts = sorted(
        {e["host"] for e in meta.get("shards", []) if isinstance(e, dict) and "host" in e}
    )
    host = meta.get("host", f"- (per shard: {', '.join(hosts)})" if hosts else "-")
    lines.append(f"written on        {host}")
    seeds = sorted(
        {e["seed"] for e in meta.get("shards", []) if isinstance(e, dict) and "seed" in e}
    )
    seed = meta.get("seed", f"- (per shard: {', '.join(map(str, seeds))})" if seeds else "-")
    lines.append(f"seed              {seed}")
    config = meta.get("collector_config")
    if isinstance(config, dict) and config:
        lines.append(
            "collector         " + ", ".join(f"{k}={json.dumps(v)}" for k, v in config.items())
        )
    if "merged_from" in meta:
        lines.append(
            f"merged from       {len(meta['merged_from'])} shards: {', '.join(meta['merged_from'])}"
        )
    return lines


def _contents(ds: Any) -> list[str]:
    """What the data is: frames, episodes, their lengths and returns, the keys."""
    lines = [f"frames            {len(ds)} committed, {ds.written_steps} written"]
    ends = ds.episode_ends()
    lines.append(
        f"episodes          {ds.committed_episodes}   ({ends['terminated']} terminated, "
        f"{ends['truncated']} truncated)"
    )
    lengths, returns = ds.episode_lengths(), ds.returns()
    if len(lengths):
        lines.append(
            f"episode length    mean {lengths.mean():.2f}  min {lengths.min()}  max {lengths.max()}"
        )
    if len(returns):
        lines.append(
            f"episode return    mean {returns.mean():.2f}  std {returns.std():.2f}  "
            f"min {returns.min():.2f}  max {returns.max():.2f}"
        )
    lines.append("keys")
    for path, key in ds.keymap.items():
        data = ds.file[path]
        shape = data.shape[1:] + ((1,) if path in ds.squeezed else ())
        lines.append(
            f"  {'/'.join(key):28s} {np.dtype(data.dtype)!s:8s} {tuple(shape)!s:12s} <- {path}"
        )
    return lines


def unfinished_hint(file: str) -> None:
    """A final name that does not exist yet while its ``.partial`` does: say what that is."""
    path = Path(file)
    partial = path.with_name(path.name + ".partial")
    if not path.exists() and partial.exists():
        raise ArgumentValueError(
            f"{path} does not exist yet, but {partial} does: its run is still writing it, or was "
            f"killed; inspect that file, or if the run is over: python -m hpccollect repair {path}"
        )
