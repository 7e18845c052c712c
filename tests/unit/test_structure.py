"""The shape of the hostcheck package: no import cycles, one direction for every arrow, modules a reader can hold.

Every ``import`` counts, at the top of a file or inside a function: a cycle through a lazy import is still a
cycle a maintainer must keep in their head.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from hostcheck.profiles import PROFILES
from hostcheck.registry import CATEGORIES, Status
from hostcheck.score import FAIL_LEVELS

PKG = Path(__file__).resolve().parents[2] / "hostcheck"
#: Above this many lines a module must say at its top why it is one module ("Why one module: ...").
MAX_LINES = 600


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The hostcheck modules ``name`` imports (a package's submodule when one is named, else the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found |= {f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names}
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_walker_finds_a_cycle_through_a_lazy_import(tmp_path):
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    lazy = tmp_path / "score.py"
    lazy.write_text("def f():\n    from hostcheck import registry\n    from .gather import base\n")
    known = {"hostcheck.registry", "hostcheck.score", "hostcheck.gather.base"}
    assert imports_of("hostcheck.score", lazy, known) == {"hostcheck.registry", "hostcheck.gather.base"}


def test_hostcheck_has_no_import_cycle():
    assert cycles(graph()) == []


#: The one module of hostcheck.inside the orchestrator may import: the pure proofs of what a bench worker
#: reports, which the worker runs too (fail fast) and the orchestrator runs on every record.
SHARED_INSIDE = {"hostcheck.inside.proof", "hostcheck.inside"}


def test_the_registry_is_a_leaf_and_nothing_outside_imports_the_inside_code():
    g = graph()
    assert g["hostcheck.registry"] == set(), "the checks import the registry, never the reverse"
    inside = {m for m in g if m.startswith("hostcheck.inside")} - SHARED_INSIDE
    offenders = {m: g[m] & inside for m in g if not m.startswith("hostcheck.inside") and g[m] & inside}
    assert offenders == {}, (
        "hostcheck/inside runs in the training Python (launch.inside_argv): import it nowhere"
    )


def outside_imports(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """What each module of hostcheck.inside imports of hostcheck outside hostcheck.inside."""
    out = {
        m: {x for x in g[m] if not x.startswith("hostcheck.inside")}
        for m in g
        if m.startswith("hostcheck.inside")
    }
    return {m: xs for m, xs in out.items() if xs}


def test_the_inside_code_imports_nothing_of_hostcheck_outside_it():
    """hostcheck.inside runs in the training Python: the orchestrator's modules (and what they import: NVML
    bindings, the registry, the report) have no business there. Every import counts, lazy or relative."""
    assert outside_imports(graph()) == {}


def test_the_inside_boundary_catches_a_planted_import(tmp_path):
    g = graph()
    known = set(g)
    cases = {
        "absolute, in a function": "def f():\n    from hostcheck.registry import Status\n",
        "relative, two levels up": "from ...registry import Status\n",
        "the package itself": "import hostcheck\n",
    }
    for why, text in cases.items():
        planted = tmp_path / "planted.py"
        planted.write_text(text)
        name = "hostcheck.inside.workload.planted"
        got = outside_imports({**g, name: imports_of(name, planted, known | {name})})
        assert set(got) == {name}, why
    clean = tmp_path / "clean.py"
    clean.write_text("from ..fixtures import small_cnn\nfrom hostcheck.inside import probe\nimport json\n")
    name = "hostcheck.inside.workload.clean"
    assert outside_imports({**g, name: imports_of(name, clean, known | {name})}) == {}


@pytest.mark.parametrize("name", sorted(modules()))
def test_modules_stay_small_or_say_why(name):
    path = modules()[name]
    lines = path.read_text().splitlines()
    if len(lines) > MAX_LINES:
        doc = ast.get_docstring(ast.parse("\n".join(lines))) or ""
        assert "Why one module:" in doc, f"{path}: {len(lines)} lines and no 'Why one module:' at its top"


# --- one definition for each set of names ---------------------------------------------------------------------
#: Each set of names and the one module that defines it. A copy, in any other module, is a literal collection
#: (tuple, list, set, or a dict's keys) of two or more strings all from one set, or a constant (an upper-case
#: name) set to one of them, as ``FAIL = "fail"``: use the home's names instead.
NAME_SETS = {
    "status": (frozenset(s.value for s in Status), "hostcheck.registry"),
    "profile name": (frozenset(PROFILES), "hostcheck.profiles"),
    "fail level": (frozenset(FAIL_LEVELS), "hostcheck.score"),
}


def _literal_strings(node: ast.AST) -> list[str] | None:
    """The strings of a literal collection made of strings only (a dict: its keys), else None."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = node.elts
    elif isinstance(node, ast.Dict):
        items = node.keys
    else:
        return None
    if not all(isinstance(i, ast.Constant) and isinstance(i.value, str) for i in items):
        return None
    return [i.value for i in items]


