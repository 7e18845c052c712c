"""``hostcheck bench``: what each CPU-side tuning buys on this node, measured A/B (docs/bench.md).

The orchestrator (``cli``; ``discover`` gathers, ``plan`` decides, ``run`` launches, ``stats``, ``proof``,
``advice``, ``render`` judge and report; ``server`` talks to the workers) is standard library only and runs in
whatever Python runs hostcheck. The measurements are made by worker processes of the *training* Python, one
per variant of a group (``python -m hostcheck.inside.bench_worker --serve '<json>'``), so torch and PIL are imported
there, never here. Nothing is imported in this file: the workers import this package too.
"""

#: Version of the --json document; bump on any incompatible change.
BENCH_SCHEMA_VERSION = 1
