"""The two artifacts: the collection gpunode.node (galaxy.yml) and the wheel gpunode-hostcheck (pyproject.toml).

One version for both, the collections the roles use pinned and declared, and each artifact built and opened the
way a site gets it: without an index.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

import hostcheck

ROOT = Path(__file__).resolve().parents[1]
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())
SCHEMA = ROOT / "hostcheck" / "data" / "hostcheck-report.schema.json"


def test_one_version_for_collection_wheel_and_changelog():
    newest = re.search(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert newest, "CHANGELOG.md has no '## <version>' entry"
    assert GALAXY["version"] == hostcheck.__version__ == newest.group(1), (
        f"galaxy.yml {GALAXY['version']}, hostcheck/__init__.py {hostcheck.__version__}, "
        f"CHANGELOG.md {newest.group(1)}: bump them together"
    )
    base_vars = yaml.safe_load((ROOT / "roles" / "gpunode_base" / "vars" / "main.yml").read_text())
    assert base_vars["__gpunode_base_fact"]["roles_version"] == GALAXY["version"], (
        "gpunode.fact's roles_version"
    )
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and 'version = {attr = "hostcheck.__version__"}' in pyproject


def _shipped_collections() -> dict[str, str]:
    """name -> version of the collections the installed `ansible` package ships (their MANIFEST.json)."""
    ansible = pytest.importorskip("ansible")
    base = Path(ansible.__file__).resolve().parents[1] / "ansible_collections"
    if not base.is_dir():
        pytest.skip("the `ansible` package (with its collections) is not installed")
    out = {}
    for manifest in base.glob("*/*/MANIFEST.json"):
        info = json.loads(manifest.read_text())["collection_info"]
        out[f"{info['namespace']}.{info['name']}"] = info["version"]
    return out


def _used_collections() -> set[str]:
    """Collections named by a module, callback or connection in the roles, playbooks, molecule and ansible.cfg."""
    files = [ROOT / "ansible.cfg", *ROOT.glob("roles/**/*.yml"), *ROOT.glob("playbooks/**/*.yml")]
    files += [*ROOT.glob("molecule/**/*.yml"), *ROOT.glob("inventory/**/*.yml")]
    found = set()
    for f in files:
        found |= set(re.findall(r"\b(ansible\.posix|community\.\w+|containers\.\w+)\.\w+", f.read_text()))
    return found


def test_requirements_pin_what_the_ansible_package_ships_and_galaxy_declares():
    shipped = _shipped_collections()
    pins = {
        c["name"]: c["version"]
        for c in yaml.safe_load((ROOT / "requirements.yml").read_text())["collections"]
    }
    assert _used_collections() <= set(pins), f"used but not pinned: {_used_collections() - set(pins)}"
    assert {name: shipped.get(name) for name in pins} == pins, "requirements.yml must pin the versions tested"
    version_of = pytest.importorskip("packaging.version").Version

    # What the roles call at run time is declared; containers.podman is for tests and the demo only.
    runtime = {n for n in _used_collections() if not n.startswith("containers.")}
    assert set(GALAXY["dependencies"]) == runtime
    for name, spec in GALAXY["dependencies"].items():
        for clause in spec.split(","):
            op, version = re.match(r"\s*(>=|<)\s*(\S+)", clause).groups()
            ok = version_of(pins[name]) >= version_of(version)
            assert ok if op == ">=" else not ok, f"galaxy.yml {name} {spec} excludes the tested {pins[name]}"


def test_the_galaxy_ignore_list_keeps_the_checkout_symlink_out():
    assert (ROOT / "collections" / "ansible_collections" / "gpunode" / "node").resolve() == ROOT
    assert "collections" in GALAXY["build_ignore"], "the symlink back to the root would nest the collection"


def _filter_plugin(path: Path, name: str):
    """A filter plugin file loaded as Ansible loads it: by path, not from a package."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _exported_filters() -> dict[str, object]:
    """name -> function of every filter the FilterModules under plugins/filter export."""
    out = {}
    for path in sorted((ROOT / "plugins" / "filter").glob("*.py")):
        out.update(_filter_plugin(path, f"gpunode_filter_{path.stem}").FilterModule().filters())
    return out


