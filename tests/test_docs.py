"""The docs are true, by test: every shell example in README.md and docs/ runs here or says why it cannot (a marker
this test reads), every TOML example is read by the real configuration loader, every repository path the docs name
exists, docs/samples/ is what the code renders, and the one table of profiles is hostcheck/profiles.py's.

Markers, on the line above a ```sh fence:

- ``<!-- shell: run -->``: every command runs, in document order, in a copy of the checkout as a fresh clone after
  scripts/bootstrap (its ``.venv`` is this one), ``python`` a Python without torch (a fresh node's), ``hostcheck``
  this checkout's, no package index; ``run site``: in an empty folder beside it (the site's Ansible repository),
  with the clone's ``dist/``. Paths under /etc and /var are moved into the sandbox. ``<version>`` is the version;
- ``gpu`` (needs a GPU), ``cluster`` (real nodes: an inventory, Slurm), ``machine`` (root, podman and Debian's
  archive; minutes): not run here; each hostcheck command line still goes through hostcheck's own parser, and each
  script and playbook it names exists;
- ``covered TEST_FILE (why)``: runs without a GPU but is slow; the named test runs it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import hostcheck
from hostcheck import config

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
KINDS = ("run", "gpu", "cluster", "machine", "covered")
MARKER = re.compile(r"^<!-- shell: (?P<kind>\w+)(?: (?P<args>.*?))? -->$")
FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int
    lang: str
    body: str
    kind: str  # "" when unmarked
    args: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    def commands(self) -> list[str]:
        """The block's commands: continuation lines joined, comment lines left out, <version> filled in."""
        text = self.body.replace("\\\n", " ").replace("<version>", hostcheck.__version__)
        return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def blocks(lang: str | None = None) -> list[Block]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            if lang is not None and m.group("lang") != lang:
                continue
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
            marker = MARKER.match(before)
            out.append(
                Block(
                    doc=doc,
                    line=text[: m.start()].count("\n") + 1,
                    lang=m.group("lang"),
                    body=m.group("body"),
                    kind=marker.group("kind") if marker else "",
                    args=(marker.group("args") or "") if marker else "",
                )
            )
    return out


SHELL = blocks("sh")


def test_every_shell_example_says_whether_it_runs_here():
    assert SHELL, "no shell examples found: the test reads nothing"
    bad = [f"{b.where}: no <!-- shell: KIND --> marker above it" for b in SHELL if not b.kind]
    bad += [
        f"{b.where}: unknown kind {b.kind!r} (one of {KINDS})"
        for b in SHELL
        if b.kind and b.kind not in KINDS
    ]
    for b in SHELL:
        if b.kind == "covered":
            test = b.args.split(" ", 1)[0]
            if not (test.startswith("tests/") and (ROOT / test).is_file()):
                bad.append(f"{b.where}: 'covered' names no test file of this repository: {b.args!r}")
        if b.kind == "run" and b.args not in ("", "site"):
            bad.append(f"{b.where}: 'run' takes nothing or 'site', not {b.args!r}")
    assert bad == [], "\n".join(bad)


def _hostcheck_argv(command: str) -> list[str] | None:
    """The arguments of a hostcheck command line (``hostcheck ...`` or ``python -m hostcheck ...``), else None."""
    words = shlex.split(command, comments=True)
    words = [w for w in words if not re.fullmatch(r"\[.*\]|\[.*|.*\]", w)]  # [optional] parts of a synopsis
    if words and (words[0] == "hostcheck" or words[0].endswith("/bin/hostcheck")):
        return words[1:]
    for i, w in enumerate(words[:-1]):
        if w == "-m" and words[i + 1] == "hostcheck":
            return words[i + 2 :]
    return None


def test_examples_that_do_not_run_here_still_parse_and_name_what_exists():
    """gpu, cluster, machine and covered examples: hostcheck's own parser takes every hostcheck line, and every
    script and playbook of this repository they name exists."""
    from hostcheck.command import UsageError, parse

    bad = []
    for b in SHELL:
        if b.kind == "run":
            continue
        for cmd in b.commands():
            argv = _hostcheck_argv(cmd)
            if argv is not None:
                try:
                    parse(argv)
                except UsageError as exc:
                    bad.append(f"{b.where}: {cmd!r}: {exc}")
            for word in shlex.split(cmd, comments=True):
                path = word.removeprefix("./")
                if re.match(r"(scripts|playbooks)/[\w.-]+$", path) and not (ROOT / path).is_file():
                    bad.append(f"{b.where}: {cmd!r} names {path}, which does not exist")
                fqcn = re.fullmatch(r"gpunode\.node\.(\w+)", word)
                if fqcn and not any(
                    (ROOT / d / fqcn.group(1)).exists() or (ROOT / d / f"{fqcn.group(1)}.yml").exists()
                    for d in ("playbooks", "roles")
                ):
                    bad.append(f"{b.where}: {cmd!r} names {word}, which the collection does not have")
    assert bad == [], "\n".join(bad)


