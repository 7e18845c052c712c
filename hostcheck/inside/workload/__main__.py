"""``python -m hostcheck.inside.workload PROBE --json-args JSON`` (hostcheck.inside.workload.suite.main)."""

import sys

from .suite import main

if __name__ == "__main__":
    sys.exit(main())