def _ansible_doc(*args: str) -> subprocess.CompletedProcess:
    """ansible-doc with this checkout's ansible.cfg, whose collections_path finds gpunode.node through collections/."""
    doc = shutil.which("ansible-doc") or str(Path(sys.executable).with_name("ansible-doc"))
    if not Path(doc).exists():
        pytest.skip("ansible-doc is not installed")
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    return subprocess.run([doc, "-t", "filter", *args], cwd=ROOT, env=env, capture_output=True, text=True)


def test_every_filter_has_documentation_ansible_doc_renders():
    """One plugins/filter/<name>.yml per filter (the sidecar ansible-doc reads for a file of several filters), with
    the Python signature's arguments as its options, _input first."""
    import inspect

    filters = _exported_filters()
    assert filters, "no filters found under plugins/filter"
    sidecars = {p.stem for p in (ROOT / "plugins" / "filter").glob("*.yml")}
    assert sidecars == set(filters), (
        f"filters without plugins/filter/<name>.yml: {sorted(set(filters) - sidecars)}; "
        f"docs for no filter: {sorted(sidecars - set(filters))}"
    )

    listing = _ansible_doc("-l", "gpunode.node")
    assert listing.returncode == 0, listing.stderr
    assert "UNDOCUMENTED" not in listing.stdout, listing.stdout
    listed = {line.split()[0] for line in listing.stdout.splitlines() if line.strip()}
    assert listed == {f"gpunode.node.{name}" for name in filters}, listing.stdout

    names = [f"gpunode.node.{name}" for name in sorted(filters)]
    rendered = _ansible_doc("--json", *names)
    assert rendered.returncode == 0, rendered.stderr
    docs = json.loads(rendered.stdout)
    for fqcn in names:
        name = fqcn.rpartition(".")[2]
        assert fqcn in docs, f"ansible-doc has no documentation for {fqcn}: {rendered.stderr}"
        doc = docs[fqcn]["doc"]
        assert str(doc.get("short_description") or "").strip(), f"{fqcn} has no short_description"
        assert doc["name"] == name and doc["version_added"] == GALAXY["version"], fqcn
        assert Path(doc["filename"]).resolve() == ROOT / "plugins" / "filter" / f"{name}.yml", doc["filename"]
        assert docs[fqcn]["examples"] and docs[fqcn]["return"]["_value"]["type"], f"{fqcn}: EXAMPLES, RETURN"
        params = list(inspect.signature(filters[name]).parameters)
        assert set(doc["options"]) == {"_input", *params[1:]}, f"{fqcn}: options vs {params}"


@pytest.fixture(scope="module")
def collection(tmp_path_factory) -> Path:
    """The collection as ansible-galaxy builds it, unpacked."""
    galaxy = shutil.which("ansible-galaxy") or str(Path(sys.executable).with_name("ansible-galaxy"))
    if not Path(galaxy).exists():
        pytest.skip("ansible-galaxy is not installed")
    out = tmp_path_factory.mktemp("collection")
    subprocess.run(
        [galaxy, "collection", "build", "--output-path", str(out), str(ROOT)], check=True, capture_output=True
    )
    tarball = out / f"gpunode-node-{GALAXY['version']}.tar.gz"
    with tarfile.open(tarball) as tar:
        if sys.version_info >= (3, 12):
            tar.extractall(out / "node", filter="data")
        else:
            tar.extractall(out / "node")
    return out / "node"


def test_the_collection_carries_what_runs_and_nothing_of_the_tests(collection: Path):
    manifest = json.loads((collection / "MANIFEST.json").read_text())["collection_info"]
    assert (manifest["namespace"], manifest["name"], manifest["version"]) == (
        "gpunode",
        "node",
        hostcheck.__version__,
    )
    for needed in (
        "meta/runtime.yml",
        "playbooks/site.yml",
        "playbooks/hostcheck.yml",
        "plugins/filter/gpunode_platform.py",
        "plugins/filter/cuda_packages.py",
        "roles/gpunode_tuning/meta/argument_specs.yml",
        # The platform filter loads these by path; playbooks/hostcheck.yml can build the wheel from them.
        "hostcheck/platform.py",
        "hostcheck/data/platform.json",
        "pyproject.toml",
        "CHANGELOG.md",
    ):
        assert (collection / needed).is_file(), f"{needed} is missing from the collection"
    for doc in (ROOT / "plugins" / "filter").glob("*.yml"):  # the filters' ansible-doc documentation
        assert (collection / "plugins" / "filter" / doc.name).is_file(), (
            f"{doc.name} is missing from the collection"
        )
    for left_out in ("molecule", "collections", "scripts", ".venv", "reports", "ansible.cfg"):
        assert not (collection / left_out).exists(), f"{left_out} is in the collection"
    # Of tests/ only the ansible-test sanity ignore file ships, so that a consumer's sanity run sees its reasons.
    shipped = sorted(
        p.relative_to(collection).as_posix() for p in (collection / "tests").rglob("*") if p.is_file()
    )
    assert shipped == ["tests/sanity/ignore-2.19.txt"], shipped
    assert not list(collection.rglob("__pycache__"))


