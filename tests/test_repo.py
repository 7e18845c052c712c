"""Front-door and role-convention tests: they keep the README, CI and the roles honest."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ROLES = sorted(p for p in (ROOT / "roles").iterdir() if (p / "meta" / "main.yml").is_file())
# The role with no tasks that defines the gpunode-wide variables (no role prefix) for the others.
COMMON = "gpunode_common"


def quickstart_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(?:sh|bash|console)?\n(.*?)```", section, re.S)
    return [
        line.strip() for b in blocks for line in b.splitlines() if line.strip() and not line.startswith("#")
    ]


def test_readme_quickstart_has_exactly_two_commands_that_exist():
    cmds = quickstart_commands()
    assert len(cmds) == 2, cmds
    for cmd in cmds:
        script = ROOT / cmd.split()[0]
        assert script.is_file() and script.stat().st_mode & 0o111, f"{cmd}: not an executable in the repo"


def test_ci_runs_the_readme_test_command():
    test_cmd = next(c for c in quickstart_commands() if "test" in c)
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(rf"^(exec )?{re.escape(test_cmd)}\s*$", ci, re.M), (
        "CI must run the README's test command"
    )


def _demo(tmp_path: Path, *args: str, answer: str | None = None):
    """scripts/demo with its venv and cache in tmp_path; stdin /dev/null, or a terminal that types answer."""
    import os
    import subprocess

    env = {**os.environ, "GPUNODE_VENV": str(tmp_path / "venv"), "GPUNODE_CACHE": str(tmp_path / "cache")}
    cmd = [str(ROOT / "scripts" / "demo"), *args]
    if answer is None:
        return subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=60
        )
    leader, follower = os.openpty()
    try:
        os.write(leader, answer.encode() + b"\n")
        return subprocess.run(cmd, stdin=follower, capture_output=True, text=True, env=env, timeout=60)
    finally:
        os.close(leader)
        os.close(follower)


def test_the_demo_says_what_it_will_change_and_asks_first(tmp_path: Path):
    """Without --yes and without a terminal it refuses with the way on; on a terminal, 'n' stops it. Both before
    any change: the tooling venv it names is not created."""
    run = _demo(tmp_path)
    assert run.returncode == 2, run.stderr
    assert "stdin is not a terminal" in run.stderr and "scripts/demo --yes" in run.stderr
    plan = run.stdout
    assert plan.startswith("scripts/demo will, on this machine")
    for needle in (f"create the tooling venv {tmp_path / 'venv'}", "gpunode-demo", "playbooks/site.yml"):
        assert needle in plan, plan
    run = _demo(tmp_path, answer="n")
    assert run.returncode == 1 and "nothing was changed" in run.stdout, run.stdout + run.stderr
    assert "Go on? [y/N]" in run.stdout
    assert not (tmp_path / "venv").exists() and not (tmp_path / "cache").exists()
    assert "--yes" in (ROOT / "scripts" / "demo").read_text().split("set -euo", 1)[0]


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_role_variables_are_prefixed_and_specified(role: Path):
    defaults_file = role / "defaults" / "main.yml"
    defaults = yaml.safe_load(defaults_file.read_text()) if defaults_file.exists() else {}
    defaults = defaults or {}
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]
    options = specs.get("options", {})
    # gpunode_common's variables are gpunode-wide by design (docs/design.md): gpunode_ without a role prefix.
    prefix = "gpunode_" if role.name == COMMON else role.name + "_"
    for name in defaults:
        assert name.startswith(prefix), f"{role.name}: {name} lacks the prefix {prefix}"
        assert name in options, f"{role.name}: default {name} is missing from meta/argument_specs.yml"
    for name, opt in options.items():
        assert opt.get("description"), f"{role.name}: {name} has no description"
        assert opt.get("type"), f"{role.name}: {name} has no type"


def _role_readmes():
    """scripts/role-readmes as a module (the one generator of the role READMEs)."""
    path = str(ROOT / "scripts" / "role-readmes")
    loader = importlib.machinery.SourceFileLoader("role_readmes", path)
    spec = importlib.util.spec_from_loader("role_readmes", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_every_role_readme_is_generated_from_its_argument_specs():
    gen = _role_readmes()
    assert [r.name for r in gen.roles()] == [r.name for r in ROLES]
    assert gen.stale() == [], "stale role READMEs: run scripts/role-readmes"
    for role in ROLES:
        text = (role / "README.md").read_text()
        options = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]
        for name in options.get("options", {}):
            assert f"| `{name}` |" in text, f"{role.name}: {name} is not in its README"


def test_a_changed_argument_spec_makes_its_readme_stale(tmp_path: Path):
    gen = _role_readmes()
    role = tmp_path / "gpunode_tuning"
    shutil.copytree(ROOT / "roles" / "gpunode_tuning" / "meta", role / "meta")
    (role / "README.md").write_text(gen.render(role))
    assert gen.stale([role]) == []
    spec = role / "meta" / "argument_specs.yml"
    spec.write_text(spec.read_text().replace('default: "50%"', 'default: "40%"', 1))
    assert gen.stale([role]) == [role / "README.md"]
    (role / "README.md").unlink()
    assert gen.stale([role]) == [role / "README.md"]


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_role_tasks_use_fqcn_and_named_tasks(role: Path):
    builtin_short = {
        "command",
        "shell",
        "copy",
        "template",
        "file",
        "apt",
        "dnf",
        "service",
        "systemd",
        "assert",
    }
    for f in (role / "tasks").glob("*.yml"):
        for task in yaml.safe_load(f.read_text()) or []:
            assert task.get("name"), f"{f}: a task has no name"
            assert task["name"][0].isupper(), f"{f}: '{task['name']}' is not capitalised"
            assert not builtin_short & set(task), f"{f}: '{task['name']}' uses a short module name"


def _role_yaml(role: Path, kind: str) -> dict:
    """Every variable a role's defaults/ or vars/ files set (values of all files, per-OS ones included)."""
    out: dict = {}
    for f in sorted((role / kind).glob("*.yml")):
        out.update(yaml.safe_load(f.read_text()) or {})
    return out


