"""The shape of the hostcheck package: no import cycles, one direction for every arrow, modules a reader can hold.

Every ``import`` counts, at the top of a file or inside a function: a cycle through a lazy import is still a
cycle a maintainer must keep in their head.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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


def test_the_registry_is_a_leaf_and_nothing_outside_imports_the_inside_code():
    g = graph()
    assert g["hostcheck.registry"] == set(), "the checks import the registry, never the reverse"
    inside = {m for m in g if m.startswith("hostcheck.inside")}
    offenders = {m: g[m] & inside for m in g if m not in inside and g[m] & inside}
    assert offenders == {}, "hostcheck/inside runs in the training Python, started by path: import it nowhere"


@pytest.mark.parametrize("name", sorted(modules()))
def test_modules_stay_small_or_say_why(name):
    path = modules()[name]
    lines = path.read_text().splitlines()
    if len(lines) > MAX_LINES:
        doc = ast.get_docstring(ast.parse("\n".join(lines))) or ""
        assert "Why one module:" in doc, f"{path}: {len(lines)} lines and no 'Why one module:' at its top"
