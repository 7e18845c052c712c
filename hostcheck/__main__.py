"""``python -m hostcheck``."""

import sys

from hostcheck.cli import main

if __name__ == "__main__":
    sys.exit(main())