def _dependencies(role: Path) -> list[str]:
    deps = yaml.safe_load((role / "meta" / "main.yml").read_text()).get("dependencies") or []
    return [d["role"] if isinstance(d, dict) else d for d in deps]


def test_gpunode_wide_variables_are_defined_once_in_gpunode_common():
    common = ROOT / "roles" / COMMON
    shared = set(yaml.safe_load((common / "defaults" / "main.yml").read_text()))
    assert shared == {
        "gpunode_venv_path",
        "gpunode_platform_overrides",
        "gpunode_wheelhouse",
        "gpunode_wheelhouse_node_dir",
    }
    assert not (common / "tasks").exists(), f"{COMMON} holds defaults and their specification only"
    for role in ROLES:
        if role.name == COMMON:
            continue
        spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        options = {name for entry in spec.values() for name in entry.get("options", {})}
        defined = (set(_role_yaml(role, "defaults")) | set(_role_yaml(role, "vars")) | options) & shared
        assert not defined, f"{role.name} defines {sorted(defined)} again: they are {COMMON}'s"
        text = "\n".join(
            f.read_text()
            for f in role.rglob("*")
            if f.is_file() and f.suffix in {".yml", ".j2"} and f.relative_to(role).parts[0] != "meta"
        )
        read = {name for name in shared if re.search(rf"\b{name}\b", text)}
        if read:
            assert COMMON in _dependencies(role), (
                f"{role.name} reads {sorted(read)}: list {COMMON} in its meta/main.yml dependencies"
            )


# The container check: derived from these facts once, in gpunode_common's vars/main.yml.
CONTAINER_HOME = Path(COMMON) / "vars" / "main.yml"
CONTAINER_FACTS = re.compile(r"\bvirtualization_(type|role)\b")


