"""Pull mode (roles/gpunode_pull): the program gpunode-pull.service runs, with the real ansible-pull of this checkout's
venv against a real git repository on disk, and hostcheck's system.E011 on the result it writes.

The repository is built per test: a playbook that changes one thing and fails where a group variable says so, an
inventory naming the node (a local connection, as ansible-pull's own), tags for a good and a bad release and a
branch. So each verdict is tested with the fault planted (a bad release, a tag the remote lacks, a branch, a stop by
systemd, a result too old) and absent (the good release).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hostcheck.checks.system import pull_run
from hostcheck.gather import Snapshot
from hostcheck.gather.facts import gather_facts
from hostcheck.registry import Status

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "roles" / "gpunode_pull" / "files" / "gpunode-pull.py"
BIN = Path(sys.executable).parent
HOST = "node1"

PLAYBOOK = """\
- name: Provision
  hosts: all
  gather_facts: false
  tasks:
    - name: Change something
      ansible.builtin.command: "true"
    - name: Fail where the release says so
      ansible.builtin.fail:
        msg: a bad release
      when: fail_now | default(false) | bool
"""


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A repository with tags v1 (good) and v2-bad (its play fails) and a branch devel; name -> commit."""
    root = tmp_path_factory.mktemp("pullrepo") / "site"
    (root / "playbooks").mkdir(parents=True)
    (root / "inventory" / "group_vars").mkdir(parents=True)
    (root / "playbooks" / "pull.yml").write_text(PLAYBOOK)
    (root / "inventory" / "hosts.yml").write_text(
        f"all:\n  hosts:\n    {HOST}:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
    )
    (root / "inventory" / "group_vars" / "all.yml").write_text("fail_now: false\n")
    git(root, "init", "--quiet", "--initial-branch=main")
    git(root, "add", "--all")
    git(root, "commit", "--quiet", "-m", "v1")
    git(root, "tag", "v1")
    git(root, "branch", "devel")
    (root / "inventory" / "group_vars" / "all.yml").write_text("fail_now: true\n")
    git(root, "commit", "--quiet", "-am", "a bad variable")
    git(root, "tag", "v2-bad")
    return {
        "url": f"file://{root}",
        "v1": git(root, "rev-parse", "v1^{commit}"),
        "v2-bad": git(root, "rev-parse", "v2-bad^{commit}"),
    }


def settings(tmp: Path, repo: dict[str, str], ref: str, **over: object) -> Path:
    s = {
        "repo_url": repo["url"],
        "ref": ref,
        "allow_branch": False,
        "inventory": "inventory/hosts.yml",
        "playbook": "playbooks/pull.yml",
        "host": HOST,
        "only_if_changed": False,
        "extra_args": [],
        "checkout_dir": str(tmp / "checkout"),
        "venv_bin": str(BIN),
        "result_file": str(tmp / "state" / "result.json"),
        "log_file": str(tmp / "state" / "last-run.log"),
        "textfile": str(tmp / "textfile" / "gpunode-pull.prom"),
        "interval_s": 1800,
        **over,
    }
    path = tmp / "pull.json"
    path.write_text(json.dumps(s))
    return path


def pull(tmp: Path, repo: dict[str, str], ref: str, **over: object) -> tuple[int, dict, dict[str, str]]:
    """Run the program as the service does; its exit status, result and textfile (metric line -> value)."""
    env = {**os.environ, "HOME": str(tmp / "home")}
    run = subprocess.run(
        [sys.executable, str(PROGRAM), str(settings(tmp, repo, ref, **over))],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd="/",
    )
    result = json.loads((tmp / "state" / "result.json").read_text())
    return run.returncode, result, metrics((tmp / "textfile" / "gpunode-pull.prom").read_text())


def metrics(text: str) -> dict[str, str]:
    """The samples of a node_exporter textfile, checked line by line against the text exposition format."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) gpunode_pull_\w+ .+$", line), line
            continue
        m = re.match(r'^(gpunode_pull_\w+(?:\{(?:\w+="(?:[^"\\\n]|\\.)*",?)*\})?) (\S+)$', line)
        assert m, line
        float(m.group(2))
        out[m.group(1)] = m.group(2)
    return out


def judge(tmp: Path, fact: dict | None = None, now: float | None = None):
    """system.E011 on the folder's facts: gpunode_pull's fact naming the program's result file."""
    facts = tmp / "facts"
    facts.mkdir(exist_ok=True)
    if fact is not None:
        (facts / "gpunode_pull.fact").write_text(json.dumps(fact))
    return pull_run(Snapshot(facts=gather_facts(str(facts))))


