"""One pull-mode provisioning run: ansible-pull of the pinned release, then its result written where hostcheck and
Prometheus read it. Installed by the gpunode_pull role; gpunode-pull.service runs it with Ansible's own venv.

    python gpunode-pull.py [SETTINGS]      (default /etc/gpunode/pull.json, written by the role)

Before ansible-pull runs, the ref is looked up on the remote (git ls-remote): a tag or a full commit is pulled, a
branch only where the settings allow it, anything else stops the run. Afterwards, whatever happened (a refused ref,
a failed checkout, a failed play, a stop by systemd), it writes:

- the result, JSON, atomically: schema_version, host, repo_url, ref, ref_kind, commit, playbook, started, finished,
  duration_s, rc, ok, stage (ref, checkout, playbook, unchanged, done, stopped), message, recap (the play recap's counts of
  this host, or null), interval_s, last_success (when the last good run ended, also after a failed one), log;
- a node_exporter textfile, atomically: gpunode_pull_last_run_timestamp_seconds,
  gpunode_pull_last_success_timestamp_seconds, gpunode_pull_failed, gpunode_pull_last_run_duration_seconds,
  gpunode_pull_tasks{state} and gpunode_pull_info{ref, commit, stage}.

It exits with ansible-pull's status (1 when the ref was refused, 143 when stopped), so a failed pull fails the
systemd unit.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

SETTINGS = "/etc/gpunode/pull.json"
SCHEMA_VERSION = 1
# ansible-playbook's recap line (lib/ansible/plugins/callback/default.py, v2_playbook_on_stats).
RECAP = re.compile(
    r"^(?P<host>\S+)\s*:\s*ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)\s+"
    r"failed=(?P<failed>\d+)\s+skipped=(?P<skipped>\d+)\s+rescued=(?P<rescued>\d+)\s+ignored=(?P<ignored>\d+)"
)
# What ansible-pull prints when --only-if-changed finds the checkout unchanged (lib/ansible/cli/pull.py).
UNCHANGED = "Repository has not changed, quitting"
CHECKOUT_OK = re.compile(r"^\S+ \| (CHANGED|SUCCESS) =>")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
# The log of the last run is kept whole up to this size; past it only its head and tail.
LOG_CAP = 16 << 20


class Stopped(Exception):
    """systemd stopped the run (TimeoutStartSec, systemctl stop)."""


def _stop(signum: int, _frame: object) -> None:
    raise Stopped(signal.Signals(signum).name)


def classify(url: str, ref: str, timeout: float = 120) -> tuple[str, str]:
    """(kind, message): kind is tag, commit, branch or "" (not found / not reachable, with why)."""
    if COMMIT.match(ref):
        return "commit", ""
    try:
        run = subprocess.run(
            ["git", "ls-remote", "--", url],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", f"git ls-remote {url} failed: {exc}"
    if run.returncode != 0:
        return "", f"git ls-remote {url} failed (exit {run.returncode}): {run.stderr.strip()[-300:]}"
    refs = {line.split("\t", 1)[1] for line in run.stdout.splitlines() if "\t" in line}
    name = ref.removeprefix("refs/tags/").removeprefix("refs/heads/")
    if f"refs/tags/{name}" in refs and not ref.startswith("refs/heads/"):
        return "tag", ""
    if f"refs/heads/{name}" in refs:
        return "branch", ""
    return "", f"{ref} is neither a tag nor a branch of {url} (give a tag or a full 40-hex commit)"


def previous_success(path: str) -> float | None:
    """last_success of the previous result (this program's own file; anything odd there counts as none)."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(1 << 20))
        value = data.get("last_success")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    except (OSError, ValueError, AttributeError):
        return None


def write_atomically(path: str, text: str) -> None:
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".gpunode-pull-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _label(value: str) -> str:
    """A Prometheus label value (text exposition format: backslash, double quote and line feed escaped)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics(result: dict) -> str:
    recap = result.get("recap") or {}
    lines = [
        "# HELP gpunode_pull_last_run_timestamp_seconds When the last ansible-pull run ended (Unix time).",
        "# TYPE gpunode_pull_last_run_timestamp_seconds gauge",
        f"gpunode_pull_last_run_timestamp_seconds {result['finished']:.3f}",
        "# HELP gpunode_pull_last_success_timestamp_seconds When the last successful run ended; 0: none yet.",
        "# TYPE gpunode_pull_last_success_timestamp_seconds gauge",
        f"gpunode_pull_last_success_timestamp_seconds {result['last_success'] or 0:.3f}",
        "# HELP gpunode_pull_failed 1 when the last ansible-pull run failed.",
        "# TYPE gpunode_pull_failed gauge",
        f"gpunode_pull_failed {0 if result['ok'] else 1}",
        "# HELP gpunode_pull_last_run_duration_seconds How long the last run took.",
        "# TYPE gpunode_pull_last_run_duration_seconds gauge",
        f"gpunode_pull_last_run_duration_seconds {result['duration_s']:.3f}",
    ]
    if recap:  # no play ran (a refused ref, a failed checkout, nothing changed): no recap to count
        lines += [
            "# HELP gpunode_pull_tasks Tasks of the last run's play recap for this node, by state.",
            "# TYPE gpunode_pull_tasks gauge",
            *(f'gpunode_pull_tasks{{state="{k}"}} {v}' for k, v in sorted(recap.items())),
        ]
    lines += [
        "# HELP gpunode_pull_info The last run's ref, the commit it resolved to and the stage it ended in.",
        "# TYPE gpunode_pull_info gauge",
        f'gpunode_pull_info{{ref="{_label(result["ref"])}",commit="{_label(result["commit"])}",'
        f'stage="{_label(result["stage"])}"}} 1',
    ]
    return "\n".join(lines) + "\n"


def head_commit(checkout: str) -> str:
    try:
        run = subprocess.run(
            ["git", "-C", checkout, "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    out = run.stdout.strip()
    return out if run.returncode == 0 and COMMIT.match(out) else ""


def pull_argv(s: dict, kind: str) -> list[str]:
    # The pulled run keeps the node's pin: the release it runs cannot move the node to another one (moving the pin
    # is the inventory's, through the role: docs/fleet.md, "Pull mode").
    pin = {
        "gpunode_pull_repo_url": s["repo_url"],
        "gpunode_pull_ref": s["ref"],
        "gpunode_pull_allow_branch": s["allow_branch"],
        "gpunode_pull_host": s["host"],
    }
    argv = [os.path.join(s["venv_bin"], "ansible-pull"), "--url", s["repo_url"], "--checkout", s["ref"]]
    argv += ["--directory", s["checkout_dir"], "--inventory", s["inventory"], "--limit", s["host"], "--clean"]
    argv += ["--extra-vars", json.dumps(pin)]
    if kind == "commit":
        argv.append("--full")  # a shallow clone cannot check out a commit that is no branch's or tag's tip
    if s["only_if_changed"]:
        argv.append("--only-if-changed")
    return [*argv, *s["extra_args"], s["playbook"]]


def run_pull(argv: list[str], log_path: str, host: str) -> tuple[int, dict | None, bool, bool]:
    """(rc, recap of host, whether the checkout step failed, whether --only-if-changed stopped it)."""
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "PYTHONUNBUFFERED": "1"}
    env.setdefault("HOME", "/root")
    recap, unchanged, checked_out, written = None, False, False, 0
    os.makedirs(os.path.dirname(log_path), mode=0o755, exist_ok=True)
    with open(log_path, "w", errors="replace") as log:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", env=env
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                if written < LOG_CAP:
                    log.write(line)
                    written += len(line)
                # The checkout is an ad-hoc git module run: "localhost | CHANGED => {" or "| SUCCESS =>".
                checked_out = checked_out or bool(CHECKOUT_OK.search(line))
                unchanged = unchanged or UNCHANGED in line
                m = RECAP.match(line)
                if m and m["host"] == host:
                    recap = {k: int(v) for k, v in m.groupdict().items() if k != "host"}
            rc = proc.wait()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    return rc, recap, rc != 0 and not checked_out, unchanged


def main(argv: list[str]) -> int:
    path = argv[1] if len(argv) > 1 else SETTINGS
    with open(path) as f:
        s = json.load(f)
    signal.signal(signal.SIGTERM, _stop)
    started = time.time()
    result = {
        "schema_version": SCHEMA_VERSION,
        "host": s["host"],
        "repo_url": s["repo_url"],
        "ref": s["ref"],
        "ref_kind": "",
        "commit": "",
        "playbook": s["playbook"],
        "started": round(started, 3),
        "interval_s": s["interval_s"],
        "log": s["log_file"],
        "recap": None,
    }
    rc, stage, message = 1, "ref", ""
    try:
        kind, message = classify(s["repo_url"], s["ref"])
        result["ref_kind"] = kind
        if kind == "branch" and not s["allow_branch"]:
            message = f"{s['ref']} is a branch, which moves: pin a tag or a commit (or set gpunode_pull_allow_branch)"
        elif kind:
            rc, recap, checkout_failed, unchanged = run_pull(pull_argv(s, kind), s["log_file"], s["host"])
            result["recap"] = recap
            stage = (
                "checkout" if checkout_failed else "unchanged" if unchanged else "playbook" if rc else "done"
            )
            message = {
                "checkout": f"ansible-pull could not check out {s['ref']} (exit {rc})",
                "unchanged": "the checkout did not change: nothing run (--only-if-changed)",
                "playbook": f"the play failed (exit {rc})",
                "done": "",
            }[stage]
    except Stopped as exc:
        rc, stage, message = 143, "stopped", f"stopped by {exc} (TimeoutStartSec, or systemctl stop)"
    except OSError as exc:  # ansible-pull missing from the venv, the log folder not writable
        rc, stage, message = 1, "checkout", f"ansible-pull could not be run: {exc}"
    finished = time.time()
    ok = rc == 0
    result.update(
        commit=head_commit(s["checkout_dir"]) if stage != "ref" else "",
        finished=round(finished, 3),
        duration_s=round(finished - started, 3),
        rc=rc,
        ok=ok,
        stage=stage,
        message=message,
        last_success=round(finished, 3) if ok else previous_success(s["result_file"]),
    )
    write_atomically(s["result_file"], json.dumps(result, indent=2, sort_keys=True) + "\n")
    write_atomically(s["textfile"], metrics(result))
    if message:
        print(f"gpunode-pull: {message}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