def container_check_problems(roles_dir: Path) -> list[str]:
    """Every copy of the container check outside its home, and every reader of it without gpunode_common."""
    problems = []
    roles = sorted(p for p in roles_dir.iterdir() if (p / "meta" / "main.yml").is_file())
    for role in roles:
        text = ""
        for f in sorted(role.rglob("*")):
            if not f.is_file() or f.suffix not in {".yml", ".yaml", ".j2"}:
                continue
            body = f.read_text(errors="replace")
            rel = f.relative_to(roles_dir)
            if CONTAINER_FACTS.search(body) and rel != CONTAINER_HOME:
                problems.append(f"{rel}: a second container check (read gpunode_is_container instead)")
            if rel.parts[1] != "meta":
                text += body
        reads = role.name != COMMON and re.search(r"\bgpunode_is_container\b", text)
        if reads and COMMON not in _dependencies(role):
            problems.append(f"{role.name} reads gpunode_is_container: list {COMMON} in its dependencies")
    home = roles_dir / CONTAINER_HOME
    if not home.is_file() or "gpunode_is_container" not in (yaml.safe_load(home.read_text()) or {}):
        problems.append(f"{CONTAINER_HOME} does not define gpunode_is_container")
    return problems


def test_the_container_check_is_defined_once():
    assert container_check_problems(ROOT / "roles") == []


def test_a_second_container_check_is_refused(tmp_path: Path):
    roles = tmp_path / "roles"
    shutil.copytree(ROOT / "roles", roles)
    planted = roles / "gpunode_tuning" / "vars" / "main.yml"
    planted.write_text(
        planted.read_text()
        + "__gpunode_tuning_in_container: \"{{ ansible_facts['virtualization_type'] == 'podman' }}\"\n"
    )
    meta = roles / "gpunode_driver" / "meta" / "main.yml"
    meta.write_text(re.sub(r"dependencies:\n(  - .*\n)+", "dependencies: []\n", meta.read_text()))
    assert sorted(container_check_problems(roles)) == [
        f"gpunode_driver reads gpunode_is_container: list {COMMON} in its dependencies",
        "gpunode_tuning/vars/main.yml: a second container check (read gpunode_is_container instead)",
    ]


# The connections a reboot must not be sent through: one list, in gpunode_common's vars/main.yml.
CONNECTION_LIST = re.compile(r"ansible_connection[^\n]*\bin\s*\[")


def connection_list_copies(root: Path) -> list[str]:
    """Every list of connection names outside gpunode_common's vars/main.yml, in roles and playbooks."""
    home = root / "roles" / CONTAINER_HOME
    found = []
    for top in ("roles", "playbooks"):
        for f in sorted((root / top).rglob("*.yml")):
            if f != home and CONNECTION_LIST.search(f.read_text(errors="replace")):
                found.append(str(f.relative_to(root)))
    return found


def test_the_connections_that_never_reboot_are_listed_once(tmp_path: Path):
    assert connection_list_copies(ROOT) == []
    assert "gpunode_connection_reboots" in (
        yaml.safe_load((ROOT / "roles" / CONTAINER_HOME).read_text()) or {}
    )
    # A second list, planted, is found.
    for top in ("roles", "playbooks"):
        shutil.copytree(ROOT / top, tmp_path / top)
    planted = tmp_path / "playbooks" / "tasks" / "reboot_node.yml"
    planted.write_text(planted.read_text() + "# when: ansible_connection not in ['local']\n")
    assert connection_list_copies(tmp_path) == ["playbooks/tasks/reboot_node.yml"]


# --- one owner per file ---------------------------------------------------------------------------------
# Modules that write a file on the node: the parameter that names it (aliases first to last) and the file written
# when the parameter is left out. A file module run is a write unless it makes a directory.
WRITERS: dict[str, tuple[tuple[str, ...], str | None]] = {
    "copy": (("dest",), None),
    "template": (("dest",), None),
    "lineinfile": (("path", "dest", "destfile", "name"), None),
    "blockinfile": (("path", "dest", "destfile", "name"), None),
    "replace": (("path", "dest", "destfile", "name"), None),
    "ini_file": (("path", "dest"), None),
    "get_url": (("dest",), None),
    "assemble": (("dest",), None),
    "file": (("path", "dest", "name"), None),
    "mount": (("fstab",), "/etc/fstab"),
    "sysctl": (("sysctl_file",), "/etc/sysctl.conf"),
    "pam_limits": (("dest",), "/etc/security/limits.conf"),
    "apt_key": (("keyring",), "/etc/apt/trusted.gpg"),
    "dnf_versionlock": ((), "/etc/dnf/plugins/versionlock.list"),
}
COLLECTIONS = {"", "ansible.builtin", "ansible.legacy", "ansible.posix", "community.general"}
# Writing package sources (repositories, signing keys) is gpunode_base's alone.
SOURCE_PATHS = (
    "/etc/apt/sources.list",
    "/etc/apt/keyrings/",
    "/usr/share/keyrings/",
    "/etc/apt/trusted.gpg",
    "/etc/yum.repos.d/",
    "/etc/pki/rpm-gpg/",
)
SOURCE_MODULES = {"apt_repository", "deb822_repository", "yum_repository", "apt_key", "rpm_key"}
SOURCE_MODULES |= {"dnf_config_manager", "rhsm_repository"}
SOURCE_COMMANDS = re.compile(
    r"apt-key|add-apt-repository|config-manager|gpg\s+--dearmor|" + "|".join(map(re.escape, SOURCE_PATHS))
)


