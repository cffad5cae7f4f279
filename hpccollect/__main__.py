"""``python -m hpccollect``: see ``hpccollect.app.cli``."""

import sys

from hpccollect.app.cli import main

if __name__ == "__main__":
    sys.exit(main())
