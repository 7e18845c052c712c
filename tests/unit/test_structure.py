"""The shape of the hostcheck package: no import cycles, one direction for every arrow, modules a reader can hold.

Every ``import`` counts, at the top of a file or inside a function: a cycle through a lazy import is still a
cycle a maintainer must keep in their head.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
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


#: The modules of hostcheck.inside the orchestrator may import: the pure proofs of what a bench worker reports,
#: which the worker runs too (fail fast) and the orchestrator runs on every record; and the sweep's schedule and
#: peer rule, which the sweep worker lays out its rounds and retests with and hostcheck sweep judges with.
SHARED_INSIDE = {"hostcheck.inside.proof", "hostcheck.inside.sweep_plan", "hostcheck.inside"}


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


# --- every subcommand a package of one shape ------------------------------------------------------------------
#: The shape of a subcommand NAME (hostcheck/command.py's SUBCOMMANDS):
#: - the package ``hostcheck/NAME/``;
#: - its parser and its run in ``NAME/cli.py``: SUMMARY (its line in ``hostcheck --help``), DESCRIPTION and EPILOG
#:   (its ``--help``), ``add_arguments(parser)`` and ``run(args) -> int`` (its exit code);
#: - its renderers in ``NAME/render.py`` or the package ``NAME/render/``: functions named ``render_*``. A module
#:   called ``render`` is a subcommand's renderers and nothing else.
#: hostcheck/command.py only dispatches: of the subcommands it imports their ``cli`` modules and nothing else, and
#: beside them only what every command shares (the version, the child-process registry it empties on a signal, the
#: exit codes, the file writer whose unfinished temporary files it removes).
CLI_NAMES = ("SUMMARY", "DESCRIPTION", "EPILOG")
CLI_FUNCTIONS = {"add_arguments": 1, "run": 1}
COMMAND_SHARES = {"hostcheck", "hostcheck.child.launch", "hostcheck.exitcodes", "hostcheck.outfile"}


def _top_level(path: Path) -> tuple[set[str], dict[str, int]]:
    """The names a module assigns at its top, and its functions with their number of positional parameters."""
    tree = ast.parse(path.read_text(), str(path))
    names = {
        t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
    }
    names |= {
        n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    functions = {n.name: len(n.args.args) for n in tree.body if isinstance(n, ast.FunctionDef)}
    return names, functions


def subcommand_shape_errors(root: Path, name: str) -> list[str]:
    """How the package ``root/name`` (root: the hostcheck folder) differs from the shape above."""
    package = root / name
    if not (package / "__init__.py").is_file():
        return [f"{name}: not a package (hostcheck/{name}/__init__.py)"]
    cli = package / "cli.py"
    if not cli.is_file():
        return [f"{name}: no cli.py (its parser and its run)"]
    errors = []
    names, functions = _top_level(cli)
    errors += [f"{name}/cli.py: no {n}" for n in CLI_NAMES if n not in names]
    for function, arity in CLI_FUNCTIONS.items():
        if functions.get(function) != arity:
            errors.append(f"{name}/cli.py: no {function}() of {arity} argument")
    render = (
        [package / "render.py"]
        if (package / "render.py").is_file()
        else sorted((package / "render").glob("*.py"))
    )
    if not any(f.startswith("render_") for path in render for f in _top_level(path)[1]):
        errors.append(f"{name}: no render_* function in {name}/render.py or {name}/render/")
    return errors


def render_modules_outside(root: Path, subcommands: set[str]) -> list[str]:
    """Modules or packages called ``render`` that are not a subcommand's renderers."""
    found = {p.relative_to(root) for p in root.rglob("render.py")} | {
        p.parent.relative_to(root) for p in root.rglob("render/__init__.py")
    }
    return sorted(str(p) for p in found if len(p.parts) != 2 or p.parts[0] not in subcommands)


def command_import_errors(source: str, subcommands: set[str]) -> list[str]:
    """What command.py imports besides the subcommands' cli modules and what every command shares."""
    errors = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported = [
                f"{node.module}.{a.name}"
                if node.module in {f"hostcheck.{s}" for s in subcommands}
                else node.module
                for a in node.names
            ]
        else:
            continue
        for mod in imported:
            if not mod.startswith("hostcheck"):
                continue
            if mod in COMMAND_SHARES or mod in {f"hostcheck.{s}.cli" for s in subcommands}:
                continue
            errors.append(f"command.py:{node.lineno}: imports {mod}")
    return errors


