"""Peers within a node: one GPU slower than the others fails its check even above its SKU's line, with the
numbers in the check's text, in the JSON report's per-GPU quantities and in Prometheus; a healthy node's
ordinary spread never does."""

from __future__ import annotations

import dataclasses
import json

import hostcheck_scenarios as S
import pytest
from workload_runs import by_id, judge_workload

from hostcheck.check.render.prometheus import render_prometheus
from hostcheck.checks import all_checks
from hostcheck.checks.workload import peers as P
from hostcheck.child.launch import ProbeRun
from hostcheck.config import Config, Thresholds
from hostcheck.core import build_report, evaluate
from hostcheck.gather import Options
from hostcheck.gather.workload import WorkloadRun
from hostcheck.report import gpu_records

H100 = "NVIDIA H100 80GB HBM3"
LINK = {"pcie_gen_max": 5, "pcie_width_max": 16, "pcie_gen_current": 5, "pcie_width_current": 16}
#: A healthy 8 x H100 node's ordinary spread: a few percent between GPUs.
JITTER = (1.00, 0.99, 1.01, 0.98, 1.02, 0.995, 1.005, 0.985)


def node_run(bf16=800.0, copy=3050.0, h2d=55.0, slow=None, factor=1.0, figures=("bf16", "copy", "h2d")):
    """An 8-GPU workload run; GPU ``slow`` has ``factor`` x the given figures (the ones in ``figures``)."""
    matmul, bw = [], []
    for i in range(8):
        j = JITTER[i]
        f = factor if i == slow else 1.0
        mm = {
            "bf16": bf16 * j * (f if "bf16" in figures else 1.0),
            "fp16": 760.0 * j,
            "tf32": 410.0 * j,
            "fp32": 50.0 * j,
        }
        matmul.append(
            {"index": i, "name": H100, "dtypes": {k: {"tflops": v, "finite": True} for k, v in mm.items()}}
        )
        pin = h2d * j * (f if "h2d" in figures else 1.0)
        bw.append(
            {
                "index": i,
                "name": H100,
                "h2d_pinned": {"gbs": pin},
                "d2h_pinned": {"gbs": h2d * j},
                "h2d_pageable": {"gbs": 17.0},
                "d2h_pageable": {"gbs": 15.0},
                "device_copy": {"gbs": copy * j * (f if "copy" in figures else 1.0)},
            }
        )
    env = {"cuda_available": True, "gpus": [{"index": i, "name": H100} for i in range(8)]}
    recs = []
    for name, data in (("env", env), ("matmul", {"gpus": matmul}), ("bandwidth", {"gpus": bw})):
        recs += [{"probe": name, "event": "start"}, {"probe": name, "ok": True, "data": data}]
    return WorkloadRun(
        suite=ProbeRun(name="suite", records=tuple(recs)), sections=("env", "matmul", "bandwidth")
    )


LINKS = [dict(LINK, index=i, name=H100) for i in range(8)]


def test_peer_ratio_is_against_the_median_of_the_others():
    ratios = P.peer_ratios({0: 100.0, 1: 100.0, 2: 80.0})
    assert ratios == {0: pytest.approx(100 / 90), 1: pytest.approx(100 / 90), 2: pytest.approx(0.8)}
    assert P.below_peers({0: 100.0, 1: 100.0, 2: 80.0}, 0.10) == {2: pytest.approx(0.8)}
    assert P.below_peers({0: 100.0, 1: 100.0, 2: 91.0}, 0.10) == {}
    assert P.peer_ratios({0: 100.0}) == {}  # one GPU has no peers
    assert P.peer_ratios({0: 100.0, 1: float("nan"), 2: None, 3: 0.0}) == {}  # nothing to compare with


def _judge(run, tolerance=None):
    from workload_runs import WORKLOAD_CHECKS, gpu

    from hostcheck.gather import Snapshot
    from hostcheck.gather.gpuinfo import NvmlSnapshot
    from hostcheck.registry import run_checks

    cfg = Config(thresholds=Thresholds(gpu_peer_tolerance=tolerance)) if tolerance else Config()
    gpus = tuple(gpu(**link) for link in LINKS)
    snap = Snapshot(workload=run, nvml=NvmlSnapshot(gpus=gpus, device_count=8), options=Options(config=cfg))
    return {r.id: r for r in run_checks(WORKLOAD_CHECKS, snap)}


