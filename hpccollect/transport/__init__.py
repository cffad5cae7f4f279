"""How messages and batches travel between a collector and its workers or ranks: the contracts
and the waits (``base.py``), the local pipe (``pipe.py``), and a rank's link (``rank_channel.py``)
over its control connection (``control.py``) and the job's data plane (``groups.py``, the flat
layout of ``batches.py``, the registered backends of ``backends.py`` and ``mpi4py_group.py``),
reached at this host's addresses (``addresses.py``). Nothing here knows collectors, launchers
or jobs."""
