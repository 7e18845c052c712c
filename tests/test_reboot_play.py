"""playbooks/reboot.yml run for real by ansible-playbook on local hosts: the batches, the drain/wait/resume order
and the stop after a failed batch. Local connections run the hooks but never reboot (the play's own rule), so the
order of the hooks is the whole observable behaviour, written by the hooks themselves into a log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLAYBOOK = ROOT / "playbooks" / "reboot.yml"
ANSIBLE = Path(sys.executable).with_name("ansible-playbook")

pytestmark = pytest.mark.skipif(not ANSIBLE.is_file(), reason="ansible-playbook is not beside this Python")


def play(tmp_path: Path, hosts: list[str], *extra: str) -> subprocess.CompletedProcess:
    """playbooks/reboot.yml on local hosts (no become) with the given extra variables."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  children:\n    gpu_nodes:\n      vars:\n        ansible_connection: local\n"
        f"        ansible_python_interpreter: {sys.executable}\n        ansible_become: false\n      hosts:\n"
        + "".join(f"        {n}:\n" for n in hosts)
    )
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_CACHE_PLUGIN="memory")
    env.pop("ANSIBLE_CALLBACKS_ENABLED", None)
    args = [str(ANSIBLE), "-i", str(inventory), str(PLAYBOOK)]
    for e in extra:
        args += ["-e", e]
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def run_reboot_play(
    tmp_path: Path, hosts: int, serial: int, fail_drain: str = ""
) -> tuple[int, list[list[str]]]:
    log = tmp_path / "hooks.log"
    hook = "echo KIND {{ inventory_hostname }} >> " + str(log)
    drain = hook.replace("KIND", "drain")
    if fail_drain:
        drain = f"[ {{{{ inventory_hostname }}}} != {fail_drain} ] && {drain}"
    proc = play(
        tmp_path,
        [f"node{i}" for i in range(1, hosts + 1)],
        "gpunode_reboot_required=true gpunode_driver_enabled=false",
        f"gpunode_reboot_serial={serial}",
        f"gpunode_drain_command='{drain}'",
        f"gpunode_drain_wait_command='{hook.replace('KIND', 'wait')}'",
        f"gpunode_resume_command='{hook.replace('KIND', 'resume')}'",
    )
    lines = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    assert proc.returncode in (0, 2), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.returncode, lines


def batches_of(lines: list[list[str]]) -> list[list[str]]:
    """The nodes drained together, in order: a batch starts at a drain that follows a resume."""
    out: list[list[str]] = []
    last = ""
    for kind, node in lines:
        if kind == "drain":
            if last != "drain":
                out.append([])
            out[-1].append(node)
        last = kind
    return out


def test_nodes_reboot_in_batches_each_drained_waited_and_resumed_before_the_next(tmp_path: Path):
    rc, lines = run_reboot_play(tmp_path, hosts=5, serial=2)
    assert rc == 0
    # Within a batch the hosts run each step in parallel (forks): their order in the log is not defined.
    assert [sorted(b) for b in batches_of(lines)] == [["node1", "node2"], ["node3", "node4"], ["node5"]]
    for node in ("node1", "node2", "node3", "node4", "node5"):
        kinds = [k for k, n in lines if n == node]
        assert kinds == ["drain", "wait", "resume"], (node, kinds)
    # No node of a batch is drained before every node of the batch before it is back in service.
    order = [f"{k} {n}" for k, n in lines]
    assert max(order.index("resume node1"), order.index("resume node2")) < min(
        order.index("drain node3"), order.index("drain node4")
    )
    assert max(order.index("resume node3"), order.index("resume node4")) < order.index("drain node5")


def test_a_failed_batch_stops_the_reboots_there(tmp_path: Path):
    rc, lines = run_reboot_play(tmp_path, hosts=5, serial=2, fail_drain="node3")
    assert rc == 2
    touched = {n for _, n in lines}
    # node3's drain failed: node5 (the next batch) is never drained, and node3 is never rebooted or resumed.
    assert "node5" not in touched
    assert [k for k, n in lines if n == "node3"] == []
    assert [k for k, n in lines if n in ("node1", "node2") and k == "resume"] == ["resume", "resume"]


def test_no_reboot_asked_touches_no_node(tmp_path: Path):
    log = tmp_path / "hooks.log"
    proc = play(
        tmp_path,
        ["node1", "node2"],
        f"gpunode_drain_command='echo drain >> {log}'",
        f"gpunode_resume_command='echo resume >> {log}'",
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert not log.exists()
    assert "skipped=1" in proc.stdout


def test_bad_reboot_settings_stop_before_any_hook(tmp_path: Path):
    log = tmp_path / "hooks.log"
    proc = play(
        tmp_path, ["node1"], "gpunode_reboot_required=true", f"gpunode_drain_command='echo drain >> {log}'"
    )
    assert proc.returncode == 2
    assert "gpunode_drain_command needs gpunode_resume_command" in proc.stdout
    assert not log.exists()
