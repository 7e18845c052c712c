"""``python -m hostcheck``: the ``hostcheck`` command (hostcheck.command)."""

import sys

from hostcheck.command import main

if __name__ == "__main__":
    sys.exit(main())
