"""The changes callback (plugins/callback/changes.py) run by the real ansible-playbook against localhost.

molecule/default's verify compares these records (check run against real run), so what they say must be what
Ansible reported: each test runs a small playbook and reads the JSON file the callback wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK_BIN = Path(sys.executable).with_name("ansible-playbook")

pytestmark = pytest.mark.skipif(not PLAYBOOK_BIN.exists(), reason="ansible-playbook is not in this venv")

PLAY = """
- name: Work on localhost
  hosts: local
  gather_facts: false
  tasks:
    - name: Write the file
      ansible.builtin.copy:
        dest: "{{ out }}/file.txt"
        content: "hello\\n"
        mode: "0644"
      notify: Note the file

    - name: Read the file
      ansible.builtin.stat:
        path: "{{ out }}/file.txt"

    - name: Echo the items
      ansible.builtin.command: "echo {{ item }}"
      check_mode: false
      loop: [1, 2, 3]
      changed_when: item == 2

    - name: Echo nothing new
      ansible.builtin.command: "echo {{ item }}"
      check_mode: false
      loop: [1, 2]
      changed_when: false

    - name: Fail and go on
      ansible.builtin.command: "false"
      check_mode: false
      ignore_errors: true
      changed_when: false

    - name: Fail for real
      ansible.builtin.fail:
        msg: planted
      when: fail_for_real | default(false) | bool

  handlers:
    - name: Note the file
      ansible.builtin.debug:
        msg: noted
      changed_when: true

- name: Reach a host that is not there
  hosts: away
  gather_facts: false
  tasks:
    - name: Ping it
      ansible.builtin.ping:
"""

INVENTORY = """
local:
  hosts:
    here:
      ansible_connection: local
      ansible_python_interpreter: {python}
away:
  hosts:
    gone:
      ansible_connection: ssh
      ansible_host: 127.0.0.1
      # Port 9 (discard) has no listener here: ssh is refused at once, so the host is unreachable.
      ansible_port: 9
      ansible_ssh_common_args: -o ConnectTimeout=5 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null
"""


@pytest.fixture
def project(tmp_path):
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "site.yml").write_text(PLAY)
    (tmp_path / "hosts.yml").write_text(INVENTORY.format(python=sys.executable))
    (tmp_path / "out").mkdir()
    return tmp_path


def run(project, *args, env_extra=None):
    """One ansible-playbook run with the callback on; returns (returncode, the record it wrote)."""
    records = project / "records"
    before = set(records.glob("*.json")) if records.exists() else set()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(project),
        "ANSIBLE_CONFIG": str(project / "none.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "collections"),
        "ANSIBLE_CALLBACKS_ENABLED": "gpunode.node.changes",
        "GPUNODE_CHANGES_DIR": str(records),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_HOST_KEY_CHECKING": "false",
    }
    env.update(env_extra or {})
    cmd = [str(PLAYBOOK_BIN), "-i", str(project / "hosts.yml"), str(project / "playbooks" / "site.yml")]
    cmd += ["-e", "out=" + str(project / "out"), *args]
    proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=240)
    written = sorted(set(records.glob("*.json")) - before)
    assert len(written) == 1, (written, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc.returncode, written[0], json.loads(written[0].read_text())


def line_of(task):
    """playbooks/site.yml:N, the place Ansible gives for the task named `task` in PLAY."""
    number = PLAY.splitlines().index(f"    - name: {task}") + 1
    return f"playbooks/site.yml:{number}"


def names(record, host, key="changed"):
    return [entry["task"] for entry in record["hosts"][host][key]]


def test_a_check_run_records_what_would_change_and_the_real_run_what_changed(project):
    rc, path, check = run(project, "--check", "--diff")
    assert path.name.endswith("-site-check.json")
    assert check["check"] is True and check["diff"] is True
    assert check["playbook"] == str(project / "playbooks" / "site.yml")
    # The copy would create the file (its diff is recorded by size), the loop changed on item 2, the handler ran.
    assert names(check, "here") == ["Write the file", "Echo the items", "Note the file"]
    assert check["hosts"]["here"]["changed"][0]["diff_chars"] > 0
    assert check["hosts"]["here"]["changed"][0]["path"] == line_of("Write the file")
    assert not (project / "out" / "file.txt").exists()
    # The ignored failure is recorded as ignored and does not count as a failure of the run.
    assert check["hosts"]["here"]["failed"] == [
        {"task": "Fail and go on", "path": line_of("Fail and go on"), "ignored": True}
    ]
    assert check["hosts"]["here"]["stats"]["failures"] == 0
    assert check["hosts"]["here"]["stats"]["ignored"] == 1
    # The host that cannot be reached is recorded so, with its task.
    assert names(check, "gone", "unreachable") == ["Ping it"]
    assert check["hosts"]["gone"]["stats"]["unreachable"] == 1
    assert rc == 4

    rc, path, real = run(project)
    assert path.name.endswith("-site-run.json")
    assert real["check"] is False and real["diff"] is False
    assert names(real, "here") == names(check, "here")
    assert real["hosts"]["here"]["changed"][0]["diff_chars"] == 0
    assert (project / "out" / "file.txt").read_text() == "hello\n"

    rc, path, again = run(project, "--check")
    # The file is there: only the loop that always reports item 2 changed is left.
    assert names(again, "here") == ["Echo the items"]


def test_a_failed_task_is_recorded_and_counted(project):
    rc, _name, record = run(project, "-e", "fail_for_real=true", "--limit", "here")
    assert rc == 2
    assert record["limit"] == "here"
    assert record["hosts"]["here"]["failed"][-1] == {
        "task": "Fail for real",
        "path": line_of("Fail for real"),
        "ignored": False,
    }
    assert record["hosts"]["here"]["stats"]["failures"] == 1
    assert "gone" not in record["hosts"]


def test_diff_always_from_the_environment_is_recorded_as_a_diff_run(project):
    record = run(project, "--check", "--limit", "here", env_extra={"ANSIBLE_DIFF_ALWAYS": "true"})[2]
    assert record["diff"] is True
    assert record["hosts"]["here"]["changed"][0]["diff_chars"] > 0
