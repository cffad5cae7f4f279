"""Exports of a dataset file for the tools offline-RL users already have.

* ``export_d4rl``: one flat HDF5 file in D4RL's layout (gzip + shuffle), for
  ``d4rl``-style ``get_dataset``/``qlearning_dataset`` loaders. Actions and single observations
  are in the env's own format (a ``Discrete`` action is an integer, not one-hot), so their shape
  is the space's shape as d4rl checks; the attribute ``action_encoding`` says which.
* ``export_minari``: a Minari dataset (``<root>/<id>/data/main_data.hdf5`` + ``metadata.json``)
  written through Minari's own API, so ``minari.load_dataset`` reads it and
  ``recover_environment()`` makes the recorded env spec (needs ``minari[hdf5]``).
* ``export_memmap``: a TensorDict memory-mapped folder for ``TensorDict.load_memmap``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import h5py
import numpy as np

from hpccollect.envs.spaces import action_codec
from hpccollect.errors import ArgumentValueError
from hpccollect.storage.hdf5_reader import H5Dataset
from hpccollect.storage.layout import dataset_path
from hpccollect.storage.metadata import ENV_ATTRS, recorded_env
from hpccollect.storage.outputs import (
    check_absent,
    check_final_name,
    check_inputs_kept,
    check_kind,
    check_writable,
)
from hpccollect.storage.sink import read_dataset

__all__ = ["export_d4rl", "export_memmap", "export_minari"]

_D4RL = ("observations", "actions", "rewards", "terminals", "timeouts", "next_observations")
_D4RL_ATTRS = (*ENV_ATTRS, "seed", "run_id", "hpccollect_version")


def _obs_keys(ds: H5Dataset) -> list[tuple[str, ...]]:
    """Observation leaf keys at the root (everything not an action, flag, reward or id)."""
    skip = {"action", "done", "terminated", "truncated", "step_count", "collector", "next"}
    obs = [k for k in ds.keys() if k[0] not in skip]
    return [k for k in obs if ("next", *k) in ds.keys()]


def _single_obs_key(ds: H5Dataset, space: gym.Space | None) -> tuple[str, ...] | None:
    """The key of a non-Dict observation: ``observation``, or ``pixels`` for an image (TorchRL's
    name, see ``hpccollect.envs.spaces.is_image``); None for Dict observations."""
    if isinstance(space, gym.spaces.Dict):
        return None
    keys = _obs_keys(ds)
    return keys[0] if len(keys) == 1 and keys[0] in (("observation",), ("pixels",)) else None


def _flat_observations(ds: H5Dataset, rows: Any, prefix: tuple[str, ...] = ()) -> np.ndarray:
    """Observation leaves concatenated into one float32 array per row (Dict spaces flattened)."""
    data = ds[rows]
    parts = [
        data.get((*prefix, *k)).reshape(data.shape[0], -1).float().numpy() for k in _obs_keys(ds)
    ]
    return np.concatenate(parts, axis=1)


def export_d4rl(src: str | os.PathLike, out: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write D4RL's flat layout.

    Actions are in the env's format: integers ``(N,)`` for ``Discrete``, ``(N, k)`` for
    ``MultiDiscrete``, as stored for ``Box``/``MultiBinary`` (attribute ``action_encoding``:
    ``integer``, ``continuous``, ``binary``). A single observation is in the env's format too;
    Dict observations are flattened and concatenated (float32).
    """
    out = Path(out)
    check_final_name(out)
    with _read_for(src, out, overwrite=overwrite, folder=False) as ds:
        n = len(ds)
        if not n:
            raise ArgumentValueError(f"{src} has no committed rows to export.")
        obs_space, act_space = ds.observation_space, ds.action_space
        single = _single_obs_key(ds, obs_space)
        if single is not None:
            obs = _env_format(ds.file[dataset_path(single)][:n], obs_space)
            nxt = _env_format(ds.file[dataset_path(("next", *single))][:n], obs_space)
        else:
            rows = slice(None)
            obs, nxt = _flat_observations(ds, rows), _flat_observations(ds, rows, ("next",))
        columns = {
            "observations": obs,
            "actions": _env_format(ds.file["actions"][:n], act_space),
            "rewards": ds.file["rewards"][:n].astype(np.float32),
            "terminals": ds.file["terminals"][:n].astype(bool),
            "timeouts": ds.file["timeouts"][:n].astype(bool),
            "next_observations": nxt,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        with _written_whole(out) as tmp, h5py.File(tmp, "w") as f:
            for name in _D4RL:
                f.create_dataset(name, data=columns[name], compression="gzip", shuffle=True)
            for key in _D4RL_ATTRS:
                if key in ds.file.attrs:
                    f.attrs[key] = ds.file.attrs[key]
            f.attrs["action_encoding"] = _encoding(act_space)
            f.attrs["observation_encoding"] = (
                _encoding(obs_space) if single is not None else "flattened"
            )
    return out


@contextlib.contextmanager
def _read_for(
    src: str | os.PathLike, out: Path, *, overwrite: bool, folder: bool, option: str = "--out"
) -> Iterator[Any]:
    """``src`` opened for an export into ``out``, once ``out`` is checked: of its kind, in a
    folder that can be written (before anything is read), none of the files ``src`` reads (a
    merged view's shards too), and new unless ``overwrite``."""
    check_kind(out, folder, option)
    check_writable(out, option)
    with read_dataset(src) as ds:
        check_inputs_kept(out, list(getattr(ds, "files", [Path(src)])), "export", option)
        check_absent(out, overwrite)
        yield ds


@contextlib.contextmanager
def _written_whole(out: Path) -> Iterator[Path]:
    """A file beside ``out`` to write, which becomes ``out`` once written whole: a failed or
    interrupted export leaves ``out`` as it was (the file it replaces, or none)."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def _stored_categorical(stored: np.ndarray, space: gym.Space) -> bool:
    """Whether a Discrete/MultiDiscrete leaf was stored as indices (else one-hot)."""
    return stored.shape[1:] == tuple(space.shape)


def _env_format(stored: np.ndarray, space: gym.Space | None) -> np.ndarray:
    """Stored values of one leaf (batched) as the env takes or returns them."""
    if not isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        return stored
    codec = action_codec(space, categorical=_stored_categorical(stored, space))
    return np.asarray(codec.decode(stored), dtype=np.int64)


def _encoding(space: gym.Space | None) -> str:
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        return "integer"
    if isinstance(space, gym.spaces.Box):
        return "continuous"
    if isinstance(space, gym.spaces.MultiBinary):
        return "binary"
    return "as-stored"  # the file records no space: values exactly as the collector stored them


def export_memmap(
    src: str | os.PathLike, out: str | os.PathLike, *, overwrite: bool = False
) -> Path:
    """Every committed row as a memory-mapped TensorDict folder."""
    out = Path(out)
    with _read_for(src, out, overwrite=overwrite, folder=True) as ds:
        ds.to_tensordict().memmap(out, existsok=overwrite)
    return out


def export_minari(
    src: str | os.PathLike, root: str | os.PathLike, dataset_id: str, *, overwrite: bool = False
) -> Path:
    """A Minari dataset ``dataset_id`` under the datasets folder ``root``.

    ``dataset_id`` is any id Minari accepts: ``NAME-vN`` or ``NAMESPACE/NAME-vN``, namespaces
    nested as in ``D4RL/door/human-v2``; Minari writes each namespace's metadata file. The env
    spec the file records (id, kwargs, ``max_episode_steps``, wrappers) goes to Minari, so
    ``recover_environment()`` makes the env the data came from.
    """
    minari = _minari(dataset_id)
    from minari.data_collector import EpisodeBuffer

    root = Path(root)
    target = root / dataset_id
    with _read_for(src, target, overwrite=overwrite, folder=True, option="--dataset-id") as ds:
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
        spec = recorded_env(ds.file.attrs)
    with _datasets_path(root):
        if overwrite and target.exists():
            minari.delete_dataset(dataset_id)
        minari.create_dataset_from_buffers(
            dataset_id,
            buffers,
            env=spec,
            eval_env=spec,
            description=f"Collected with hpccollect ({Path(src).name}).",
            observation_space=obs_space,
            action_space=act_space,
            algorithm_name="hpccollect",
            author="hpccollect",
            author_email="unknown@localhost",
            code_permalink="https://pypi.org/project/hpccollect",
        )
    return target


def _minari(dataset_id: str) -> Any:
    """The minari module, once ``dataset_id`` is checked to be a Minari id."""
    try:
        import minari
        from minari.dataset.minari_dataset import parse_dataset_id
    except ImportError as err:
        raise ArgumentValueError(
            "exporting to Minari needs the minari package: pip install -c constraints.txt "
            "'hpccollect[minari]'."
        ) from err
    try:
        parse_dataset_id(dataset_id)
    except (ValueError, TypeError) as err:
        raise ArgumentValueError(
            f"--dataset-id {dataset_id!r} is not a Minari id: use NAME-vN or NAMESPACE/NAME-vN "
            "(namespaces may nest, as in hpc/pendulum/test-v0; letters, digits, - and _), "
            "e.g. hpccollect/cartpole-v0."
        ) from err
    return minari


def _minari_episodes(ds: H5Dataset, obs_space: gym.Space, act_space: gym.Space) -> Iterator[tuple]:
    """Per episode: observations (T+1, env format), actions (env format), rewards, flags."""
    single = _single_obs_key(ds, obs_space)
    spaces = {single: obs_space} if single is not None else _leaf_spaces(obs_space)
    for episode in ds.episodes():
        leaves = {}
        for key, space in spaces.items():
            values = np.concatenate(
                [episode.get(key).numpy(), episode.get(("next", *key))[-1:].numpy()]
            )
            leaves[key] = _env_format(values, space)
        if single is not None:
            observations: Any = leaves[single]
        else:
            observations = {}
            for key, value in leaves.items():
                node = observations
                for part in key[:-1]:
                    node = node.setdefault(part, {})
                node[key[-1]] = value
        yield (
            observations,
            _env_format(episode.get("action").numpy(), act_space),
            episode.get(("next", "reward")).reshape(-1).numpy().astype(np.float64),
            episode.get(("next", "terminated")).reshape(-1).numpy(),
            episode.get(("next", "truncated")).reshape(-1).numpy(),
        )


def _leaf_spaces(space: gym.Space, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Observation key -> leaf space, keyed as ``observation_codecs`` keys them."""
    if not isinstance(space, gym.spaces.Dict):
        return {prefix or ("observation",): space}
    out = {}
    for name, sub in space.spaces.items():
        out.update(_leaf_spaces(sub, (*prefix, name)))
    return out


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
