"""roles/gpunode_tuning/files/gpunode-tuning-probe.sh: its JSON keeps every value intact."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parents[2] / "roles" / "gpunode_tuning" / "files" / "gpunode-tuning-probe.sh"

pytestmark = pytest.mark.skipif(
    not Path("/proc/cpuinfo").exists() or shutil.which("sh") is None, reason="needs Linux's /proc"
)


def probe(*names: str) -> dict:
    out = subprocess.run(["sh", str(PROBE), *names], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_quotes_backslashes_tabs_and_newlines_survive_in_names_and_values():
    hostile = 'a"quote\\backslash\ttab\nnewline\rcr end'
    got = probe(hostile, "kernel.ostype")
    # The name is a key and the probe reports it as missing: it must come back unchanged, not stripped.
    assert got["sysctl"][hostile] == {"present": False, "writable": False, "value": ""}
    assert got["sysctl"]["kernel.ostype"]["present"] is True
    assert got["sysctl"]["kernel.ostype"]["value"] == Path("/proc/sys/kernel/ostype").read_text().strip()


def test_plain_values_are_unchanged_and_numbers_are_numbers():
    got = probe()
    assert got["sysctl"] == {}
    assert isinstance(got["cpus"], int) and got["cpus"] >= 1
    assert isinstance(got["numa_nodes"], int) and got["numa_nodes"] >= 0
    nodes = len(list(Path("/sys/devices/system/node").glob("node[0-9]*")))
    assert got["numa_nodes"] == nodes