def class_name_homes(mods: dict[str, Path]) -> dict[str, list[str]]:
    """Every class name defined at the top of more than one module, with those modules."""
    homes: dict[str, list[str]] = {}
    for name, path in mods.items():
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef):
                homes.setdefault(node.name, []).append(name)
    return {c: where for c, where in homes.items() if len(where) > 1}


def test_every_subcommand_is_a_package_of_one_shape():
    from hostcheck.command import SUBCOMMANDS, load

    assert {name: load(name).__name__ for name in SUBCOMMANDS} == {
        n: f"hostcheck.{n}.cli" for n in SUBCOMMANDS
    }
    assert [e for name in SUBCOMMANDS for e in subcommand_shape_errors(PKG, name)] == []
    assert render_modules_outside(PKG, set(SUBCOMMANDS)) == []


def test_the_command_line_imports_only_the_subcommands_entry_points():
    from hostcheck.command import SUBCOMMANDS

    assert command_import_errors((PKG / "command.py").read_text(), set(SUBCOMMANDS)) == []


def test_no_two_classes_share_a_name():
    assert class_name_homes(modules()) == {}


def test_a_subcommand_of_another_shape_is_refused(tmp_path):
    good_cli = "SUMMARY = DESCRIPTION = EPILOG = ''\ndef add_arguments(p): pass\ndef run(args): return 0\n"
    for name in ("good", "nocli", "norun", "norender", "badrender"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / "good" / "cli.py").write_text(good_cli)
    (tmp_path / "good" / "render").mkdir()
    (tmp_path / "good" / "render" / "__init__.py").write_text("")
    (tmp_path / "good" / "render" / "text.py").write_text("def render_text(r): return ''\n")
    (tmp_path / "norun" / "cli.py").write_text("SUMMARY = DESCRIPTION = ''\ndef add_arguments(p): pass\n")
    (tmp_path / "norun" / "render.py").write_text("def render_text(r): return ''\n")
    (tmp_path / "norender" / "cli.py").write_text(good_cli)
    (tmp_path / "badrender" / "cli.py").write_text(good_cli)
    (tmp_path / "badrender" / "render.py").write_text("def text(r): return ''\n")
    (tmp_path / "flat.py").write_text(good_cli)  # a subcommand as one module at the top: the old fleet.py
    (tmp_path / "gather").mkdir()
    (tmp_path / "gather" / "render.py").write_text("def render_x(): pass\n")
    assert subcommand_shape_errors(tmp_path, "good") == []
    assert subcommand_shape_errors(tmp_path, "flat") == ["flat: not a package (hostcheck/flat/__init__.py)"]
    assert subcommand_shape_errors(tmp_path, "nocli") == ["nocli: no cli.py (its parser and its run)"]
    assert subcommand_shape_errors(tmp_path, "norun") == [
        "norun/cli.py: no EPILOG",
        "norun/cli.py: no run() of 1 argument",
    ]
    assert subcommand_shape_errors(tmp_path, "norender") == [
        "norender: no render_* function in norender/render.py or norender/render/"
    ]
    assert subcommand_shape_errors(tmp_path, "badrender")[0].startswith("badrender: no render_* function")
    assert render_modules_outside(tmp_path, {"good", "badrender", "norun"}) == ["gather/render.py"]


def test_a_command_line_that_reaches_into_a_subcommand_is_refused():
    planted = (
        "from hostcheck import __version__\n"
        "from hostcheck.child.launch import kill_all\n"
        "from hostcheck.bench import cli as bench_cli\n"
        "from hostcheck.check import cli, request\n"
        "from hostcheck.core import evaluate\n"
        "import hostcheck.fleet.reports\n"
    )
    assert command_import_errors(planted, {"bench", "check", "fleet"}) == [
        "command.py:4: imports hostcheck.check.request",
        "command.py:5: imports hostcheck.core",
        "command.py:6: imports hostcheck.fleet.reports",
    ]


def test_a_second_class_of_one_name_is_refused(tmp_path):
    (tmp_path / "score.py").write_text("class Verdict:\n    pass\n")
    (tmp_path / "diagnosis.py").write_text("class Verdict:\n    pass\nclass Diagnosis:\n    pass\n")
    mods = {"hostcheck.score": tmp_path / "score.py", "hostcheck.job.diagnosis": tmp_path / "diagnosis.py"}
    assert class_name_homes(mods) == {"Verdict": ["hostcheck.score", "hostcheck.job.diagnosis"]}


