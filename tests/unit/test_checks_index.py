"""hostcheck.checks.MODULES, the index a run loads its check modules by, against what the modules register.

A run imports only the check modules whose checks its profile can run. The index says which: every module that
registers checks, with the gatherers all of its checks read. Were a module missing from it, its checks would run
in no profile; were a module's entry to name a gatherer one of its checks does without, a profile that runs that
check would not import it. Both are found here, in a fresh interpreter, by importing every module of the package
and noting which module's top level was running when each check registered.
"""

from __future__ import annotations

import json
import subprocess
import sys
from argparse import ArgumentError
from pathlib import Path

import pytest

from hostcheck import command
from hostcheck.check.request import build_request
from hostcheck.checks import MODULES, all_checks
from hostcheck.profiles import PROFILES

ROOT = Path(__file__).resolve().parents[2]

#: Every module of hostcheck.checks imported, each check's owner being the module whose top level was running when
#: it registered (a module imports others' helpers, and with them their checks); then each profile's load() in a
#: cleared registry. Printed as {"modules": {module: {id: needs}}, "profiles": {profile: ids}}.
PROBE = """
import importlib, json, pkgutil, sys
import hostcheck.checks, hostcheck.registry as R

class Recording(dict):
    owner = {}
    def __setitem__(self, key, value):
        f = sys._getframe(1)
        while f.f_code.co_name != "<module>":
            f = f.f_back
        self.owner[key] = f.f_globals["__name__"]
        super().__setitem__(key, value)

def fresh():
    R.REGISTRY = Recording()
    for name in [m for m in sys.modules if m == "hostcheck.checks" or m.startswith("hostcheck.checks.")]:
        del sys.modules[name]
    return importlib.import_module("hostcheck.checks")

names = [m.name for m in pkgutil.walk_packages(fresh().__path__, "hostcheck.checks.")]
for name in names:
    importlib.import_module(name)
found = {"modules": {name: {} for name in names}, "profiles": {}}
for i, c in R.REGISTRY.items():
    found["modules"][Recording.owner[i]][i] = sorted(c.needs)
from hostcheck.profiles import PROFILES
for profile in PROFILES.values():
    found["profiles"][profile.name] = sorted(c.id for c in fresh().load(profile.needs))
print(json.dumps(found))
"""


def registrations() -> dict:
    p = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, timeout=120, check=True
    )
    return json.loads(p.stdout)


def index_errors(registered: dict[str, dict[str, list[str]]], index: dict[str, frozenset[str]]) -> list[str]:
    """How ``index`` (module -> the gatherers all its checks read) differs from what each module registers when
    imported alone (module -> {check id: its needs})."""
    errors = []
    for module, checks in sorted(registered.items()):
        if checks and module not in index:
            errors.append(
                f"{module} registers {', '.join(sorted(checks))} and is not in hostcheck.checks.MODULES"
            )
        elif not checks and module in index:
            errors.append(f"{module} is in hostcheck.checks.MODULES and registers no check")
        elif checks:
            common = sorted(frozenset.intersection(*(frozenset(n) for n in checks.values())))
            if common != sorted(index[module]):
                errors.append(
                    f"{module}: every check it registers reads {common}, the index says {sorted(index[module])}"
                )
    errors += [
        f"{m} is in hostcheck.checks.MODULES and not a module of it"
        for m in sorted(set(index) - set(registered))
    ]
    return errors


def test_the_index_is_what_each_module_registers_and_every_profile_loads_what_it_runs():
    found = registrations()
    assert index_errors(found["modules"], MODULES) == []
    every = {c.id: c for c in all_checks()}
    assert set().union(*found["modules"].values()) == set(every)
    for name, profile in PROFILES.items():
        runs = {i for i, c in every.items() if profile.allows(c.needs)}
        assert runs <= set(found["profiles"][name]), name
    # What the index buys: the passive profile builds none of the GPU workload's checks.
    assert not [i for i in found["profiles"]["passive"] if i.startswith("workload.")]
    assert {i for i in found["profiles"]["full"] if i.startswith("workload.")}


def test_a_module_left_out_of_the_index_or_reading_less_than_it_says_is_caught():
    registered = {
        "hostcheck.checks.gpu": {"gpu.E001": ["nvml"], "gpu.E002": ["nvml", "system"]},
        "hostcheck.checks.new": {"gpu.E099": ["nvml"]},
        "hostcheck.checks.helpers": {},
        "hostcheck.checks.tuning": {"tuning.E001": ["facts", "tuning"], "tuning.E002": ["facts"]},
    }
    index = {
        "hostcheck.checks.gpu": frozenset({"nvml"}),
        "hostcheck.checks.helpers": frozenset(),
        "hostcheck.checks.tuning": frozenset({"facts", "tuning"}),
        "hostcheck.checks.gone": frozenset(),
    }
    assert index_errors(registered, index) == [
        "hostcheck.checks.helpers is in hostcheck.checks.MODULES and registers no check",
        "hostcheck.checks.new registers gpu.E099 and is not in hostcheck.checks.MODULES",
        "hostcheck.checks.tuning: every check it registers reads ['facts'], the index says ['facts', 'tuning']",
        "hostcheck.checks.gone is in hostcheck.checks.MODULES and not a module of it",
    ]
    assert index_errors(registered, {**index, "hostcheck.checks.gpu": frozenset({"nvml", "system"})})[0] == (
        "hostcheck.checks.gpu: every check it registers reads ['nvml'], the index says ['nvml', 'system']"
    )


def _answer(argv: list[str], catalogue) -> tuple[str, list[str]] | tuple[str, str]:
    try:
        request = build_request(command.parse(["check", *argv]).args, catalogue)
    except ArgumentError as exc:
        return "error", str(exc)
    return "checks", [c.id for c in request.checks]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--list"],
        ["--quick"],
        ["--only", "torch.E001"],
        ["--only", "torch"],
        ["--only", "gpu,torch.E001"],
        ["--only", "workload.E001", "--quick"],
        ["--only", "gpu.E999"],
        ["--skip", "nosuch"],
        ["--skip", "system,gpu,nvlink,fabric,tuning,baseline"],
        ["--skip", "gpu.E001", "--only", "gpu"],
    ],
)
def test_a_selection_answers_from_the_profiles_checks_as_from_every_check(profile, argv):
    """The checks chosen, or the error, are the same whether the catalogue held every check or only those the
    profile runs (what load() gives at the least): a check named outside them is answered from every check."""
    every = all_checks()

    def least(needs):
        return every if needs is None else [c for c in every if c.needs <= needs]

    argv = ["--profile", profile, *argv]
    assert _answer(argv, least) == _answer(argv, lambda needs: every)
