"""How messages and batches travel between a collector and its workers or ranks: the contracts
(``base``), the local pipe (``pipe``), a rank's link (``rank_channel``) over its TCP connection
(``control``) and the data plane (``groups``, ``batches``, ``backends``, ``mpi4py_group``), at
this host's ``addresses``. Nothing here knows collectors, launchers or jobs."""