# --- one definition for every exit code --------------------------------------------------------------------
EXIT_HOME = "hostcheck.exitcodes"


def exit_code_copies(name: str, source: str) -> list[str]:
    """Every name ``EXIT_*`` bound to a value in module ``name`` outside hostcheck/exitcodes.py (importing one
    is fine: that is how a subcommand uses them)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name) and n.id.startswith("EXIT_") and name != EXIT_HOME:
                        found.append(f"{name}:{node.lineno}: {n.id} defines an exit code (use {EXIT_HOME}'s)")
    return found


def test_exit_codes_are_defined_once():
    found = [f for name, path in modules().items() for f in exit_code_copies(name, path.read_text())]
    assert found == []


def test_a_second_exit_code_definition_is_refused():
    planted = (
        "from hostcheck.exitcodes import EXIT_USAGE\nEXIT_OK, EXIT_USAGE = 0, 2\nEXIT_NOT_FOUND: int = 127\n"
    )
    assert exit_code_copies("hostcheck.fleet", planted) == [
        "hostcheck.fleet:2: EXIT_OK defines an exit code (use hostcheck.exitcodes's)",
        "hostcheck.fleet:2: EXIT_USAGE defines an exit code (use hostcheck.exitcodes's)",
        "hostcheck.fleet:3: EXIT_NOT_FOUND defines an exit code (use hostcheck.exitcodes's)",
    ]
    assert exit_code_copies(EXIT_HOME, "EXIT_OK = 0\n") == []


# --- no threshold as a literal in the judging code -------------------------------------------------------------
#: Where judgements are made: every threshold there is a row of hostcheck/data/thresholds.json or
#: job_thresholds.json, read through hostcheck/thresholds.py, never a number in the code.
JUDGING = ("hostcheck.checks", "hostcheck.job.diagnosis")
#: The rule: a number other than 0 and 1 inside a comparison, or an upper-case module constant bound to a number
#: (or to arithmetic of numbers and names, or to a dict of them). Each exception below is named with why: the key
#: is (module, the function or constant it sits in, the number; None for a constant).
NOT_THRESHOLDS = {
    ("hostcheck.checks.system", "python_version", 3): "Python 3.9, requires-python: a version, not a line",
    ("hostcheck.checks.system", "python_version", 9): "Python 3.9, requires-python: a version, not a line",
    ("hostcheck.checks.tuning", "_human", 1024): "the step between KiB, MiB and GiB: a unit",
    (
        "hostcheck.checks.workload.grading",
        "PCIE_GBS_PER_LANE",
        None,
    ): "the PCIe specifications' transfer rates",
    ("hostcheck.checks.workload.grading", "busbw_status", 2): "a collective needs two GPUs: a count",
    ("hostcheck.checks.workload.grading", "loss_numerics", 2): "a trend needs two losses: a count",
    ("hostcheck.checks.fabric_plan", "gpu_names", 8): "a PCI domain is at most 8 hex digits: a format",
    (
        "hostcheck.checks.fabric_plan",
        "LISTED",
        None,
    ): "ports named one by one in a message, the rest counted: a layout",
    ("hostcheck.checks.fabric_nccl", "_short", 60): "a long value cut for a message: a layout",
    (
        "hostcheck.checks.nvlink",
        "NAMED",
        None,
    ): "links named one by one in a message, the rest counted: a layout",
    (
        "hostcheck.checks.workload.paths",
        "gdr_write",
        400.0,
    ): "the NDR port rate that Azure's 380 Gb/s line belongs to: which line applies, not a line",
    ("hostcheck.checks.workload.peers", "peer_ratios", 2): "a peer comparison needs two GPUs: a count",
    ("hostcheck.checks.workload.sku", "_allreduce", 2): "an all_reduce line needs two GPUs: a count",
    ("hostcheck.checks.workload.training", "busbw", 2): "a collective needs two ranks: a count",
    ("hostcheck.job.diagnosis", "_gib", 30): "1 << 30: a unit (GiB)",
}


def _numbers(node: ast.AST) -> list[int | float]:
    return [
        n.value
        for n in ast.walk(node)
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool)
    ]


def _numeric_expr(node: ast.AST) -> bool:
    """A number, or arithmetic of numbers and names (``1 * GiB``, ``64 << 20``), with at least one number."""
    simple = (ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Load, ast.operator, ast.unaryop)
    return all(isinstance(n, simple) for n in ast.walk(node)) and bool(_numbers(node))


def threshold_literals(name: str, source: str) -> list[tuple[str, str, int | float | None]]:
    """(module, scope, number) of every number the rule above finds in ``source``."""
    tree = ast.parse(source)
    found: list[tuple[str, str, int | float | None]] = []
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            upper = [t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()]
            values = list(node.value.values) if isinstance(node.value, ast.Dict) else [node.value]
            if upper and any(v is not None and _numeric_expr(v) for v in values):
                found.append((name, upper[0], None))

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else scope
            if isinstance(child, ast.Compare):
                found.extend((name, inner, v) for v in _numbers(child) if v not in (0, 1))
            visit(child, inner)

    visit(tree, "<module>")
    return found


def test_no_threshold_is_a_literal_in_the_checks_or_the_job_verdict():
    found = [
        f
        for name, path in modules().items()
        if name.startswith(JUDGING)
        for f in threshold_literals(name, path.read_text())
    ]
    unexplained = sorted({f for f in found if f not in NOT_THRESHOLDS}, key=str)
    assert unexplained == [], (
        "make each a row of hostcheck/data/thresholds.json (or name it in NOT_THRESHOLDS)"
    )
    stale = sorted(set(NOT_THRESHOLDS) - set(found), key=str)
    assert stale == [], "these exceptions no longer occur: remove them from NOT_THRESHOLDS"


def test_a_planted_threshold_literal_is_caught():
    planted = (
        "PASS_FRACTION = 0.90\n"
        "SHM = 1 * GiB\n"
        "RATES = {1: 2.5, 2: 5.0}\n"
        "NAME = 'x'\n"
        "def amp(speedup, th):\n"
        "    if speedup < 1:\n"  # 1 and 0 are no thresholds
        "        return 'fail'\n"
        "    if speedup < 1.3 or speedup < th.amp_speedup_warn:\n"
        "        return 'warn'\n"
        "    return 'pass' if speedup >= 0.95 * th.x else 'warn'\n"
    )
    assert threshold_literals("hostcheck.checks.x", planted) == [
        ("hostcheck.checks.x", "PASS_FRACTION", None),
        ("hostcheck.checks.x", "SHM", None),
        ("hostcheck.checks.x", "RATES", None),
        ("hostcheck.checks.x", "amp", 1.3),
        ("hostcheck.checks.x", "amp", 0.95),
    ]
    clean = "def amp(speedup, th):\n    return speedup < th.amp_speedup_warn\n"
    assert threshold_literals("hostcheck.checks.x", clean) == []


# --- long functions say why ---------------------------------------------------------------------------------
MAX_FUNCTION_LINES = 100


def long_functions(name: str, source: str) -> list[str]:
    """Every function of more than MAX_FUNCTION_LINES lines (def to its last line) without a ``# long:``
    comment, on its def line, the line above it or inside it, saying why."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            span = node.end_lineno - node.lineno + 1
            text = lines[max(0, first - 2) : node.end_lineno]
            if span > MAX_FUNCTION_LINES and not any("# long:" in t for t in text):
                found.append(f"{name}:{node.lineno}: {node.name} is {span} lines and says no '# long:' why")
    return found


