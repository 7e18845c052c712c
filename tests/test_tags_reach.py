"""Every tag that fires a dynamic include also selects tasks inside it.

An include's own tags select the include, not the tasks it loads: those inherit only the tags of what encloses
the include (blocks, static imports, an enclosing include's ``apply``) and the include's own ``apply``
(https://docs.ansible.com/ansible/latest/porting_guides/porting_guide_2.5.html#dynamic-includes-and-attribute-inheritance,
and include_tasks' ``apply`` parameter). So ``--tags sources`` could fire base's sources include and run none of
its tasks, and a fix that says "re-run site.yml --tags X" would change nothing. The rule is modelled here, checked
against the pinned ansible-core on a small playbook, then applied to site.yml's roles."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
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


def _site_roles() -> list[tuple[str, set[str]]]:
    plays = yaml.safe_load((ROOT / "playbooks" / "site.yml").read_text())
    provision = next(p for p in plays if p["name"] == "Provision GPU nodes")
    out = []
    for t in provision["tasks"]:
        inc = t.get("ansible.builtin.include_role")
        if inc:
            out.append((inc["name"], _tags(inc.get("apply", {}))))
    return out


def test_every_tag_that_fires_an_include_selects_tasks_inside_it():
    roles = _site_roles()
    assert len(roles) >= 7
    lost = [m for name, applied in roles for m in lost_tags(ROOT / "roles" / name, applied)]
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
