"""Where collected data goes: the in-memory ReplayBuffer and datasets for offline RL, written
through the ``Sink`` contract (``sink.py``); HDF5 is the registered format.

Each name loads its module when first used (``hpccollect._lazy.lazy_exports``), and the HDF5
format's parts theirs when first called: reading a dataset's description needs neither torch
nor tensordict."""

from typing import TYPE_CHECKING

from hpccollect._lazy import called_on_use, lazy_exports
from hpccollect.storage.sink import (
    EpisodeReturns,
    EpisodeTally,
    Sink,
    StorageFormat,
    dataset_format,
    merge_datasets,
    open_sink,
    read_dataset,
    register_format,
    repair_dataset,
)
from hpccollect.storage.unfinished import drop_staging, final_path, partial_path, staging_path

if TYPE_CHECKING:
    from hpccollect.storage.exports import export_d4rl, export_memmap, export_minari
    from hpccollect.storage.hdf5_reader import H5Dataset, open_dataset
    from hpccollect.storage.hdf5_writer import HDF5Writer
    from hpccollect.storage.merge import merge_shards
    from hpccollect.storage.repair import repair
    from hpccollect.storage.replay_buffer import ReplayBuffer
    from hpccollect.storage.transitions import TransitionDataset

_EXPORTS = "hpccollect.storage.exports"
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "export_d4rl": f"{_EXPORTS}:export_d4rl",
        "export_memmap": f"{_EXPORTS}:export_memmap",
        "export_minari": f"{_EXPORTS}:export_minari",
        "H5Dataset": "hpccollect.storage.hdf5_reader:H5Dataset",
        "open_dataset": "hpccollect.storage.hdf5_reader:open_dataset",
        "HDF5Writer": "hpccollect.storage.hdf5_writer:HDF5Writer",
        "merge_shards": "hpccollect.storage.merge:merge_shards",
        "repair": "hpccollect.storage.repair:repair",
        "ReplayBuffer": "hpccollect.storage.replay_buffer:ReplayBuffer",
        "TransitionDataset": "hpccollect.storage.transitions:TransitionDataset",
    },
)

register_format(
    StorageFormat(
        name="hdf5",
        suffixes=(".h5", ".hdf5"),
        writer=called_on_use("hpccollect.storage.hdf5_writer:HDF5Writer"),
        open=called_on_use("hpccollect.storage.hdf5_reader:open_dataset"),
        merge=called_on_use("hpccollect.storage.merge:merge_shards"),
        repair=called_on_use("hpccollect.storage.repair:repair"),
        partial_path=partial_path,
    )
)

__all__ = [
    "EpisodeReturns",
    "EpisodeTally",
    "H5Dataset",
    "HDF5Writer",
    "ReplayBuffer",
    "Sink",
    "StorageFormat",
    "TransitionDataset",
    "dataset_format",
    "drop_staging",
    "export_d4rl",
    "export_memmap",
    "export_minari",
    "final_path",
    "merge_datasets",
    "merge_shards",
    "open_dataset",
    "open_sink",
    "partial_path",
    "read_dataset",
    "register_format",
    "repair",
    "repair_dataset",
    "staging_path",
]