def test_the_collection_filter_finds_hostcheck_platform_inside_the_collection(collection: Path):
    mod = _filter_plugin(collection / "plugins/filter/gpunode_platform.py", "installed_filter")
    assert Path(mod._PATH).resolve() == (collection / "hostcheck" / "platform.py").resolve()
    assert "gpunode_node_plan" in mod.FilterModule().filters()


def _build_wheel(out: Path) -> Path:
    """pip wheel --no-build-isolation (setuptools from this venv), from a copy of the sources, without an index."""
    src = out / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "hostcheck", src / "hostcheck", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip_wheel, "-w", str(out / "dist"), str(src)], check=True, env=env)
    (wheel,) = (out / "dist").glob("gpunode_hostcheck-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


def test_the_wheel_builds_and_installs_without_an_index(tmp_path: Path, wheel: Path):
    """pip wheel --no-build-isolation (setuptools from this venv), pip install --no-index into an empty venv:
    the version and the packaged JSON Schema are the repository's."""
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    assert wheel.name.startswith(f"gpunode_hostcheck-{hostcheck.__version__}-py3-none-any")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [venv / "bin/python", "-m", "pip", "install", "-q", "--no-index", str(wheel)], check=True, env=env
    )
    out = subprocess.run(
        [venv / "bin/hostcheck", "--version"], check=True, capture_output=True, text=True, cwd=tmp_path
    )
    assert out.stdout.split() == ["hostcheck", GALAXY["version"]]
    read = (
        "import json, importlib.resources as r; "
        "print(json.dumps(json.loads((r.files('hostcheck') / 'data' / 'hostcheck-report.schema.json').read_text())))"
    )
    out = subprocess.run(
        [venv / "bin/python", "-c", read], check=True, capture_output=True, text=True, cwd=tmp_path
    )
    assert json.loads(out.stdout) == json.loads(SCHEMA.read_text())
    # Every data file ships: the installed package reads its SKU table and threshold defaults at import.
    data = {p.name for p in (ROOT / "hostcheck" / "data").glob("*.json")}
    shipped = {Path(n).name for n in zipfile.ZipFile(wheel).namelist() if n.startswith("hostcheck/data/")}
    assert {"gpu_skus.json", "thresholds.json", "xid.json", "platform.json"} <= data <= shipped
    used = (
        "from hostcheck.checks.workload import sku; from hostcheck.config import Thresholds; "
        "print(sku.lookup('NVIDIA H100 80GB HBM3').key, Thresholds().retired_pages_fail)"
    )
    out = subprocess.run(
        [venv / "bin/python", "-c", used], check=True, capture_output=True, text=True, cwd=tmp_path
    )
    assert out.stdout.split() == ["h100-sxm", "63"]


def test_galaxy_metadata_names_the_addresses_galaxys_importer_requires():
    for key in ("repository", "documentation", "homepage", "issues"):
        assert str(GALAXY.get(key) or "").startswith("https://"), f"galaxy.yml: {key}"


def test_the_sanity_ignore_file_matches_the_pinned_ansible_core_and_every_line_says_why():
    pin = re.search(r'"ansible-core==(\d+)\.(\d+)\.', (ROOT / "pyproject.toml").read_text())
    assert pin, "pyproject.toml pins no ansible-core"
    ignores = ROOT / "tests" / "sanity" / f"ignore-{pin.group(1)}.{pin.group(2)}.txt"
    assert [p.name for p in ignores.parent.iterdir()] == [ignores.name], (
        "one ignore file, for the pinned core"
    )
    for line in ignores.read_text().splitlines():
        entry, _, reason = line.partition("  # ")
        path, test = entry.split(" ")
        assert (ROOT / path).is_file() and test and len(reason.split()) >= 5, (
            f"needs a path, a test, a reason: {line}"
        )


