"""How often a collector rank reports to rank 0 (see ``reports.py``). Apart from the reports,
which need torch, so that ``python -m hpccollect --help`` shows it before torch loads."""

__all__ = ["DEFAULT_REPORT_INTERVAL"]

#: seconds between a collector rank's reports to rank 0, unless its asked batches end sooner
DEFAULT_REPORT_INTERVAL = 2.0
