"""A role's settings check, run for real by ansible-playbook on local hosts: site.yml's check play marks a role's
settings checked so the provisioning play skips the second check, but a role included on its own (a molecule
verify, a user's playbook) checks its settings every time it is included, whatever vars the include passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ANSIBLE = Path(sys.executable).with_name("ansible-playbook")

pytestmark = pytest.mark.skipif(not ANSIBLE.is_file(), reason="ansible-playbook is not beside this Python")

# Two local hosts in one run: "alone" includes the role as a user's playbook does, "site" as site.yml's check play.
PLAY = """
- hosts: all
  gather_facts: true
  tasks:
    - name: Check good settings
      ansible.builtin.include_role: {name: gpunode_tuning, tasks_from: validate}
      vars: {__gpunode_checked_by_site: "{{ inventory_hostname == 'site' }}"}
    - name: Say whether the role remembers them checked
      ansible.builtin.debug: {msg: "{{ inventory_hostname }} CHECKED={{ __gpunode_tuning_checked | default(false) }}"}
    - name: Include the role again with a bad value
      when: inventory_hostname == 'alone'
      block:
        - name: Run the role with the bad value
          ansible.builtin.include_role: {name: gpunode_tuning, tasks_from: main}
          vars: {gpunode_tuning_shm_size: lots}
      rescue:
        - name: Say the role refused
          ansible.builtin.debug: {msg: "REFUSED {{ ansible_failed_result.msg }}"}
"""


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("role-checks")
    (tmp / "play.yml").write_text(PLAY)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_CACHE_PLUGIN="memory")
    env.pop("ANSIBLE_CALLBACKS_ENABLED", None)
    # --check: were the check ever skipped, main.yml would go on to report changes, never make them.
    args = [str(ANSIBLE), "-i", "alone,site,", "-c", "local", "--check", str(tmp / "play.yml")]
    args += ["-e", f"ansible_python_interpreter={sys.executable}"]
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_a_role_included_again_with_a_bad_value_checks_it_again(out: str):
    assert "alone CHECKED=False" in out
    assert "REFUSED gpunode_tuning_shm_size" in out


def test_site_checks_mark_the_role_checked(out: str):
    assert "site CHECKED=True" in out