def _name_set(strings: set[str]) -> str | None:
    """The first set of NAME_SETS that holds all these strings (statuses before fail levels)."""
    return next((what for what, (names, _home) in NAME_SETS.items() if strings <= names), None)


def name_set_copies(name: str, source: str) -> list[str]:
    """Every literal in module ``name``'s source that repeats a set of NAME_SETS outside its home."""
    found = []
    constants: dict[str, list[tuple[int, str]]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            upper = [t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()]
            what = _name_set({node.value.value}) if upper and isinstance(node.value.value, str) else None
            if what:
                constants.setdefault(what, []).append((node.lineno, upper[0]))
            continue
        strings = _literal_strings(node)
        if not strings or len(set(strings)) < 2:
            continue
        what = _name_set(set(strings))
        if what and name != NAME_SETS[what][1]:
            found.append(
                f"{name}:{node.lineno}: a second {what} list {tuple(strings)} (use {NAME_SETS[what][1]}'s)"
            )
    # One constant may be a coincidence (an Unavailable kind called ERROR); two of one set are a copy of it.
    for what, named in constants.items():
        if len(named) >= 2 and name != NAME_SETS[what][1]:
            found += [f"{name}:{n}: {c} copies a {what} (use {NAME_SETS[what][1]}'s)" for n, c in named]
    return found


def test_statuses_profile_names_and_fail_levels_are_defined_once():
    found = [f for name, path in modules().items() for f in name_set_copies(name, path.read_text())]
    assert found == []


def test_a_second_status_profile_or_fail_level_list_is_refused():
    planted = (
        "OK = ('pass', 'warn', 'fail')\n"
        "NAMES = ['passive', 'prolog', 'epilog', 'full', 'burnin']\n"
        "LEVELS = {'warn': 1, 'fail': 2, 'none': 99}\n"
        "ACTIONS = ('fail', 'warn', 'ignore')\n"  # the XID actions: another set, not a copy
        "ONE = ('pass',)\n"
        "FAIL = 'fail'\n"
        "WARN = 'warn'\n"
        "unlisted: str = 'warn'\n"  # a setting's default, not a constant standing for the status
    )
    assert name_set_copies("hostcheck.fleet_peers", planted) == [
        "hostcheck.fleet_peers:1: a second status list ('pass', 'warn', 'fail') (use hostcheck.registry's)",
        "hostcheck.fleet_peers:2: a second profile name list "
        "('passive', 'prolog', 'epilog', 'full', 'burnin') (use hostcheck.profiles's)",
        "hostcheck.fleet_peers:3: a second fail level list ('warn', 'fail', 'none') (use hostcheck.score's)",
        "hostcheck.fleet_peers:6: FAIL copies a status (use hostcheck.registry's)",
        "hostcheck.fleet_peers:7: WARN copies a status (use hostcheck.registry's)",
    ]
    assert name_set_copies("hostcheck.gather.base", "ERROR = 'error'\n") == []
    assert name_set_copies("hostcheck.score", "LEVELS = {'warn': 1, 'fail': 2, 'none': 99}\n") == []


def test_the_report_schema_lists_the_names_the_code_defines():
    schema = json.loads((PKG / "data" / "hostcheck-report.schema.json").read_text())
    enums: dict[str, list] = {}

    def walk(node, key=""):
        if isinstance(node, dict):
            if "enum" in node and key:
                enums.setdefault(key, node["enum"])
            for k, v in node.items():
                walk(v, k if k not in {"properties", "items"} else key)
        elif isinstance(node, list):
            for v in node:
                walk(v, key)

    walk(schema)
    assert enums["status"] == [s.value for s in Status]
    assert enums["category"] == list(CATEGORIES)
    assert enums["fail_level"] == list(FAIL_LEVELS)
    assert enums["profile"] == [*PROFILES, None]
