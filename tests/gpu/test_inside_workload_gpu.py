"""The workload probes on a real GPU (marker ``gpu``; skipped without CUDA, never failed for lack of one).

Run on a GPU node: ``pytest -m gpu tests/gpu -q``. Sanity bounds are deliberately loose (any data-centre
or recent consumer GPU passes); the verdicts against the SKU table are what hostcheck itself reports.
"""

from __future__ import annotations

import math
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from hostcheck.checks import all_checks  # noqa: E402
from hostcheck.checks.workload import grading  # noqa: E402
from hostcheck.checks.workload import sku as S  # noqa: E402
from hostcheck.gather import Options, gather  # noqa: E402
from hostcheck.gather import workload as api  # noqa: E402
from hostcheck.inside import workload as probes  # noqa: E402
from hostcheck.registry import run_checks, select  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def by_id(findings):
    return {f.id: f for f in findings}


def judge(snapshot):
    """The workload checks of a snapshot, as hostcheck runs them."""
    return run_checks(select(all_checks(), only=["workload"]), snapshot)


def test_matmul_probe_measures_every_dtype_on_every_gpu():
    out = probes.probe_matmul({"device": "cuda"})
    assert len(out["gpus"]) == torch.cuda.device_count()
    for row in out["gpus"]:
        for dt in probes.MATMUL_DTYPES:
            m = row["dtypes"][dt]
            assert "error" not in m, (dt, m)
            assert m["finite"] and 1.0 < m["tflops"] < 5000, (dt, m)
        # bf16/fp16 tensor cores beat fp32 by a wide margin on anything from Ampere on
        if torch.cuda.get_device_capability(row["index"]) >= (8, 0):
            assert row["dtypes"]["bf16"]["tflops"] > 3 * row["dtypes"]["fp32"]["tflops"]


def test_bandwidth_probe_values_are_sane():
    out = probes.probe_bandwidth({"device": "cuda"})
    for row in out["gpus"]:
        for key in ("h2d_pinned", "d2h_pinned", "h2d_pageable", "d2h_pageable"):
            assert 0.5 < row[key]["gbs"] < 200, (key, row[key])
        assert row["h2d_pinned"]["gbs"] > 0.8 * row["h2d_pageable"]["gbs"]
        assert 100 < row["device_copy"]["gbs"] < 20000, row["device_copy"]


def test_p2p_probe_copies_between_every_pair_both_ways():
    """workload.E016's records on the GPUs at hand: every ordered pair measured, peer access said, bytes right;
    one GPU: the section says there is no pair."""
    out = probes.probe_p2p({"device": "cuda", "bytes": 64 << 20, "measure_s": 0.05})
    n = torch.cuda.device_count()
    if n < 2:
        assert out["skipped"] and out["pairs"] == []
        return
    assert len(out["pairs"]) == n * (n - 1)
    for p in out["pairs"]:
        assert "error" not in p, p
        assert p["ok"] is True and isinstance(p["p2p"], bool) and 1.0 < p["gbs"] < 5000.0, p


def test_amp_probe_numerics_and_speedup_on_gpu():
    out = probes.probe_amp({"device": "cuda"})
    for kind, modes in out["models"].items():
        assert set(modes) == {"fp32", "fp16", "bf16"}
        for mode, r in modes.items():
            assert "error" not in r, (kind, mode, r)
            assert grading.loss_numerics(r["losses"])[0] == "pass", (kind, mode, r["losses"])
        assert grading.scaler_status(modes["fp16"]["skipped"], modes["fp16"]["steps"]) != "fail"
    if torch.cuda.get_device_capability(0) >= (7, 0):
        cnn = out["models"]["cnn"]
        assert cnn["fp16"]["per_s"] > cnn["fp32"]["per_s"]


def test_dataloader_probe_pins_memory_on_gpu():
    out = probes.probe_dataloader({"device": "cuda", "images": 64})
    assert out["pin_memory"] is True
    assert all("error" not in r for r in out["results"].values()), out["results"]
    assert out["best_ips"] > 0


def test_ddp_nccl_on_every_local_gpu():
    n = torch.cuda.device_count()
    if n == 1:
        data = probes.probe_ddp_inprocess({})
        recs = [data]
    else:
        runs = api.launch_local_ddp(sys.executable, n, "nccl", {}, timeout=180)
        assert all(r.ok for r in runs), [(r.error, r.stderr_tail) for r in runs]
        recs = [r.data["data"] for r in runs]
    for d in recs:
        assert d["backend"] == "nccl" and d["allreduce_ok"] and d["ddp_ok"], d
        if n == 1:  # one rank: NCCL's all_reduce moves nothing, so nothing is timed
            assert "busbw_gbs" not in d and d["bw_skipped"]
            continue
        assert math.isfinite(d["algbw_gbs"]) and d["algbw_gbs"] > 0
        assert d["busbw_gbs"] == pytest.approx(grading.busbw(d["algbw_gbs"], n))


def test_default_run_end_to_end_within_budget():
    """The issue's budget: the whole default run on a 1-GPU H100 node in at most 25 s, import torch included."""
    t0 = time.monotonic()
    snapshot = gather(Options(python=sys.executable), {"nvml", "workload"})
    findings = judge(snapshot)
    wall = time.monotonic() - t0
    f = by_id(findings)
    errors = [x for x in findings if x.status == "error"]
    assert not errors, errors
    assert f["workload.E009"].status == "pass", f["workload.E009"]
    assert f["workload.E012"].status == "pass", f["workload.E012"]
    name = torch.cuda.get_device_name(0)
    print(f"\n{name}: default run {wall:.1f} s")
    for x in findings:
        print(f"  {x.status:5} {x.id} {x.message}")
    if torch.cuda.device_count() == 1 and S.lookup(name) and S.lookup(name).key == "h100-sxm":
        assert wall <= 25.0, f"default run took {wall:.1f} s on a 1-GPU H100 (budget 25 s)"


def test_burn_probe_short():
    out = probes.probe_burn({"device": "cuda", "seconds": 3, "n": 4096})
    for g in out["gpus"]:
        assert g["windows"] >= 2 and g["mismatches"] == 0 and g["finite"]
        assert g["tflops_median"] > 1


def test_multinode_path_through_torchrun_on_one_node():
    """The multi-node check's launcher (torchrun, c10d rendezvous) with --nnodes 1 on this node."""
    from hostcheck.child.launch import free_port

    mn = api.MultiNode(nnodes="1", rdzv_endpoint=f"127.0.0.1:{free_port()}", timeout=240)
    r = api.launch_multinode(sys.executable, mn, {})
    assert r.ok, (r.error, r.stderr_tail)
    from hostcheck.gather import Snapshot

    run = api.WorkloadRun(multinode=(r,), multinode_requested=True)
    f = by_id(judge(Snapshot(workload=run)))["workload.E014"]
    assert f.status == "pass", f
    assert len(r.records) == torch.cuda.device_count()
