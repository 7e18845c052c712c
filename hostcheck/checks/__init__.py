"""Built-in checks. Importing this package registers them (hostcheck.registry.REGISTRY).

Adding a category or check: write a pure ``fn(snapshot) -> Outcome`` in a module here, decorate it
with ``@check("<category>.E<nnn>", "Title", weight=..., needs=(...))`` and import the module below.
"""

from hostcheck.checks import (
    baseline,
    consistency,
    dcgm,
    fabric,
    fabric_nccl,
    gpu,
    hardware,
    nvlink,
    system,
    torch,
    tuning,
    workload,
)
from hostcheck.registry import Check, registered


def all_checks() -> list[Check]:
    """Every built-in check, in report order."""
    return registered()


__all__ = [
    "all_checks",
    "baseline",
    "consistency",
    "dcgm",
    "fabric",
    "fabric_nccl",
    "gpu",
    "hardware",
    "nvlink",
    "system",
    "torch",
    "tuning",
    "workload",
]