@pytest.mark.parametrize(
    ("figure", "cid"),
    [("bf16", "workload.E001"), ("copy", "workload.E008"), ("h2d", "workload.E005")],
)
def test_one_slow_gpu_fails_even_above_the_sku_line(figure, cid):
    # GPU 4 at 0.86 of its own figures on a fast node: 728 TFLOP/s, 2807 GB/s, 50.9 GB/s clear the SKU's pass
    # lines (0.9 x 780, 0.9 x 3000, 48.2 on gen5 x16), but it is 12% below its peers' median.
    run = node_run(bf16=830.0, copy=3200.0, h2d=58.0, slow=4, factor=0.86, figures=(figure,))
    r = _judge(run)[cid]
    assert r.status.value == "fail", r
    peer_lines = [d for d in r.details if "peers' median" in d]
    assert len(peer_lines) == 1 and peer_lines[0].startswith("GPU 4") and "88% of its peers" in peer_lines[0]
    assert len(r.details) == 8  # one line per GPU, the peer finding on the slow GPU's own line
    assert "below their peers' median" in r.message
    # The SKU line alone passes the same run: with a looser peer tolerance nothing fails.
    assert _judge(run, tolerance=0.2)[cid].status.value == "pass"


@pytest.mark.parametrize("cid", ["workload.E001", "workload.E005", "workload.E006", "workload.E008"])
def test_a_healthy_node_spread_is_never_flagged(cid):
    r = _judge(node_run())[cid]
    assert r.status.value == "pass", r
    assert not any("peers' median" in d for d in r.details)


def test_the_tolerance_comes_from_the_config_file():
    run = node_run(bf16=830.0, slow=4, factor=0.86, figures=("bf16",))
    loose = Config(thresholds=Thresholds(gpu_peer_tolerance=0.15))
    snap = dataclasses.replace(_snapshot(run), options=Options(config=loose))
    results, _ = evaluate(snap, [c for c in all_checks() if c.id == "workload.E001"])
    assert results[0].status.value == "pass"
    results, _ = evaluate(_snapshot(run), [c for c in all_checks() if c.id == "workload.E001"])
    assert results[0].status.value == "fail"


def _snapshot(run):
    return dataclasses.replace(S.make_snapshot(), workload=run)


def test_peer_ratios_reach_json_and_prometheus_with_the_numbers():
    snap = _snapshot(node_run(slow=3, factor=0.6))
    checks = [c for c in all_checks() if c.category == "workload"]
    results, v = evaluate(snap, checks)
    report = build_report(snap, results, v, 0.0, "2026-11-26T09:00:00Z", "full")
    doc = json.loads(json.dumps(report.to_dict()))
    q = {g["index"]: g["quantities"] for g in doc["gpus"]}
    assert q[3]["matmul_bf16_peer_ratio"] == pytest.approx(0.6 * 0.98 / 1.0, abs=0.01)
    assert q[0]["device_copy_peer_ratio"] > 0.95 and q[3]["h2d_pinned_peer_ratio"] < 0.65
    checks_by_id = {c["id"]: c for c in doc["checks"]}
    assert checks_by_id["workload.E001"]["status"] == "fail"
    assert any(
        d.startswith("GPU 3") and "peers' median" in d for d in checks_by_id["workload.E001"]["details"]
    )
    text = render_prometheus(report)
    line = next(
        ln
        for ln in text.splitlines()
        if ln.startswith("hostcheck_gpu_peer_ratio{") and 'gpu="3"' in ln and 'figure="matmul_bf16"' in ln
    )
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(q[3]["matmul_bf16_peer_ratio"])
    assert "# HELP hostcheck_gpu_peer_ratio" in text
    # A healthy node: every ratio near 1 and no check fails.
    healthy = gpu_records(_snapshot(node_run()))
    assert all(0.95 < g.quantities["matmul_bf16_peer_ratio"] < 1.05 for g in healthy)


def test_a_node_at_40_percent_of_healthy_fails_the_sku_lines():
    """Every GPU equally slow has no slower peer: the SKU lines catch it (the device copy's line is an estimate:
    it warns, and says so)."""
    run = node_run(bf16=794.5 * 0.4, copy=2540 * 0.4, h2d=54 * 0.4)
    f = by_id(judge_workload(run, LINKS))
    for cid in ("workload.E001", "workload.E005", "workload.E008"):
        assert f[cid].status == ("warn" if cid == "workload.E008" else "fail"), f[cid]
        assert not any("peers' median" in d for d in f[cid].details)
    assert "only an estimate" in f["workload.E008"].message


def test_config_file_sets_the_tolerances_and_refuses_nonsense(tmp_path):
    from hostcheck import config

    path = tmp_path / "hostcheck.toml"
    path.write_text("[thresholds]\ngpu_peer_tolerance = 0.2\nfleet_peer_tolerance = 0.05\n")
    c = config.load(str(path), explicit=True)
    assert (c.thresholds.gpu_peer_tolerance, c.thresholds.fleet_peer_tolerance) == (0.2, 0.05)
    assert (Thresholds().gpu_peer_tolerance, Thresholds().fleet_peer_tolerance) == (0.1, 0.1)
    for bad in ("gpu_peer_tolerance = 1.5", "fleet_peer_tolerance = 0", "gpu_peer_tolerance = 'x'"):
        path.write_text(f"[thresholds]\n{bad}\n")
        with pytest.raises(config.ConfigError):
            config.load(str(path), explicit=True)
