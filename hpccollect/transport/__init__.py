"""How messages and batches travel between a collector and its workers or ranks: the contracts
(``base.py``), the local pipe (``pipe.py``), and the registered process-group backends
(``backends.py``) behind the rank channel (``rank_channel.py``). Nothing here knows collectors,
launchers or jobs."""
