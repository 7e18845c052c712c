"""Every exit code hostcheck returns, defined here once; each subcommand imports the ones it uses.

hostcheck's own: 0 ready (``bench``: something was measured), 1 not ready at the fail level (``bench``: nothing
was measured), 2 a usage or environment error. ``hostcheck job`` returns the command's own code, or the shell's
codes for a command that could not start or was killed (bash(1) "EXIT STATUS", env(1), timeout(1)).
"""

from __future__ import annotations

#: Ready: no finding at or above the fail level (``bench``: at least one variant measured).
EXIT_OK = 0
#: Not ready: a finding at or above the fail level (``check``, ``fleet``).
EXIT_NOT_READY = 1
#: ``bench`` measured nothing: the same code as not ready, said in its own words.
EXIT_NOTHING_MEASURED = 1
#: ``baseline`` could record nothing of the node.
EXIT_NOTHING_RECORDED = 1
#: A usage or environment error: a bad option, an unreadable configuration, an unwritable output.
EXIT_USAGE = 2
#: The shell's code for a command found but not executable.
EXIT_NOT_EXECUTABLE = 126
#: The shell's code for a command not found.
EXIT_NOT_FOUND = 127
#: A process killed by signal N exits 128 + N (the shell's convention, kept by hostcheck when interrupted).
EXIT_SIGNAL_BASE = 128
