"""``python -m hostcheck.bench`` (the same as ``hostcheck bench``)."""

import sys

from hostcheck.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