def test_no_function_over_100_lines_without_saying_why():
    found = [f for name, path in modules().items() for f in long_functions(name, path.read_text())]
    assert found == []


def test_a_planted_long_function_is_caught():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    planted = "def big():\n" + body
    assert long_functions("hostcheck.x", planted) == [
        f"hostcheck.x:1: big is {MAX_FUNCTION_LINES + 1} lines and says no '# long:' why"
    ]
    said = "# long: one table of options, read top to bottom\ndef big():\n" + body
    assert long_functions("hostcheck.x", said) == []
    short = "def small():\n" + body.splitlines(keepends=True)[0] * (MAX_FUNCTION_LINES - 1)
    assert long_functions("hostcheck.x", short) == []


# --- section names: one definition on each side of the inside/ boundary, and the two agree --------------------
SECTION_HOME = "hostcheck.profiles"


def section_lists(name: str, source: str, sections: frozenset[str]) -> list[str]:
    """Every tuple, list or set literal of two or more workload section names outside SECTION_HOME (a dict keyed
    by sections, as profiles' per-section arguments, is data about them, not a second list)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            strings = _literal_strings(node)
            if strings and len(set(strings)) >= 2 and set(strings) <= sections and name != SECTION_HOME:
                found.append(
                    f"{name}:{node.lineno}: a second section list {tuple(strings)} (use {SECTION_HOME}'s)"
                )
    return found


def _inside_section_tables() -> dict[str, set[str]]:
    """The keys of every ``SECTIONS = {...}`` under hostcheck/inside (read, never imported: it runs in the training
    Python)."""
    out = {}
    for name, path in modules().items():
        if name.startswith("hostcheck.inside"):
            for node in ast.parse(path.read_text()).body:
                targets = node.targets if isinstance(node, ast.Assign) else []
                if any(isinstance(t, ast.Name) and t.id == "SECTIONS" for t in targets):
                    out[name] = set(_literal_strings(node.value) or ())
    return out


def test_section_names_are_defined_once_and_the_inside_probe_table_agrees():
    from hostcheck.profiles import DEFAULT_SECTIONS, LAUNCHED

    sections = frozenset(DEFAULT_SECTIONS)
    outside = {n: p for n, p in modules().items() if not n.startswith("hostcheck.inside")}
    assert [f for n, p in outside.items() for f in section_lists(n, p.read_text(), sections)] == []
    tables = _inside_section_tables()
    # The sections launched from the orchestrator (NCCL through the NICs, perftest) are not the suite's.
    assert tables and all(keys == set(sections) - set(LAUNCHED) for keys in tables.values()), tables


def test_a_second_section_list_is_refused():
    sections = frozenset(("env", "matmul", "ddp"))
    planted = "ALL = ('env', 'matmul', 'ddp')\nARGS = {'ddp': {}, 'matmul': {}}\nONE = ('env',)\n"
    assert section_lists("hostcheck.cli", planted, sections) == [
        "hostcheck.cli:1: a second section list ('env', 'matmul', 'ddp') (use hostcheck.profiles's)"
    ]
    assert section_lists(SECTION_HOME, planted, sections) == []


# --- the checks judge typed facts, never the workload's raw records ---------------------------------------------
#: The modules that read the suite's raw records: the gatherer (it plans its launches from the suite's progress)
#: and hostcheck.gather.suite, which reads them once into the typed facts the checks and the report use.
RAW_READERS = ("hostcheck.gather.workload", "hostcheck.gather.suite")
#: What reads a raw record: these readers' functions, and any ``.records`` (a ProbeRun's parsed JSON lines).
RAW_NAMES = frozenset({"section", "suite_section", "suite_run_for", "started"})


def raw_record_reads(source: str) -> list[str]:
    """Each raw read in ``source``: an import of a raw reader (RAW_NAMES from RAW_READERS), a call of one through
    its module, or an access to ``.records``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module in RAW_READERS:
            found += [f"{node.lineno}: imports {a.name}" for a in node.names if a.name in RAW_NAMES]
        elif isinstance(node, ast.Attribute) and node.attr == "records":
            found.append(f"{node.lineno}: .records")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in RAW_NAMES
        ):
            found.append(f"{node.lineno}: calls {node.func.attr}")
    return sorted(found, key=lambda f: int(f.split(":")[0]))


