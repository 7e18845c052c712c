"""The node-problem-detector plugin config in docs/kubernetes: its shape is what NPD's custom plugin monitor reads
(kubernetes/node-problem-detector, pkg/custompluginmonitor), and the command it names, run as NPD runs it,
answers in NPD's protocol: exit 0 OK, 1 NonOK, 2 Unknown, one line of at most max_output_length characters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hostcheck import command
from hostcheck.profiles import PROFILES

SAMPLE = Path(__file__).resolve().parents[2] / "docs" / "kubernetes" / "node-problem-detector-hostcheck.json"


def seconds(text: str) -> float:
    return float(text[:-1]) * {"s": 1, "m": 60, "h": 3600}[text[-1]]


def test_the_sample_is_a_custom_plugin_config_with_one_permanent_rule():
    doc = json.loads(SAMPLE.read_text())
    assert doc["plugin"] == "custom" and doc["pluginConfig"]["max_output_length"] == 80
    (cond,) = doc["conditions"]
    (rule,) = doc["rules"]
    assert rule["type"] == "permanent" and rule["condition"] == cond["type"]
    assert rule["path"].endswith("/bin/hostcheck")
    # NPD kills the plugin at its timeout: the profile's own deadline comes first.
    profile = rule["args"][rule["args"].index("--profile") + 1]
    assert seconds(rule["timeout"]) > PROFILES[profile].deadline_s
    args = command.parse(rule["args"]).args
    assert args.summary and args.config == "/etc/gpunode/hostcheck.toml"


def test_the_plugin_command_answers_in_the_npd_protocol(tmp_path):
    doc = json.loads(SAMPLE.read_text())
    (rule,) = doc["rules"]
    args = list(rule["args"])
    env = {**os.environ, "PYTHONPATH": str(SAMPLE.parents[2])}
    for cfg, codes in (('profile = "passive"\n', {0, 1}), ("profile = 1\n", {2})):
        (tmp_path / "h.toml").write_text(cfg)
        args[args.index("--config") + 1] = str(tmp_path / "h.toml")
        p = subprocess.run(
            [sys.executable, "-m", "hostcheck", *args], capture_output=True, text=True, timeout=120, env=env
        )
        assert p.returncode in codes, p.stderr
        if p.returncode != 2:
            assert (
                p.stdout.count("\n") == 1
                and len(p.stdout.strip()) <= doc["pluginConfig"]["max_output_length"]
            )
