"""Built-in checks. Importing a module of this package registers its checks (hostcheck.registry.REGISTRY).

A run imports only the modules whose checks its profile can run (:func:`load`): Slurm's HealthCheckProgram starts
the passive profile every few minutes on every node, and it need not build the GPU workload's or the torch probe's
checks to leave them out. :data:`MODULES` names each module with the gatherers that every one of its checks reads;
tests/unit/test_checks_index.py holds it equal to what importing each module of this package registers, so that
a module missing from it, or a check that reads less than its module's entry says, fails there.

Adding a category or check: write a pure ``fn(snapshot) -> Outcome`` in a module here, decorate it
with ``@check("<category>.E<nnn>", "Title", weight=..., needs=(...))`` and name the module in :data:`MODULES`.
"""

from __future__ import annotations

import importlib

from hostcheck.registry import Check, registered

#: Every module that registers checks -> the gatherers every check it registers (its imports' included) reads. A
#: profile that lacks one of them runs none of the module's checks: the module is not imported for it.
MODULES: dict[str, frozenset[str]] = {
    "hostcheck.checks.system": frozenset(),
    "hostcheck.checks.datapath": frozenset({"datapath", "facts"}),
    "hostcheck.checks.hardware": frozenset({"hardware"}),
    "hostcheck.checks.gpu": frozenset({"nvml"}),
    "hostcheck.checks.consistency": frozenset({"nvml"}),
    "hostcheck.checks.dcgm": frozenset({"dcgm"}),
    "hostcheck.checks.nvlink": frozenset({"nvml"}),
    "hostcheck.checks.fabric": frozenset({"rdma"}),
    "hostcheck.checks.fabric_nccl": frozenset({"rdma"}),
    "hostcheck.checks.torch": frozenset({"torch"}),
    "hostcheck.checks.tuning": frozenset({"facts"}),
    "hostcheck.checks.workload.compute": frozenset({"nvml", "workload"}),
    "hostcheck.checks.workload.paths": frozenset({"nvml", "workload"}),
    "hostcheck.checks.workload.training": frozenset({"nvml", "workload"}),
    "hostcheck.checks.baseline": frozenset({"inventory"}),
}


def load(needs: frozenset[str] | None = None) -> list[Check]:
    """The registered checks in report order, after importing every module that has a check reading only
    ``needs`` (a profile's gatherers), or every module when ``needs`` is None. Checks of other modules may be
    among them (imported before, or by a module that was): a selection still leaves out what ``needs`` lacks."""
    for module, reads in MODULES.items():
        if needs is None or reads <= needs:
            importlib.import_module(module)
    return registered()


def all_checks() -> list[Check]:
    """Every built-in check, in report order."""
    return load(None)


__all__ = ["MODULES", "all_checks", "load"]
