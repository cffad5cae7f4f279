"""``python -m hpccollect``: see ``hpccollect.cli``."""

import sys

from hpccollect.cli import main

if __name__ == "__main__":
    sys.exit(main())