# --- the runnable examples, run ----------------------------------------------------------------------------------
#: Where an example writes a system path, the sandbox's copy of it.
SYSTEM_PATHS = re.compile(r"(?<![\w/.])(/(?:etc|var)/[\w./-]+)")


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A fresh clone after scripts/bootstrap (a copy of the tracked files, this .venv), a site folder beside it,
    and the environment a user's shell would have there (no package index)."""
    base = tmp_path_factory.mktemp("docs")
    clone, site, bin_dir, home = base / "clone", base / "site", base / "bin", base / "home"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        src, dst = ROOT / name, clone / name
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the work tree, not yet committed
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, dst)
    (clone / ".venv").symlink_to(Path(sys.prefix))
    (clone / "dist").mkdir()
    site.mkdir()
    (site / "dist").symlink_to(clone / "dist")
    bin_dir.mkdir()
    home.mkdir()
    # A node's Python: the interpreter the tooling venv was made from, without the venv's torch and tools.
    base_python = shutil.which("python3", path=str(Path(sys.base_prefix) / "bin")) or "/usr/bin/python3"
    (bin_dir / "python").symlink_to(base_python)
    wrapper = bin_dir / "hostcheck"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={clone} exec {base_python} -m hostcheck "$@"\n')
    wrapper.chmod(0o755)
    env = {
        "PATH": os.pathsep.join(
            [str(bin_dir), str(Path(sys.prefix) / "bin"), "/usr/sbin", "/usr/bin", "/bin"]
        ),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "NO_COLOR": "1",
        "COLUMNS": "100",
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "ANSIBLE_LOCAL_TEMP": str(home / "ansible-tmp"),
        "ANSIBLE_NOCOLOR": "1",
    }
    return {"clone": clone, "site": site, "root": base / "root", "env": env}


def _run(sandbox, cwd: Path, command: str) -> subprocess.CompletedProcess:
    def move(m: re.Match) -> str:
        moved = sandbox["root"] / m.group(1).lstrip("/")
        moved.parent.mkdir(parents=True, exist_ok=True)
        return str(moved)

    line = SYSTEM_PATHS.sub(move, command)
    return subprocess.run(
        ["bash", "-c", f"set -eo pipefail; {line}"],
        cwd=cwd,
        env=sandbox["env"],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_runnable_examples_run(sandbox):
    """Each distinct command of the ``run`` examples, in the order the docs give them (README first): exit 0, or 1
    for a hostcheck verdict (the node is not ready: no GPU here), and never a traceback."""
    done: set[tuple[str, str]] = set()
    ran = 0
    for b in SHELL:
        if b.kind != "run":
            continue
        cwd = sandbox["site"] if b.args == "site" else sandbox["clone"]
        for cmd in b.commands():
            key = (str(cwd), re.sub(r"\s+", " ", shlex.join(shlex.split(cmd, comments=True))))
            if key in done:
                continue
            done.add(key)
            out = _run(sandbox, cwd, cmd)
            verdict = _hostcheck_argv(cmd) is not None
            ok = out.returncode == 0 or (verdict and out.returncode == 1)
            assert ok and "Traceback" not in out.stderr, (
                f"{b.where}: {cmd!r} exited {out.returncode}\n{out.stdout[-1500:]}\n{out.stderr[-3000:]}"
            )
            ran += 1
    assert ran >= 10, ran
    version = hostcheck.__version__
    assert (sandbox["clone"] / "dist" / f"gpunode-node-{version}.tar.gz").is_file()
    assert (sandbox["clone"] / "dist" / f"gpunode_hostcheck-{version}-py3-none-any.whl").is_file()
    assert (sandbox["root"] / "var/lib/prometheus/node-exporter/hostcheck.prom").is_file()


# --- TOML, paths, samples, profiles ------------------------------------------------------------------------------


def test_every_toml_example_is_read_by_the_configuration_loader(tmp_path):
    examples = blocks("toml")
    assert len(examples) >= 2
    for i, b in enumerate(examples):
        path = tmp_path / f"example{i}.toml"
        path.write_text(b.body)
        try:
            config.load(str(path), explicit=True)
        except config.ConfigError as exc:
            pytest.fail(f"{b.where}: the configuration loader refuses this example: {exc}")


#: Paths relative to a role (each role has them), as the docs write them after naming the role.
ROLE_RELATIVE = ("meta/", "tasks/", "defaults/", "vars/", "templates/", "handlers/")
PATH = re.compile(
    r"(?<![\w./-])((?:hostcheck|tests|roles|scripts|docs|molecule|playbooks|benchmarks|inventory|plugins|meta)"
    r"/[\w./*-]*[\w*])"
)
LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)")