def fact_for(tmp: Path, **over: object) -> dict:
    return {
        "result_file": str(tmp / "state" / "result.json"),
        "interval_s": 1800,
        "unit": "gpunode-pull.service",
        "since": int(time.time()) - 60,
        **over,
    }


def test_a_pinned_tag_is_pulled_and_its_result_and_textfile_say_success(tmp_path, repo):
    rc, result, m = pull(tmp_path, repo, "v1")
    assert rc == 0, result
    assert result["ok"] and result["stage"] == "done" and result["ref_kind"] == "tag"
    assert result["commit"] == repo["v1"] and result["host"] == HOST
    # The real recap of ansible-playbook: the command changed, the fail task was skipped.
    assert result["recap"] == {
        "ok": 1,
        "changed": 1,
        "unreachable": 0,
        "failed": 0,
        "skipped": 1,
        "rescued": 0,
        "ignored": 0,
    }
    assert result["last_success"] == result["finished"] >= result["started"]
    assert m["gpunode_pull_failed"] == "0"
    assert float(m["gpunode_pull_last_success_timestamp_seconds"]) == result["finished"]
    assert m['gpunode_pull_tasks{state="changed"}'] == "1"
    assert m[f'gpunode_pull_info{{ref="v1",commit="{repo["v1"]}",stage="done"}}'] == "1"
    assert "PLAY RECAP" in (tmp_path / "state" / "last-run.log").read_text()
    # hostcheck reads it: the fault absent, a pass.
    outcome = judge(tmp_path, fact_for(tmp_path))
    assert outcome.status is Status.PASS and "v1" in outcome.message and repo["v1"][:12] in outcome.message


def test_a_bad_release_fails_in_its_play_keeps_the_last_success_and_warns(tmp_path, repo):
    _, good, _ = pull(tmp_path, repo, "v1")
    rc, result, m = pull(tmp_path, repo, "v2-bad")
    assert rc == 2, result  # ansible-playbook's exit status for a failed task
    assert not result["ok"] and result["stage"] == "playbook" and result["commit"] == repo["v2-bad"]
    assert result["recap"]["failed"] == 1
    assert result["last_success"] == good["finished"]
    assert m["gpunode_pull_failed"] == "1" and m['gpunode_pull_tasks{state="failed"}'] == "1"
    assert float(m["gpunode_pull_last_success_timestamp_seconds"]) == good["finished"]
    outcome = judge(tmp_path, fact_for(tmp_path))
    assert outcome.status is Status.WARN
    assert (
        "failed" in outcome.message
        and "playbook stage" in outcome.message
        and "1 task(s) failed" in outcome.message
    )
    assert "journalctl -u gpunode-pull.service" in outcome.hint
    assert outcome.brief == "pull failed: playbook exit 2"
    assert len(f"hostcheck: system.E011 {outcome.brief}") <= 80


def test_a_tag_the_remote_lacks_stops_before_ansible_pull(tmp_path, repo):
    rc, result, m = pull(tmp_path, repo, "v9")
    assert rc == 1
    assert result["stage"] == "ref" and result["ref_kind"] == "" and result["recap"] is None
    assert "neither a tag nor a branch" in result["message"]
    assert not (tmp_path / "checkout").exists() and result["last_success"] is None
    assert m["gpunode_pull_failed"] == "1" and m["gpunode_pull_last_success_timestamp_seconds"] == "0.000"
    assert not [k for k in m if k.startswith("gpunode_pull_tasks")]  # no play ran: no recap to count
    outcome = judge(tmp_path, fact_for(tmp_path))
    assert outcome.status is Status.WARN and "none so far" in outcome.message


def test_a_branch_is_refused_unless_allowed(tmp_path, repo):
    rc, result, _ = pull(tmp_path, repo, "devel")
    assert rc == 1 and result["ref_kind"] == "branch" and result["stage"] == "ref"
    assert "is a branch" in result["message"] and not (tmp_path / "checkout").exists()
    rc, result, _ = pull(tmp_path, repo, "devel", allow_branch=True)
    assert rc == 0 and result["ok"] and result["commit"] == repo["v1"]


