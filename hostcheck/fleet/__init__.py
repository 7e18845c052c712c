"""``hostcheck fleet``: many nodes' ``--json`` reports -> one page (docs/fleet.md).

cli (the options and the run) -> reports (each node's report read, checked and summarised) -> peers (GPUs
slower than their fleet peers) -> render (fleet.md and fleet.html).
"""