def _module(task: dict) -> tuple[str, object]:
    """The task's module (short name, when it is one of the known collections) and its arguments."""
    for key, args in task.items():
        collection, _, short = key.rpartition(".")
        if collection in COLLECTIONS and (short in WRITERS or short in SOURCE_MODULES):
            return short, args
        if collection in COLLECTIONS and short in {"command", "shell", "script", "raw"}:
            return short, args
    return "", None


def _tasks(items: list | None, scope: dict) -> list[tuple[dict, dict]]:
    """Every task of a task list, blocks opened, with the variables its blocks and itself set."""
    out = []
    for task in items or []:
        inner = {**scope, **(task.get("vars") or {})}
        if any(k in task for k in ("block", "rescue", "always")):
            for key in ("block", "rescue", "always"):
                out += _tasks(task.get(key), inner)
        else:
            out.append((task, inner))
    return out


def _expand(text: str, variables: dict[str, list[str]]) -> list[str]:
    """text with each bare {{ name }} replaced by the name's string values; other Jinja is left as written."""
    text = re.sub(r"\{\{\s*(.*?)\s*\}\}", lambda m: "{{ " + re.sub(r"\s+", " ", m.group(1)) + " }}", text)
    todo, done = [text], []
    for _ in range(50):
        if not todo:
            break
        current = todo.pop()
        m = next((m for m in re.finditer(r"\{\{ (\w+) \}\}", current) if m.group(1) in variables), None)
        if m is None:
            done.append(current)
            continue
        todo += [current[: m.start()] + value + current[m.end() :] for value in variables[m.group(1)]]
    return done + todo


def written_paths() -> dict[str, set[str]]:
    """Every file any role's tasks or handlers write, with the roles that write it."""
    owners: dict[str, set[str]] = {}
    for role in ROLES:
        known: dict[str, list[str]] = {}
        common = _role_yaml(ROOT / "roles" / COMMON, "defaults")
        for name, value in {**common, **_role_yaml(role, "vars"), **_role_yaml(role, "defaults")}.items():
            if isinstance(value, str):
                known.setdefault(name, []).append(value)
        for f in sorted(role.glob("tasks/*.yml")) + sorted(role.glob("handlers/*.yml")):
            for task, scope in _tasks(yaml.safe_load(f.read_text()), {}):
                module, args = _module(task)
                if module not in WRITERS or not isinstance(args, dict):
                    continue
                if module == "file" and args.get("state", "file") not in {"touch", "absent", "link", "hard"}:
                    continue  # a directory, or the attributes of a file written elsewhere
                params, implicit = WRITERS[module]
                path = next((args[p] for p in params if p in args), implicit)
                if not isinstance(path, str):
                    continue
                local = {k: [v] for k, v in scope.items() if isinstance(v, str)}
                loop_var = (task.get("loop_control") or {}).get("loop_var", "item")
                loop = task.get("loop", task.get("with_items"))
                if isinstance(loop, list) and all(isinstance(i, str) for i in loop):
                    local[loop_var] = loop
                for resolved in map(" ".join, map(str.split, _expand(path, {**known, **local}))):
                    if re.search(rf"\b{loop_var}\b", resolved):
                        continue  # a loop over values only the run knows
                    owners.setdefault(resolved, set()).add(role.name)
    return owners


