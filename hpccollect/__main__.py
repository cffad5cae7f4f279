"""``python -m hpccollect``: see ``hpccollect.app.cli``."""

import sys

from hpccollect._exit import freeze_survivors
from hpccollect.app.cli import main

if __name__ == "__main__":
    code = main()
    freeze_survivors()  # the command is done: its exit skips torch's objects
    sys.exit(code)
