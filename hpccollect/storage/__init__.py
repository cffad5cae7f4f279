"""Where collected data goes: the in-memory ReplayBuffer and HDF5 datasets for offline RL."""

from hpccollect.storage.exports import export_d4rl, export_memmap, export_minari
from hpccollect.storage.hdf5_reader import H5Dataset, TransitionDataset, open_dataset
from hpccollect.storage.hdf5_writer import HDF5Writer
from hpccollect.storage.merge import merge_shards
from hpccollect.storage.repair import repair
from hpccollect.storage.replay_buffer import ReplayBuffer

__all__ = [
    "H5Dataset",
    "HDF5Writer",
    "ReplayBuffer",
    "TransitionDataset",
    "export_d4rl",
    "export_memmap",
    "export_minari",
    "merge_shards",
    "open_dataset",
    "repair",
]