# --- the oldest Python pyproject.toml claims --------------------------------------------------------------------
FLOOR = tuple(
    int(x)
    for x in re.search(r'requires-python = ">=(\d+)\.(\d+)"', (ROOT / "pyproject.toml").read_text()).groups()
)
#: Wheels the oldest Python needs beside hostcheck's (tomli), put there by scripts/test from PyPI.
OLDEST_WHEELS = Path(
    os.environ.get("GPUNODE_OLDEST_PYTHON_WHEELS")
    or Path(os.environ.get("GPUNODE_CACHE") or Path.home() / ".cache" / "gpunode") / "oldest-python-wheels"
)


def _oldest_python() -> str | None:
    """An interpreter of requires-python's floor: CPython X.Y where there is one; on Debian 12 (3.11 only) Debian's
    PyPy, which implements Python 3.9 (its language and standard library: what hostcheck uses)."""
    for name in (f"python{FLOOR[0]}.{FLOOR[1]}", "pypy3"):
        exe = shutil.which(name)
        if exe is None:
            continue
        version = subprocess.run(
            [exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True
        ).stdout.strip()
        if version == f"{FLOOR[0]}.{FLOOR[1]}":
            return exe
    return None


def test_the_wheel_runs_on_the_oldest_python_it_claims(tmp_path: Path, wheel: Path):
    """requires-python's floor (3.9, RHEL 9's system Python) runs the installed wheel: every module imports, the
    check runs and writes its JSON, the configuration file is read by tomli, which pip installs from the wheel's
    dependency marker without an index, and --list, baseline and fleet work. scripts/test installs the interpreter
    (Debian's pypy3) and the tomli wheel, and makes this test required (GPUNODE_NEED_OLDEST_PYTHON=1)."""
    exe = _oldest_python()
    tomli = sorted(OLDEST_WHEELS.glob("tomli-*.whl"))
    if exe is None or not tomli:
        missing = (
            f"no Python {FLOOR[0]}.{FLOOR[1]} (python{FLOOR[0]}.{FLOOR[1]} or pypy3)" if exe is None else ""
        )
        missing = missing or f"no tomli wheel in {OLDEST_WHEELS}"
        if os.environ.get("GPUNODE_NEED_OLDEST_PYTHON") == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    venv = tmp_path / "venv"
    subprocess.run([exe, "-m", "venv", str(venv)], check=True, capture_output=True)
    py, hc = str(venv / "bin" / "python"), str(venv / "bin" / "hostcheck")
    subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(OLDEST_WHEELS), str(wheel)],
        check=True,
        env=env,
    )

    def run(*argv: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
        out = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=240)
        assert out.returncode in ok and "Traceback" not in out.stderr, (
            argv,
            out.returncode,
            out.stderr[-2000:],
        )
        return out

    assert run(py, "-c", "import sys; print(sys.version_info[:2])").stdout.strip() == str(FLOOR)
    names = "import importlib, pkgutil, hostcheck; [importlib.import_module(m.name) for m in "
    names += "pkgutil.walk_packages(hostcheck.__path__, 'hostcheck.')]; import tomli; print(tomli.__name__)"
    assert run(py, "-c", names).stdout.strip() == "tomli"
    assert run(hc, "--version").stdout.split() == ["hostcheck", GALAXY["version"]]
    listed = json.loads(run(hc, "--list", "--json").stdout)
    assert len(listed["checks"]) > 50
    config = tmp_path / "hostcheck.toml"
    config.write_text('expect_gpus = 3\n\n[checks]\nonly = ["gpu.E002", "system"]\n')
    doc = json.loads(run(hc, "--config", str(config), "--json", ok=(0, 1)).stdout)
    e002 = next(c for c in doc["checks"] if c["id"] == "gpu.E002")
    assert e002["expected"] == 3 and {c["category"] for c in doc["checks"]} == {"gpu", "system"}
    config.write_text("expect_gpus = [\n")
    refused = run(hc, "--config", str(config), "--json", ok=(2,))
    assert "not valid TOML" in refused.stderr
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    (nodes / "node1.json").write_text(json.dumps(doc))
    run(hc, "fleet", str(nodes), "--out", str(tmp_path / "fleet"), ok=(0, 1))
    assert (tmp_path / "fleet" / "fleet.html").is_file()
    run(hc, "baseline", "--json", ok=(0, 1))