def test_a_full_commit_is_pulled_and_an_unchanged_checkout_runs_nothing(tmp_path, repo):
    rc, result, _ = pull(tmp_path, repo, repo["v1"])
    assert rc == 0 and result["ref_kind"] == "commit" and result["commit"] == repo["v1"]
    rc, result, m = pull(tmp_path, repo, repo["v1"], only_if_changed=True)
    assert rc == 0 and result["ok"] and result["stage"] == "unchanged" and result["recap"] is None
    assert m["gpunode_pull_failed"] == "0"


def test_a_run_stopped_by_systemd_is_recorded_as_failed(tmp_path, repo):
    """TimeoutStartSec and systemctl stop send SIGTERM: ansible-pull is stopped and the run recorded."""
    slow = tmp_path / "bin"
    slow.mkdir()
    (slow / "ansible-pull").write_text("#!/bin/sh\necho 'Starting Ansible Pull'\nexec sleep 60\n")
    (slow / "ansible-pull").chmod(0o755)
    path = settings(tmp_path, repo, "v1", venv_bin=str(slow))
    proc = subprocess.Popen([sys.executable, str(PROGRAM), str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and "Starting Ansible Pull" in proc.stdout.readline()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    result = json.loads((tmp_path / "state" / "result.json").read_text())
    assert result["stage"] == "stopped" and not result["ok"] and "SIGTERM" in result["message"]


def test_a_venv_without_ansible_pull_is_a_failed_run_not_a_crash(tmp_path, repo):
    (tmp_path / "empty").mkdir()
    rc, result, m = pull(tmp_path, repo, "v1", venv_bin=str(tmp_path / "empty"))
    assert rc == 1 and result["stage"] == "checkout" and "could not be run" in result["message"]
    assert m["gpunode_pull_failed"] == "1"


def test_staleness_is_judged_against_the_interval(tmp_path, repo):
    pull(tmp_path, repo, "v1")
    result_file = tmp_path / "state" / "result.json"
    data = json.loads(result_file.read_text())
    # Planted: the last success four intervals ago (more than the three of pull_stale_intervals).
    data["finished"] = data["last_success"] = time.time() - 4 * 1800
    result_file.write_text(json.dumps(data))
    outcome = judge(tmp_path, fact_for(tmp_path))
    assert outcome.status is Status.WARN and "2 h 00 min ago" in outcome.message
    assert outcome.brief.startswith("pull stale") and "list-timers gpunode-pull.timer" in outcome.hint
    # Absent: two intervals ago is within the line.
    data["finished"] = data["last_success"] = time.time() - 2 * 1800
    result_file.write_text(json.dumps(data))
    assert judge(tmp_path, fact_for(tmp_path)).status is Status.PASS


def test_no_fact_skips_and_a_first_run_that_never_ended_warns(tmp_path):
    outcome = judge(tmp_path)
    assert outcome.status is Status.SKIP and "not set up" in outcome.message
    # Set up a minute ago, no result yet: the first run may be under way.
    outcome = judge(tmp_path, fact_for(tmp_path))
    assert outcome.status is Status.SKIP and "no run has finished yet" in outcome.message
    # Set up four intervals ago and still no result.
    outcome = judge(tmp_path, fact_for(tmp_path, since=int(time.time()) - 4 * 1800))
    assert outcome.status is Status.WARN and outcome.brief.startswith("no pull finished")


#: host -> (its variables over the valid base, the words of the refusal; "" for a host that passes).
VALIDATION = {
    "good": ({}, ""),
    "ssh_url": ({"gpunode_pull_repo_url": "git@git.example.org:site/gpunode.git"}, ""),
    "branch_allowed": ({"gpunode_pull_ref": "main", "gpunode_pull_allow_branch": True}, ""),
    "commit": ({"gpunode_pull_ref": "0123456789abcdef0123456789abcdef01234567"}, ""),
    "empty_url": ({"gpunode_pull_repo_url": ""}, "gpunode_pull_repo_url must be"),
    "password_in_url": (
        {"gpunode_pull_repo_url": "https://ci:s3cret@git.example.org/site.git"},
        "without a password",
    ),
    "empty_ref": ({"gpunode_pull_ref": ""}, "is not a pinned release"),
    "branch": ({"gpunode_pull_ref": "main"}, "'main' is not a pinned release"),
    "heads_ref": ({"gpunode_pull_ref": "refs/heads/release"}, "is not a pinned release"),
    "short_commit": ({"gpunode_pull_ref": "0123abc"}, "an abbreviated commit"),
    "dotdot_ref": ({"gpunode_pull_ref": "v1..2"}, "is not a pinned release"),
    "option_ref": ({"gpunode_pull_ref": "--upload-pack=x"}, "is not a pinned release"),
    "bad_interval": ({"gpunode_pull_interval": "soon"}, "systemd time spans"),
    "short_interval": ({"gpunode_pull_interval": "30s"}, "at least a minute"),
    "own_option": ({"gpunode_pull_extra_args": ["--checkout=main"]}, "none the role sets itself"),
    "not_an_option": ({"gpunode_pull_extra_args": ["verify-commit"]}, "each starting with '-'"),
    "playbook_escapes": ({"gpunode_pull_playbook": "../other/site.yml"}, "gpunode_pull_playbook"),
    "relative_venv": ({"gpunode_pull_venv": "opt/pull"}, "absolute paths"),
}


def test_the_role_refuses_bad_settings_before_any_change(tmp_path):
    """The role's validate step (what site.yml's check play runs) on one local host per case."""
    import yaml

    hosts = {name: over for name, (over, _) in VALIDATION.items()}
    inventory = {
        "all": {
            "hosts": hosts,
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "gpunode_pull_enabled": True,
                "gpunode_pull_repo_url": "https://git.example.org/site/gpunode.git",
                "gpunode_pull_ref": "v1.4.0",
            },
        }
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(
        "- hosts: all\n  gather_facts: true\n  tasks:\n"
        "    - ansible.builtin.include_role:\n        name: gpunode_pull\n        tasks_from: validate\n"
    )
    env = {**os.environ, "HOME": str(tmp_path), "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"}
    env.update(ANSIBLE_CACHE_PLUGIN="memory", ANSIBLE_FORKS="20")
    run = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert "{" in run.stdout, run.stdout + run.stderr
    doc, _ = json.JSONDecoder().raw_decode(run.stdout[run.stdout.index("{") :])
    refused = {}
    for play in doc["plays"]:
        for task in play["tasks"]:
            for host, res in task["hosts"].items():
                if res.get("failed"):
                    refused[host] = res.get("msg", "")
    for host, (_, words) in VALIDATION.items():
        if words:
            assert host in refused and words in refused[host], (host, refused.get(host))
        else:
            assert host not in refused, (host, refused[host])


@pytest.mark.parametrize(
    "fact, joined, refused",
    [
        (None, ["gpu_nodes"], ""),
        ({"groups": ["infer_nodes", "h100_nodes"]}, ["gpu_nodes", "infer_nodes", "h100_nodes"], ""),
        ({"groups": "infer_nodes"}, [], "must be JSON like"),
        ({"groups": ["infer nodes; rm"]}, [], "must be JSON like"),
        ("error loading fact - please check content", [], "must be JSON like"),
    ],
    ids=["no-fact", "groups", "a-string", "a-bad-name", "unreadable-fact"],
)
def test_pull_yml_joins_the_groups_the_local_fact_names(tmp_path, fact, joined, refused):
    """playbooks/pull.yml's first play, as it is, on a local host; ansible_local stands in for what the node's
    /etc/ansible/facts.d/gpunode_groups.fact gives (an unreadable fact is the message Ansible puts there)."""
    import yaml

    play = yaml.safe_load((ROOT / "playbooks" / "pull.yml").read_text())[0]
    play["tasks"].append({"name": "Show the groups", "ansible.builtin.debug": {"msg": "{{ group_names }}"}})
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play]))
    local = {} if fact is None else {"gpunode_groups": fact}
    env = {**os.environ, "HOME": str(tmp_path), "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"}
    extra = json.dumps({"ansible_python_interpreter": sys.executable, "ansible_local": local})
    run = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            "node1,",
            "-c",
            "local",
            str(tmp_path / "play.yml"),
            "-e",
            extra,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    doc, _ = json.JSONDecoder().raw_decode(run.stdout[run.stdout.index("{") :])
    results = {t["task"]["name"]: t["hosts"]["node1"] for t in doc["plays"][0]["tasks"]}
    if refused:
        assert run.returncode == 2 and refused in results["Check the groups the local fact names"]["msg"]
        assert "Show the groups" not in results
    else:
        assert run.returncode == 0, run.stdout[-2000:]
        assert sorted(results["Show the groups"]["msg"]) == sorted(joined)
