"""The command-line application: ``python -m hpccollect`` (``cli.py``), its configuration, and
the collection job, local or across MPI ranks, with resume, progress and the final report. It
sits above the library and reaches datasets only through ``hpccollect.storage``."""