def test_every_file_a_role_writes_has_one_owner():
    owners = written_paths()
    assert "/etc/gpunode/training.env" in owners and "/etc/ansible/facts.d/gpunode_driver.fact" in owners
    shared = {path: sorted(roles) for path, roles in owners.items() if len(roles) > 1}
    assert shared == {}, f"files written by more than one role: {shared}"


def test_only_gpunode_base_writes_package_sources():
    bad = [
        f"{path} ({', '.join(sorted(roles))})"
        for path, roles in written_paths().items()
        if path.startswith(SOURCE_PATHS) and roles != {"gpunode_base"}
    ]
    for role in ROLES:
        if role.name == "gpunode_base":
            continue
        for f in sorted(role.glob("tasks/*.yml")) + sorted(role.glob("handlers/*.yml")):
            for task, _ in _tasks(yaml.safe_load(f.read_text()), {}):
                module, args = _module(task)
                if module in SOURCE_MODULES or (
                    module in {"command", "shell", "script", "raw"} and SOURCE_COMMANDS.search(str(args))
                ):
                    bad.append(f"{f.relative_to(ROOT)}: {task.get('name')}")
    assert bad == [], "package sources written outside gpunode_base:\n" + "\n".join(bad)


# --- public names only across roles and playbooks -----------------------------------------------------------
def _outside_files() -> list[Path]:
    dirs = ("roles", "playbooks", "inventory", "molecule", "scripts")
    suffixes = {".yml", ".yaml", ".j2", ".py", ".sh", ""}
    return sorted(
        p
        for d in dirs
        for p in (ROOT / d).rglob("*")
        if p.is_file() and p.suffix in suffixes and "__pycache__" not in p.parts
    )


def test_no_file_outside_a_role_reads_its_internals():
    """`__<role>_*` names are the role's own: roles and playbooks read each other's public facts only.

    A molecule scenario may set one as a test seam (a planted PCI tree, a fake EFI variable), never read one.
    """
    names = [r.name for r in ROLES]
    bad = []
    for path in _outside_files():
        rel = path.relative_to(ROOT)
        owner = rel.parts[1] if rel.parts[0] == "roles" and len(rel.parts) > 2 else None
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for role in names:
                if role == owner or f"__{role}_" not in line:
                    continue
                key = re.match(rf"\s*__{role}_\w+:(\s.*|)$", line)
                seam = rel.parts[0] == "molecule" and key and f"__{role}_" not in key.group(1)
                if not seam:
                    bad.append(f"{rel}:{n}: {line.strip()}")
    assert bad == [], "another role's internals read:\n" + "\n".join(bad)


# --- per-OS variables: one way to load them ------------------------------------------------------------------
def _per_os_task(role: str) -> dict:
    return {
        "name": "Load per-OS variables",
        "ansible.builtin.include_vars": f"{{{{ lookup('ansible.builtin.first_found', __{role}_vars_files) }}}}",
        "vars": {
            f"__{role}_vars_files": {
                "files": [
                    "{{ ansible_facts['distribution'] }}_{{ ansible_facts['distribution_version'] }}.yml",
                    "{{ ansible_facts['distribution'] }}_{{ ansible_facts['distribution_major_version'] }}.yml",
                    "{{ ansible_facts['distribution'] }}.yml",
                    "{{ ansible_facts['os_family'] }}.yml",
                    "default.yml",
                ],
                "paths": ["{{ role_path }}/vars"],
            }
        },
    }


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_per_os_variables_are_loaded_one_way(role: Path):
    per_os = sorted(f.name for f in (role / "vars").glob("*.yml") if f.name != "main.yml")
    loaders = [
        (f.name, task)
        for f in sorted(role.glob("tasks/*.yml"))
        for task, _ in _tasks(yaml.safe_load(f.read_text()), {})
        if any(k.rpartition(".")[2] in {"include_vars", "first_found"} for k in task)
        or "first_found" in str(task)
    ]
    if not per_os:
        assert loaders == [], f"{role.name} has only vars/main.yml (loaded by Ansible itself): {loaders}"
        return
    assert "default.yml" in per_os, f"{role.name}: vars/default.yml is the last candidate and must exist"
    assert loaders == [("validate.yml", _per_os_task(role.name))], (
        f"{role.name} must load its per-OS variables with tasks/validate.yml's 'Load per-OS variables' "
        "(first_found over Distro_Version, Distro_Major, Distro, os_family, default.yml)"
    )


