"""``python -m hostcheck``: the ``hostcheck`` command (hostcheck.command)."""

from hostcheck.command import entry_point

if __name__ == "__main__":
    entry_point()
