"""``python -m hpccollect``: see ``hpccollect.app.cli``."""

import sys

from hpccollect.app.cli import run

if __name__ == "__main__":
    sys.exit(run())
