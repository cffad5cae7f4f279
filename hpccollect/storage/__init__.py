"""Where collected data goes: the in-memory ReplayBuffer (HDF5 datasets in a later module)."""

from hpccollect.storage.replay_buffer import ReplayBuffer

__all__ = ["ReplayBuffer"]