# A reader that stops early (awk's exit, head, grep -q/-m) kills the writer with SIGPIPE; under pipefail that is
# rc 141, but only when the writer had more to say: a flaky failure (ldconfig -p | awk '...; exit}' failed CI).
EARLY_EXIT = re.compile(r"\|\s*(awk\b.*\bexit\s*\}|head\b|grep\s+-[a-zA-Z]*[qm])")


def _shell_sources() -> list[Path]:
    globs = ("roles/**/*.yml", "roles/**/*.j2", "roles/**/*.sh", "molecule/**/*.yml", "molecule/**/*.sh")
    globs += ("playbooks/*.yml", "scripts/*")
    return sorted({p for g in globs for p in ROOT.glob(g) if p.is_file()})


def test_no_early_exit_reader_under_pipefail():
    bad = []
    for path in _shell_sources():
        text = path.read_text(errors="replace")
        if "pipefail" not in text:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if EARLY_EXIT.search(line) and not line.lstrip().startswith("#"):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert bad == [], "readers that exit early under pipefail:\n" + "\n".join(bad)


def _specified_variables() -> set[str]:
    names: set[str] = set()
    for role in ROLES:
        spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
        for entry in spec["argument_specs"].values():
            names |= set(entry.get("options", {}))
    return names


def test_example_inventory_names_only_real_variables():
    """Every gpunode_* variable the example inventory shows (commented or not) is one a role reads."""
    known = _specified_variables() | {
        # site.yml's fleet controls (documented in its header), not role variables.
        "gpunode_serial",
        "gpunode_max_fail_percentage",
        "gpunode_reboot_serial",
        "gpunode_scheduler_host",
        "gpunode_drain_command",
        "gpunode_drain_wait_command",
        "gpunode_resume_command",
        "gpunode_reboot_timeout",
    }
    for path in sorted((ROOT / "inventory").rglob("*.yml")):
        for name in re.findall(r"^#?\s*(gpunode_\w+):", path.read_text(), re.M):
            assert name in known, f"{path.relative_to(ROOT)} names {name}, which no role or playbook reads"


def test_the_repo_cites_facts_not_notes_outside_it_or_issue_numbers():
    """Code and docs carry the fact and its public source: no pointer to files beside the checkout, no issue ids."""
    import subprocess

    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    # "../shared/" is the checkout's own molecule/shared when what follows is one of its entries, or the corpus of
    # real tools' output that replay tests read in place (tests/unit/fixtures/real_outputs.py).
    ours = "|".join(re.escape(entry.name) for entry in (ROOT / "molecule" / "shared").iterdir())
    outside = re.compile(
        rf"NOTES\.md|FIELD\.md|STYLE\.md|/work/shared|\.\./shared/(?!(?:{ours}|real-outputs)\b)"
    )
    issue = re.compile(r"\b[Ii]ssues? #?\d+\b|\(#\d+\)")
    this = Path(__file__).resolve()
    bad = []
    for name in files:
        path = ROOT / name
        if path == this or path.suffix in {".png", ".tar", ".gz", ".whl"} or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        bad += [
            f"{name}:{n}: {line.strip()[:100]}"
            for n, line in enumerate(text.splitlines(), 1)
            if outside.search(line) or issue.search(line)
        ]
    assert bad == [], "\n".join(bad)


def _task_tags(node: object) -> set[str]:
    """Every tag written on a task, block or include anywhere under ``node`` (a parsed tasks file)."""
    found: set[str] = set()
    if isinstance(node, dict):
        tags = node.get("tags")
        if isinstance(tags, str):
            found.add(tags)
        elif isinstance(tags, list):
            found.update(str(t) for t in tags)
        for value in node.values():
            found |= _task_tags(value)
    elif isinstance(node, list):
        for item in node:
            found |= _task_tags(item)
    return found


def _site_role_include_tasks() -> list[dict]:
    """site.yml's provisioning play's include_role tasks, in order."""
    plays = yaml.safe_load((ROOT / "playbooks" / "site.yml").read_text())
    provision = next(p for p in plays if p["name"] == "Provision GPU nodes")
    return [t for t in provision["tasks"] if "ansible.builtin.include_role" in t]


