"""``hostcheck sweep`` on a GPU node (marker ``gpu``; skipped without CUDA): one NCCL rank per GPU, the matmul on
each GPU. Run on a GPU node: ``pytest -m gpu tests/gpu -q``.

A world of one node: its GPUs are each other's peers for the compute rule (no node pairs and no all_reduce levels:
one node)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hostcheck.child.launch import free_port  # noqa: E402
from hostcheck.schema import sweep_schema, type_errors  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_a_node_runs_one_nccl_rank_per_gpu(tmp_path):
    gpus = torch.cuda.device_count()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    report = tmp_path / "sweep.json"
    argv = [sys.executable, "-m", "hostcheck", "sweep", "--python", sys.executable, "--device", "cuda"]
    argv += ["--facts-dir", str(tmp_path), "--env-file", str(tmp_path / "none.env"), "--json", str(report)]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode in (0, 1), p.stderr
    doc = json.loads(report.read_text())
    assert type_errors(doc, sweep_schema()) == []
    assert doc["backend"] == "nccl" and doc["world_ranks"] == gpus
    (node,) = doc["nodes"]
    assert (
        node["state"] == "measured"
        and node["gpus"] == gpus
        and node["device"] == torch.cuda.get_device_name(0)
    )
    # A bf16 matmul of 8192 on a datacenter GPU: tens of TFLOP/s at least, on every GPU.
    assert node["compute_flops_per_s"] > 1e13
    if gpus >= 4:  # its GPUs are peers enough for the compute rule
        assert "compute" in doc["verdict"]["judged"]
