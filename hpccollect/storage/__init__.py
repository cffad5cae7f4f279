"""Where collected data goes: the in-memory ReplayBuffer and datasets for offline RL, written
through the ``Sink`` contract (``sink.py``); HDF5 is the registered format."""

from hpccollect.storage.exports import export_d4rl, export_memmap, export_minari
from hpccollect.storage.hdf5_reader import H5Dataset, TransitionDataset, open_dataset
from hpccollect.storage.hdf5_writer import HDF5Writer
from hpccollect.storage.merge import merge_shards
from hpccollect.storage.repair import repair
from hpccollect.storage.replay_buffer import ReplayBuffer
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

register_format(
    StorageFormat(
        name="hdf5",
        suffixes=(".h5", ".hdf5"),
        writer=HDF5Writer,
        open=open_dataset,
        merge=merge_shards,
        repair=repair,
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