def test_the_checks_and_the_report_read_no_raw_workload_record():
    judged = {
        n: p for n, p in modules().items() if n.startswith("hostcheck.checks") or n == "hostcheck.report"
    }
    assert {"hostcheck.checks.workload.compute", "hostcheck.checks.workload.training"} <= set(judged)
    reads = {n: raw_record_reads(p.read_text()) for n, p in judged.items()}
    offenders = {n: r for n, r in reads.items() if r}
    assert offenders == {}, (
        "judge the typed facts of hostcheck.gather.suite (WorkloadRun.matmul, .devices...)"
    )


def test_a_planted_raw_record_read_is_caught():
    planted = (
        "from hostcheck.gather.workload import WorkloadRun, suite_section\n"
        "from hostcheck.gather import suite as api\n"
        "def burn(run):\n"
        "    rec = run.burn.records[-1]\n"
        "    data, err = api.section(run.suite, 'matmul')\n"
        "    return rec, data\n"
    )
    assert raw_record_reads(planted) == ["1: imports suite_section", "4: .records", "5: calls section"]
    clean = (
        "from hostcheck.gather.workload import WorkloadRun\n"
        "def burn(run, section):\n"
        "    return run.burn_result, run.matmul.rows, section\n"
    )
    assert raw_record_reads(clean) == []