def _site_role_includes() -> dict[str, set[str]]:
    return {
        t["ansible.builtin.include_role"]["name"]: set(t.get("tags", [])) for t in _site_role_include_tasks()
    }


def test_site_includes_each_role_with_every_tag_its_tasks_carry():
    # A dynamic include runs only when one of its own tags is selected: `--tags rdma` reaches the driver's RDMA tasks
    # only if the include carries `rdma` too. Without this, a tag silently selects nothing.
    includes = _site_role_includes()
    roles = {r.name for r in ROLES if (r / "tasks" / "main.yml").is_file()}
    assert set(includes) == roles, (
        f"site.yml's provisioning play includes {sorted(includes)}, the roles are {sorted(roles)}"
    )
    for role, tags in includes.items():
        inner = set()
        for f in (ROOT / "roles" / role / "tasks").glob("*.yml"):
            inner |= _task_tags(yaml.safe_load(f.read_text()))
        missing = inner - tags - {"always"}
        assert not missing, f"site.yml's include of {role} lacks the tags {sorted(missing)} its tasks carry"


def test_every_tag_a_hostcheck_fix_names_selects_a_role():
    from hostcheck import fixes

    named = set(re.findall(r"--tags ([a-z_]+)", (ROOT / "hostcheck" / "fixes.py").read_text()))
    named |= set(
        re.findall(
            r'(?:role_fix|rerun)\([^)]*,\s*"([a-z_]+)"\)',
            (ROOT / "hostcheck").joinpath("fixes.py").read_text(),
        )
    )
    assert fixes.PLAYBOOK == "playbooks/site.yml"
    reachable = set().union(*_site_role_includes().values())
    assert named and named <= reachable, (
        f"fixes name tags no role include carries: {sorted(named - reachable)}"
    )


# Every tag that fires a dynamic include also selects tasks inside it. An include's own tags select the include, not the tasks it loads: those inherit only the tags of what encloses
# the include (blocks, static imports, an enclosing include's ``apply``) and the include's own ``apply``
# (https://docs.ansible.com/ansible/latest/porting_guides/porting_guide_2.5.html#dynamic-includes-and-attribute-inheritance,
# and include_tasks' ``apply`` parameter). So ``--tags sources`` could fire base's sources include and run none of
# its tasks, and a fix that says "re-run site.yml --tags X" would change nothing. The rule is modelled here, checked
# against the pinned ansible-core on a small playbook, then applied to site.yml's roles.
ANSIBLE = Path(sys.executable).with_name("ansible-playbook")
INCLUDES = ("ansible.builtin.include_tasks", "include_tasks")
IMPORTS = ("ansible.builtin.import_tasks", "import_tasks")


def _tags(node: dict) -> set[str]:
    v = node.get("tags") or []
    return {v} if isinstance(v, str) else {str(t) for t in v}


def _files(tasks_dir: Path, spec: str | dict) -> list[Path]:
    """The files an include or import can name (a templated name: every file it can match)."""
    name = spec if isinstance(spec, str) else spec["file"]
    if "{{" in name:
        return sorted(tasks_dir.glob(re.sub(r"\{\{.*?\}\}", "*", name)))
    return [tasks_dir / name]


def _walk(tasks_dir: Path, tasks: list, inherited: set[str], found: list[str], where: str) -> list[set[str]]:
    """The effective tags of every task in ``tasks``; appends to ``found`` each include that a tag fires while
    none of the tasks inside carries it."""
    effective: list[set[str]] = []
    for t in tasks or []:
        if not isinstance(t, dict):
            continue
        mine = _tags(t) | inherited
        if "block" in t:
            for part in ("block", "rescue", "always"):
                effective += _walk(tasks_dir, t.get(part), mine, found, where)
            continue
        imp = next((k for k in IMPORTS if k in t), None)
        inc = next((k for k in INCLUDES if k in t), None)
        if imp:
            for f in _files(tasks_dir, t[imp]):
                effective += _walk(
                    tasks_dir, yaml.safe_load(f.read_text()), mine, found, f"{where} > {f.name}"
                )
        elif inc:
            spec = t[inc]
            applied = _tags(spec.get("apply", {})) if isinstance(spec, dict) else set()
            effective.append(mine)
            for f in _files(tasks_dir, spec):
                inside = _walk(
                    tasks_dir,
                    yaml.safe_load(f.read_text()),
                    inherited | applied,
                    found,
                    f"{where} > {f.name}",
                )
                for tag in sorted(mine - inherited - applied - {"always", "never"}):
                    if inside and not any(tag in e or "always" in e for e in inside):
                        found.append(
                            f"{where} > {f.name}: --tags {tag} fires {t.get('name')!r} and selects none of its tasks"
                        )
                effective += inside
        else:
            effective.append(mine)
    return effective


