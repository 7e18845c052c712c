"""Front-door and role-convention tests: they keep the README, CI and the roles honest."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ROLES = sorted(p for p in (ROOT / "roles").iterdir() if (p / "tasks").is_dir())


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


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_role_variables_are_prefixed_and_specified(role: Path):
    defaults_file = role / "defaults" / "main.yml"
    defaults = yaml.safe_load(defaults_file.read_text()) if defaults_file.exists() else {}
    defaults = defaults or {}
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]
    options = specs.get("options", {})
    shared = {"gpunode_venv_path", "gpunode_platform_overrides"}  # shared by design (docs/design.md)
    for name in defaults:
        assert name.startswith(role.name + "_") or name in shared, (
            f"{role.name}: {name} lacks the role prefix"
        )
        assert name in options, f"{role.name}: default {name} is missing from meta/argument_specs.yml"
    for name, opt in options.items():
        assert opt.get("description"), f"{role.name}: {name} has no description"
        assert opt.get("type"), f"{role.name}: {name} has no type"


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
