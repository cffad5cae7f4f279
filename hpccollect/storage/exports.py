"""Exports of a dataset file for the tools offline-RL users already have.

* ``export_d4rl``: one flat HDF5 file in D4RL's layout (gzip + shuffle), for
  ``d4rl``-style ``get_dataset``/``qlearning_dataset`` loaders.
* ``export_minari``: a Minari dataset (``<root>/<id>/data/main_data.hdf5`` + ``metadata.json``)
  written through Minari's own API, so ``minari.load_dataset`` reads it (needs ``minari[hdf5]``).
* ``export_memmap``: a TensorDict memory-mapped folder for ``TensorDict.load_memmap``.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import h5py
import numpy as np

from hpccollect.envs.spaces import action_codec, observation_codecs
from hpccollect.errors import ArgumentValueError
from hpccollect.storage.hdf5_reader import H5Dataset

__all__ = ["export_d4rl", "export_memmap", "export_minari"]

_D4RL = ("observations", "actions", "rewards", "terminals", "timeouts", "next_observations")
_DATASET_ID = re.compile(r"^[\w.-]+/[\w.-]+-v\d+$")


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not overwrite:
        raise ArgumentValueError(f"{out} already exists; pass --overwrite to replace it.")


def _obs_keys(ds: H5Dataset) -> list[tuple[str, ...]]:
    """Observation leaf keys at the root (everything not an action, flag, reward or id)."""
    skip = {"action", "done", "terminated", "truncated", "step_count", "collector", "next"}
    obs = [k for k in ds.keys() if k[0] not in skip]
    return [k for k in obs if ("next", *k) in ds.keys()]


def _flat_observations(ds: H5Dataset, rows: Any, prefix: tuple[str, ...] = ()) -> np.ndarray:
    """Observation leaves concatenated into one float32 array per row (Dict spaces flattened)."""
    data = ds[rows]
    parts = [
        data.get((*prefix, *k)).reshape(data.shape[0], -1).float().numpy() for k in _obs_keys(ds)
    ]
    return np.concatenate(parts, axis=1)


def export_d4rl(src: str | os.PathLike, out: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write D4RL's flat layout; Dict observations are flattened and concatenated (float32)."""
    out = Path(out)
    _check_out(out, overwrite)
    with H5Dataset(src) as ds:
        if not len(ds):
            raise ArgumentValueError(f"{src} has no committed rows to export.")
        rows = slice(None)
        if ("observation",) in ds.keys():
            obs = ds.file["observations"][: len(ds)]
            nxt = ds.file["next_observations"][: len(ds)]
        else:
            obs, nxt = _flat_observations(ds, rows), _flat_observations(ds, rows, ("next",))
        columns = {
            "observations": obs,
            "actions": ds.file["actions"][: len(ds)],
            "rewards": ds.file["rewards"][: len(ds)].astype(np.float32),
            "terminals": ds.file["terminals"][: len(ds)].astype(bool),
            "timeouts": ds.file["timeouts"][: len(ds)].astype(bool),
            "next_observations": nxt,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        with h5py.File(out, "w") as f:
            for name in _D4RL:
                f.create_dataset(name, data=columns[name], compression="gzip", shuffle=True)
            for key in (
                "env_id",
                "observation_space",
                "action_space",
                "seed",
                "hpccollect_version",
            ):
                if key in ds.file.attrs:
                    f.attrs[key] = ds.file.attrs[key]
    return out


def export_memmap(
    src: str | os.PathLike, out: str | os.PathLike, *, overwrite: bool = False
) -> Path:
    """Every committed row as a memory-mapped TensorDict folder."""
    out = Path(out)
    _check_out(out, overwrite)
    with H5Dataset(src) as ds:
        ds.to_tensordict().memmap(out, existsok=overwrite)
    return out


def export_minari(
    src: str | os.PathLike, root: str | os.PathLike, dataset_id: str, *, overwrite: bool = False
) -> Path:
    """A Minari dataset ``dataset_id`` (``namespace/name-vN``) under the datasets folder ``root``."""
    if not _DATASET_ID.match(dataset_id):
        raise ArgumentValueError(
            f"--dataset-id {dataset_id!r} must look like NAMESPACE/NAME-vN, e.g. hpccollect/cartpole-v0."
        )
    try:
        import minari
        from minari.data_collector import EpisodeBuffer
    except ImportError as err:
        raise ArgumentValueError(
            "exporting to Minari needs the minari package: pip install -c constraints.txt "
            "'hpccollect[minari]'."
        ) from err
    root = Path(root)
    target = root / dataset_id
    _check_out(target, overwrite)
    with H5Dataset(src) as ds:
        obs_space, act_space = ds.observation_space, ds.action_space
        if obs_space is None:
            raise ArgumentValueError(
                f"{src} records no observation/action spaces; write it with HDF5Writer(env=...)."
            )
        buffers = [
            EpisodeBuffer(
                id=i,
                observations=obs,
                actions=act,
                rewards=rew,
                terminations=term,
                truncations=trunc,
            )
            for i, (obs, act, rew, term, trunc) in enumerate(
                _minari_episodes(ds, obs_space, act_space)
            )
        ]
        env_id = str(ds.file.attrs.get("env_id", ""))
    registered = env_id in gym.registry
    with _datasets_path(root):
        if overwrite and target.exists():
            minari.delete_dataset(dataset_id)
        minari.create_dataset_from_buffers(
            dataset_id,
            buffers,
            env=env_id if registered else None,
            eval_env=env_id if registered else None,
            description=f"Collected with hpccollect ({Path(src).name}).",
            observation_space=None if registered else obs_space,
            action_space=None if registered else act_space,
            algorithm_name="hpccollect",
            author="hpccollect",
            author_email="unknown@localhost",
            code_permalink="https://pypi.org/project/hpccollect",
        )
    return target


def _minari_episodes(ds: H5Dataset, obs_space: gym.Space, act_space: gym.Space) -> Iterator[tuple]:
    """Per episode: observations (T+1, env format), actions (env format), rewards, flags."""
    obs_codecs = observation_codecs(obs_space)
    act = action_codec(act_space)
    for episode in ds.episodes():
        leaves = {}
        for key, codec in obs_codecs.items():
            values = np.concatenate(
                [episode.get(key).numpy(), episode.get(("next", *key))[-1:].numpy()]
            )
            leaves[key] = codec.decode(values) if codec.encode is not None else values
        if list(leaves) == [("observation",)]:
            observations: Any = leaves[("observation",)]
        else:
            observations = {}
            for key, value in leaves.items():
                node = observations
                for part in key[:-1]:
                    node = node.setdefault(part, {})
                node[key[-1]] = value
        yield (
            observations,
            np.asarray(act.decode(episode.get("action").numpy())),
            episode.get(("next", "reward")).reshape(-1).numpy().astype(np.float64),
            episode.get(("next", "terminated")).reshape(-1).numpy(),
            episode.get(("next", "truncated")).reshape(-1).numpy(),
        )


@contextlib.contextmanager
def _datasets_path(root: Path) -> Iterator[None]:
    """Point Minari at ``root`` for the duration (it reads MINARI_DATASETS_PATH)."""
    old = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(root.resolve())
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = old
