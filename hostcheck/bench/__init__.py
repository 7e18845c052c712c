"""``hostcheck bench``: what each CPU-side tuning buys on this node, measured A/B (issue 8, docs/bench.md).

The orchestrator (``cli``; ``discover`` gathers, ``plan`` decides, ``run`` launches, ``stats``, ``proof``,
``advice``, ``render`` judge and report) is standard library only and runs in whatever Python runs hostcheck. Every measurement is one child process of the *training* Python
(``python -m hostcheck.bench.worker '<json>'``), so torch and PIL are imported there, never here. Nothing is
imported in this file: the child imports this package too.
"""

#: Version of the --json document; bump on any incompatible change.
BENCH_SCHEMA_VERSION = 1