def _anchors(doc: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    heads = re.findall(r"^#+ (.+)$", FENCE.sub("", doc.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_every_repository_path_the_docs_name_exists():
    """Outside the shell examples (their paths are the user's own or tested above): every path into this
    repository, and every relative link with its heading."""
    docs = [*DOCS, *sorted(ROOT.glob("roles/*/README.md"))]
    bad = []
    for doc in docs:
        text = FENCE.sub("", doc.read_text())
        for m in PATH.finditer(text):
            path = m.group(1).split("::")[0]
            if path.startswith(ROLE_RELATIVE) and list(ROOT.glob(f"roles/*/{path}")):
                continue
            if not (list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()):
                bad.append(f"{doc.relative_to(ROOT)}: {path}")
        for m in LINK.finditer(text):
            target, anchor = m.group(1), m.group(2)
            if re.match(r"[a-z]+:", target):
                continue
            path = doc.parent / target if target else doc
            if not path.exists():
                bad.append(f"{doc.relative_to(ROOT)}: link {target}")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                bad.append(f"{doc.relative_to(ROOT)}: link {target}#{anchor}: no such heading")
    assert bad == [], "paths the docs name that do not exist:\n" + "\n".join(sorted(set(bad)))


def test_the_samples_are_what_the_code_renders():
    """docs/samples/'s check reports, rendered again from the scenarios (tests/unit/fixtures/samples.py): a check
    added, renamed or reworded, or a report key changed, fails here until `scripts/samples` rewrites them."""
    sys.path.insert(0, str(ROOT / "tests" / "unit" / "fixtures"))
    try:
        import samples
    finally:
        sys.path.pop(0)
    from hostcheck.checks import all_checks
    from hostcheck.profiles import DEFAULT_PROFILE, PROFILES

    fresh = samples.samples()
    stale = [name for name, text in fresh.items() if (ROOT / "docs" / "samples" / name).read_text() != text]
    assert stale == [], (
        f"docs/samples/{', '.join(stale)} differ from what the code renders: run scripts/samples"
    )
    for name, profile in (("report.json", DEFAULT_PROFILE), ("h100-report.json", "full")):
        doc = json.loads((ROOT / "docs" / "samples" / name).read_text())
        registry = [c.id for c in all_checks() if PROFILES[profile].allows(c.needs)]
        assert [c["id"] for c in doc["checks"]] == registry, name
        assert doc["profile"] == profile and {"gpus", "ports", "profile"} <= set(doc), name
    h100 = json.loads((ROOT / "docs" / "samples" / "h100-report.json").read_text())
    workload = [c for c in h100["checks"] if c["category"] == "workload"]
    assert workload and sum(c["status"] == "pass" for c in workload) >= 12


def _profile_tables() -> dict[Path, dict[str, list[str]]]:
    """Every table whose rows start with a profile's name: doc -> name -> the other cells."""
    from hostcheck.profiles import PROFILES

    tables: dict[Path, dict[str, list[str]]] = {}
    for doc in DOCS:
        for line in doc.read_text().splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
            m = re.fullmatch(r"`(\w+)`", cells[0]) if cells else None
            if m and m.group(1) in PROFILES:
                tables.setdefault(doc, {})[m.group(1)] = cells[1:]
    return tables


def test_the_profile_tables_are_the_codes():
    """docs/hostcheck.md holds the table of profiles (dcgm.md the DCGM level of each): the names in the code's order,
    each deadline and DCGM level, and in hostcheck.md whether the training Python is probed, whether the GPU
    workload runs and the burn-in; the default is the code's."""
    from hostcheck.profiles import DEFAULT_PROFILE, PROFILES

    tables = _profile_tables()
    assert set(tables) == {ROOT / "docs" / "hostcheck.md", ROOT / "docs" / "dcgm.md"}, sorted(tables)
    for doc, rows in tables.items():
        assert list(rows) == list(PROFILES), (doc.name, list(rows), list(PROFILES))
        for name, p in PROFILES.items():
            deadline, what = rows[name][0], " ".join(rows[name][1:2])
            assert deadline == f"{p.deadline_s:g} s", (doc.name, name, deadline)
            level = re.search(r"dcgmi diag -r (\d)", what)
            assert (int(level.group(1)) if level else 0) == p.dcgm_level, (doc.name, name, what)
            if doc.name != "hostcheck.md":
                continue
            assert ("torch probe" in what or "every check" in what or "full" in what) == (
                "torch" in p.needs
            ), name
            assert ("workload" in what or "full" in what) == ("workload" in p.needs), (name, what)
            burn = re.search(r"(\d+) s matmul stress", what)
            assert (float(burn.group(1)) if burn else 0.0) == p.burn_s, (name, what)
    assert f"a run takes `{DEFAULT_PROFILE}`" in (ROOT / "docs" / "hostcheck.md").read_text()


def test_the_textfile_path_is_the_roles():
    """The Prometheus textfile the docs show is the one the role's timer writes (node_exporter's textfile folder
    of Debian's prometheus-node-exporter)."""
    defaults = yaml.safe_load((ROOT / "roles" / "gpunode_health" / "defaults" / "main.yml").read_text())
    want = defaults["gpunode_health_textfile_dir"] + "/hostcheck.prom"
    for doc in DOCS:
        for path in re.findall(r"(/var/lib/[\w/.-]*node[_-]exporter[\w/.-]*\.prom)", doc.read_text()):
            assert path == want, f"{doc.relative_to(ROOT)}: {path}, the role writes {want}"
