"""The real gatherers on whatever machine runs the tests (no GPU in CI), and a GPU-marked test for GPU nodes.

The training Python is replaced by a stub that prints a probe record, so no torch import slows the suite.
"""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from hostcheck import command
from hostcheck.checks import all_checks
from hostcheck.gather import Options, gather

STUB_PROBE = {
    "python": "3.12.3",
    "env": {"OMP_NUM_THREADS": "1"},
    "affinity": 1,
    "rlimits": {"memlock": [-1, -1], "nofile": [1048576, 1048576]},
    "pillow": {"pillow-simd": None, "Pillow": None, "PIL": None},
    "torch": {"installed": False, "error": "No module named 'torch'"},
    "maps": {"jemalloc": [], "tcmalloc": [], "openmp": []},
    "symbols": {},
}


@pytest.fixture
def stub_python(tmp_path):
    py = tmp_path / "python"
    py.write_text("#!/bin/sh\necho noise\necho 'HOSTCHECK_PROBE_JSON:" + json.dumps(STUB_PROBE) + "'\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return str(py)


def test_real_gatherers_on_this_machine_give_results_not_tracebacks(stub_python, tmp_path, capsys):
    facts = tmp_path / "facts"
    facts.mkdir()
    (facts / "gpunode_driver.fact").write_text(
        json.dumps({"expected_gpu_count": "8", "version": "580.159.04"})
    )
    argv = ["--json", "--profile", "full", "--python", stub_python, "--facts-dir", str(facts)]
    rc = command.main([*argv, "--env-file", "/nonexistent"])
    doc = json.loads(capsys.readouterr().out)
    assert rc in (0, 1) and doc["exit_code"] == rc
    assert len(doc["checks"]) == len(all_checks())
    for c in doc["checks"]:
        assert "raised" not in c["message"] and "timed out" not in c["message"], c
    by_id = {c["id"]: c for c in doc["checks"]}
    assert by_id["torch.E001"]["status"] == "fail"  # the stub has no torch
    assert by_id["tuning.E001"]["value"] > 0  # a real /dev/shm size
    assert by_id["gpu.E002"]["expected"] == 8
    if not os.path.exists("/proc/driver/nvidia/version"):
        assert by_id["gpu.E002"]["status"] == "fail" and rc == 1


def test_gather_only_runs_what_is_needed(stub_python):
    snap = gather(Options(python=stub_python), {"facts", "tuning"})
    assert snap.tuning is not None and snap.nvml is None and snap.torch is None and snap.system is None


@pytest.mark.gpu
def test_on_a_gpu_node_nvml_and_torch_see_the_gpus():
    if not os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("no NVIDIA driver on this machine")
    snap = gather(Options(python=sys.executable), {"facts", "system", "nvml", "torch"})
    assert snap.nvml.ok, snap.nvml.error
    assert snap.nvml.gpus and all(g.handle_error is None for g in snap.nvml.gpus)
    if snap.torch.torch_installed and snap.torch.torch.get("cuda"):
        assert snap.torch.torch["cuda_available"] is True
