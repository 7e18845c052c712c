"""``python -m hostcheck``: the ``hostcheck`` command (hostcheck.command)."""

import sys

try:
    from hostcheck.command import entry_point
except MemoryError:  # no memory even to import hostcheck (a tiny ulimit -v): what main says then, exit 2
    sys.stderr.write("hostcheck: error: out of memory while starting (an address-space limit, ulimit -v?)\n")
    sys.exit(2)

if __name__ == "__main__":
    entry_point()