def lost_tags(role_dir: Path, applied: set[str]) -> list[str]:
    found: list[str] = []
    tasks_dir = role_dir / "tasks"
    _walk(
        tasks_dir,
        yaml.safe_load((tasks_dir / "main.yml").read_text()),
        applied,
        found,
        f"{role_dir.name} main.yml",
    )
    return found


def test_every_tag_that_fires_an_include_selects_tasks_inside_it():
    lost = [
        m
        for t in _site_role_include_tasks()
        for m in lost_tags(
            ROOT / "roles" / t["ansible.builtin.include_role"]["name"],
            _tags(t["ansible.builtin.include_role"].get("apply", {})),
        )
    ]
    assert not lost, "\n".join(lost)


def test_an_include_without_apply_is_caught(tmp_path: Path):
    role = tmp_path / "r"
    (role / "tasks").mkdir(parents=True)
    (role / "tasks" / "main.yml").write_text(
        "- name: Add the sources\n  ansible.builtin.include_tasks: sources.yml\n  tags: [sources]\n"
        "- name: Add them, applied\n  ansible.builtin.include_tasks:\n    file: sources.yml\n"
        "    apply: {tags: [repo]}\n  tags: [repo]\n"
    )
    (role / "tasks" / "sources.yml").write_text("- name: Write a source\n  ansible.builtin.debug: {msg: x}\n")
    assert lost_tags(role, {"base"}) == [
        "r main.yml > sources.yml: --tags sources fires 'Add the sources' and selects none of its tasks"
    ]


# The rule above, as the pinned ansible-core runs it: a role included with apply, an include with tags only, an
# include with apply.
ROLE_MAIN = """
- name: Include by tag only
  ansible.builtin.include_tasks: inner.yml
  tags: [own]
- name: Include with apply
  ansible.builtin.include_tasks:
    file: inner_applied.yml
    apply: {tags: [applied]}
  tags: [applied]
"""
PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Include the role
      ansible.builtin.include_role:
        name: r
        apply: {tags: [outer]}
      tags: [outer, own, applied]
"""


@pytest.mark.skipif(not ANSIBLE.is_file(), reason="ansible-playbook is not beside this Python")
@pytest.mark.parametrize(
    ("tag", "ran"),
    [("own", []), ("applied", ["INNER_APPLIED"]), ("outer", ["INNER", "INNER_APPLIED"])],
)
def test_the_model_agrees_with_ansible(tmp_path: Path, tag: str, ran: list[str]):
    tasks = tmp_path / "roles" / "r" / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "main.yml").write_text(ROLE_MAIN)
    (tasks / "inner.yml").write_text("- name: Inner\n  ansible.builtin.debug: {msg: INNER}\n")
    (tasks / "inner_applied.yml").write_text(
        "- name: Inner applied\n  ansible.builtin.debug: {msg: INNER_APPLIED}\n"
    )
    (tmp_path / "play.yml").write_text(PLAY)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    args = [str(ANSIBLE), "-i", "localhost,", "-c", "local", "--tags", tag, "play.yml"]
    args += ["-e", f"ansible_python_interpreter={sys.executable}"]
    p = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert re.findall(r'"msg": "(INNER\w*)"', p.stdout) == ran
    # The model says the same: the tag-only include is caught, the applied one is not.
    found = lost_tags(tmp_path / "roles" / "r", {"outer"})
    assert [f for f in found if f"--tags {tag} " in f] == (
        ["r main.yml > inner.yml: --tags own fires 'Include by tag only' and selects none of its tasks"]
        if tag == "own"
        else []
    )
