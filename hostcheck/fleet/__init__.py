"""``hostcheck fleet``: many nodes' ``--json`` reports -> one page (docs/fleet.md).

cli (the options, reading the reports, the run) -> peers (GPUs slower than their fleet peers) -> the pages.
"""