#: The subcommands besides check: ``hostcheck --profile passive``, Slurm's HealthCheckProgram every few minutes on
#: every node, loads none of them (hostcheck/command.py imports only the command a line names).
OTHER_SUBCOMMANDS = ("bench", "fleet", "job", "baseline")


def reachable(g: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others (lazy imports count)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += g.get(m, ())
    return seen


def of_subcommands(
    names: set[str] | list[str], subcommands: tuple[str, ...] = OTHER_SUBCOMMANDS
) -> list[str]:
    """The modules among ``names`` that belong to one of ``subcommands``' packages."""
    return sorted(n for n in names if n.split(".")[:2] in [["hostcheck", s] for s in subcommands])


def importtime_modules(stderr: str) -> list[str]:
    """The modules ``python -X importtime`` says it imported (``import time: self | cumulative | name``)."""
    rows = [
        ln[len("import time:") :].split("|") for ln in stderr.splitlines() if ln.startswith("import time:")
    ]
    return [r[2].strip() for r in rows if len(r) == 3 and r[0].strip().isdigit()]


def test_check_reaches_no_other_subcommand_even_through_a_lazy_import():
    assert of_subcommands(reachable(graph(), "hostcheck.check.cli")) == []
    assert of_subcommands(reachable(graph(), "hostcheck.command")) == []


def test_a_passive_run_imports_no_other_subcommand(tmp_path):
    p = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "hostcheck", "--profile", "passive", "--summary"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(PKG.parent)},
        timeout=120,
    )
    assert p.returncode in (0, 1), p.stderr[-2000:]
    imported = importtime_modules(p.stderr)
    assert (
        "hostcheck.check.cli" in imported and "hostcheck.gather.nvml" in imported
    )  # the walker reads the list
    assert of_subcommands(imported) == []
    # Nor the check modules or gatherers of what the profile never runs: the GPU workload, the dataset reads, the
    # torch probe (hostcheck.checks.MODULES; the gatherers' modules by name).
    assert passive_needless(imported) == []
    # Only the renderer of the form asked for, and Slurm's module only with --slurm-drain.
    assert [m for m in imported if m.startswith("hostcheck.check.render.")] == [
        "hostcheck.check.render.summary"
    ]
    assert "hostcheck.slurm" not in imported and "xml.etree.ElementTree" not in imported


#: The gatherers' modules the passive profile never starts (what it does start: PROFILES["passive"].needs).
NOT_PASSIVE_GATHERERS = (
    "hostcheck.gather.workload",
    "hostcheck.gather.suite",
    "hostcheck.gather.gdr_write",
    "hostcheck.gather.datapath",
    "hostcheck.gather.torchinfo",
)


def passive_needless(imported: list[str]) -> list[str]:
    """The modules of ``imported`` that a passive run has no use for: check modules whose checks all read a
    gatherer the profile does not start, those gatherers' modules, and what runs inside the training Python."""
    from hostcheck.checks import MODULES

    needs = PROFILES["passive"].needs
    needless = {m for m, reads in MODULES.items() if not reads <= needs} | set(NOT_PASSIVE_GATHERERS)
    return [m for m in imported if m in needless or m.startswith("hostcheck.inside")]


def test_an_imported_subcommand_is_caught():
    stderr = (
        "import time: self [us] | cumulative | imported package\n"
        "import time:       120 |        120 |   hostcheck.check.cli\n"
        "import time:      2873 |      10345 |       hostcheck.job.observe\n"
        "import time:        40 |         40 |     hostcheck.checks.baseline\n"
    )
    assert importtime_modules(stderr) == [
        "hostcheck.check.cli",
        "hostcheck.job.observe",
        "hostcheck.checks.baseline",
    ]
    assert of_subcommands(importtime_modules(stderr)) == ["hostcheck.job.observe"]
    assert passive_needless(
        [
            "hostcheck.checks.gpu",
            "hostcheck.checks.workload.compute",
            "hostcheck.gather.suite",
            "hostcheck.inside",
        ]
    ) == ["hostcheck.checks.workload.compute", "hostcheck.gather.suite", "hostcheck.inside"]
    g = {"hostcheck.check.cli": {"hostcheck.core"}, "hostcheck.core": {"hostcheck.bench.plan"}}
    assert of_subcommands(reachable(g, "hostcheck.check.cli")) == ["hostcheck.bench.plan"]
