# Apache-2.0 (see galaxy.yml)
"""Record which tasks reported changed on which host, one JSON file per ansible-playbook run."""

from __future__ import annotations

DOCUMENTATION = """
    name: changes
    type: aggregate
    short_description: Write the tasks each host reported changed to one JSON file per run
    description:
        - At the end of each playbook run, writes one JSON file into O(directory) saying whether the run was in check
          mode and, per host, the tasks that reported changed, the tasks that failed, and the run's counts.
        - A looped task is one entry, changed when any of its items changed; a handler is recorded as a task.
        - Lets a test compare what C(--check) says would change with what the real run changed.
        - Records task names and counts only, never module output; with C(--diff), the size of each changed task's
          diff in characters, so that a test can hold diffs small.
    requirements:
        - enable it in callbacks_enabled (ANSIBLE_CALLBACKS_ENABLED=gpunode.node.changes)
    options:
        directory:
            description: Directory the run's JSON file is written to (created when missing).
            type: path
            required: true
            env:
                - name: GPUNODE_CHANGES_DIR
            ini:
                - section: callback_gpunode_changes
                  key: directory
"""

import json
import os
import tempfile
import time

from ansible import context
from ansible.plugins.callback import CallbackBase

SCHEMA = "gpunode.changes/1"


def diff_chars(result):
    """Characters of the diff a result carries (each loop item's added up); 0 without one."""
    diffs = [result.get("diff")]
    diffs.extend(item.get("diff") for item in result.get("results") or [] if isinstance(item, dict))
    return sum(len(json.dumps(diff, default=str)) for diff in diffs if diff)


class CallbackModule(CallbackBase):
    """Collects per-host changed/failed tasks and writes them when the run's stats arrive."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpunode.node.changes"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, display=None):
        super().__init__(display=display)
        self.playbook = ""
        self.root = ""
        self.started = time.time()
        self.hosts = {}

    def host(self, name):
        return self.hosts.setdefault(name, {"changed": [], "failed": [], "unreachable": []})

    def entry(self, result):
        task = result.task
        path = task.get_path() or ""
        if path and self.root and path.startswith(self.root + os.sep):
            path = path[len(self.root) + 1 :]
        return {"task": task.get_name(include_role_fqcn=False), "path": path}

    def v2_playbook_on_start(self, playbook):
        self.playbook = os.path.abspath(playbook._file_name)
        # Paths in the record are relative to the directory above the playbook's (a project's root).
        self.root = os.path.dirname(os.path.dirname(self.playbook))
        self.started = time.time()

    def v2_runner_on_ok(self, result):
        if result.is_changed():
            entry = self.entry(result)
            entry["diff_chars"] = diff_chars(result.result)
            self.host(result.host.get_name())["changed"].append(entry)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        entry = self.entry(result)
        entry["ignored"] = bool(ignore_errors)
        record = self.host(result.host.get_name())
        record["failed"].append(entry)
        # A failed task can have changed the host before it failed (a loop whose first items ran).
        if result.is_changed():
            entry = self.entry(result)
            entry["diff_chars"] = diff_chars(result.result)
            record["changed"].append(entry)

    def v2_runner_on_unreachable(self, result):
        self.host(result.host.get_name())["unreachable"].append(self.entry(result))

    def v2_playbook_on_stats(self, stats):
        for name in stats.processed:
            self.host(name)["stats"] = stats.summarize(name)
        cliargs = context.CLIARGS
        record = {
            "schema": SCHEMA,
            "playbook": self.playbook,
            "check": bool(cliargs.get("check")),
            "diff": bool(cliargs.get("diff")),
            "limit": cliargs.get("subset") or "",
            "started": self.started,
            "ended": time.time(),
            "hosts": self.hosts,
        }
        directory = self.get_option("directory")
        os.makedirs(directory, exist_ok=True)
        mode = "check" if record["check"] else "run"
        stem = f"{time.time_ns()}-{os.path.splitext(os.path.basename(self.playbook))[0]}-{mode}"
        # Written whole, then renamed: a reader never sees half a record.
        fd, tmp = tempfile.mkstemp(prefix=f".{stem}.", dir=directory)
        with os.fdopen(fd, "w") as handle:
            json.dump(record, handle, indent=1, sort_keys=True)
        os.replace(tmp, os.path.join(directory, stem + ".json"))
