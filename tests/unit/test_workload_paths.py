"""workload.E016, GPU-to-GPU copy bandwidth for every pair: the records the p2p probe writes, judged through the
registered check with each fault planted and absent, and the probe's code on the CPU."""

from __future__ import annotations

import json

import pytest
from workload_runs import judge_one

from hostcheck.checks.workload import sku as S
from hostcheck.child.launch import ProbeRun
from hostcheck.gather.workload import WorkloadRun
from hostcheck.registry import Status

H100 = "NVIDIA H100 80GB HBM3"
L40S = "NVIDIA L40S"
NVLINK = {"nvlink_active": 18}


def run_of(p2p: dict, name: str = H100, n: int = 8) -> WorkloadRun:
    env = {"cuda_available": True, "gpus": [{"index": i, "name": name} for i in range(n)]}
    recs = []
    for section, data in (("env", env), ("p2p", p2p)):
        recs += [{"probe": section, "event": "start"}, {"probe": section, "ok": True, "data": data}]
    return WorkloadRun(suite=ProbeRun(name="suite", records=tuple(recs)), sections=("env", "p2p"))


def pairs_record(n: int = 8, gbs: float = 372.0, name: str = H100, **planted) -> dict:
    """What probe_p2p writes for ``n`` GPUs, every pair at ``gbs``; ``planted``: "src-dst" -> fields to set."""
    pairs = []
    for s in range(n):
        for d in range(n):
            if s != d:
                row = {"src": s, "dst": d, "p2p": True, "gbs": gbs, "gbs_max": gbs * 1.01, "bytes": 1 << 28}
                row.update({"batches": 3, "ok": True}, **planted.get(f"{s}-{d}", {}))
                pairs.append(row)
    return {"gpus": list(range(n)), "names": [name] * n, "pairs": pairs}


def gpus(n: int = 8, name: str = H100, **kw) -> list[dict]:
    return [dict(index=i, name=name, **{**NVLINK, **kw}) for i in range(n)]


def judge(record: dict, name: str = H100, n: int = 8, **gpu_kw):
    return judge_one(run_of(record, name, n), "workload.E016", gpus(n, name, **gpu_kw))


def test_the_line_is_azures_public_p2p_figure_per_sku():
    line = S.peer_copy_line(H100)
    assert line is not None and line.gbs == 335.0 and line.warn_band == 1.05 and line.basis == "public"
    assert (
        line.source == "https://github.com/Azure/azurehpc-health-checks/blob/main/conf/nd96isr_h100_v5.conf"
    )
    assert S.peer_copy_line("NVIDIA H200").gbs == 335.0 and S.peer_copy_line("NVIDIA H100 NVL").gbs == 335.0
    assert (
        S.peer_copy_line(L40S) is None and S.peer_copy_line("NVIDIA A100-SXM4-80GB") is None
    )  # never extrapolated


def test_a_healthy_8_gpu_node_passes_with_the_slowest_pair_as_value():
    r = judge(pairs_record())
    assert r.status == Status.PASS and r.value == 372.0 and r.unit == "GB/s"
    assert "56 GPU pairs" in r.message and "335" in r.expected and r.hint is None
    json.dumps(r.to_dict())


def test_a_pair_below_the_line_fails_and_is_named():
    r = judge(pairs_record(**{"3-5": {"gbs": 180.0}}))
    assert r.status == Status.FAIL and r.value == 180.0
    assert "GPU 3 -> GPU 5" in r.message and any("GPU 3 -> GPU 5: 180.0 GB/s" in d for d in r.details)
    assert any("below the line 335" in d for d in r.details) and "nvlink" in r.hint
    assert not any("GPU 5 -> GPU 3" in d for d in r.details)  # the other direction is healthy


def test_a_pair_within_the_warn_band_warns():
    r = judge(pairs_record(gbs=372.0, **{"0-1": {"gbs": 340.0}}))
    assert r.status == Status.WARN and any("within 5% of the line" in d for d in r.details)


def test_peer_access_off_is_said_and_its_slow_copy_fails():
    r = judge(pairs_record(**{"2-6": {"gbs": 21.0, "p2p": False}}))
    assert r.status == Status.FAIL and any("peer access OFF" in d for d in r.details)
    assert "peer access OFF" not in " ".join(judge(pairs_record()).details)


def test_wrong_bytes_fail_and_a_copy_that_raised_is_an_error_never_a_fail():
    assert judge(pairs_record(**{"1-0": {"ok": False}})).status == Status.FAIL
    r = judge(
        pairs_record(**{"4-7": {"error": "RuntimeError: CUDA error: an illegal memory access", "gbs": None}})
    )
    assert r.status == Status.ERROR and any(
        "GPU 4 -> GPU 7: not measured (RuntimeError" in d for d in r.details
    )


def test_without_a_sku_line_or_nvlink_a_slow_pair_only_warns_against_its_peers():
    planted = {"1-3": {"gbs": 20.0}}
    # L40S: no public line, a pair far below the others warns (never fails).
    r = judge(pairs_record(n=4, gbs=25.0, name=L40S, **planted), name=L40S, n=4, nvlink_active=0)
    assert r.status == Status.WARN and "other pairs" in r.expected
    assert any("of its peers' median" in d for d in r.details)
    assert (
        judge(pairs_record(n=4, gbs=25.0, name=L40S), name=L40S, n=4, nvlink_active=0).status == Status.PASS
    )
    # H100 whose NVML shows no active NVLink: the NVLink line does not apply, the peer rule does.
    r = judge(pairs_record(gbs=50.0, **planted), nvlink_active=0)
    assert r.status == Status.WARN


def test_one_gpu_skips_and_a_suite_that_died_is_an_error():
    r = judge({"skipped": "1 CUDA GPU: no pair to measure", "pairs": []}, n=1)
    assert r.status == Status.SKIP and "no pair" in r.message
    died = WorkloadRun(
        suite=ProbeRun(
            name="suite", records=({"probe": "p2p", "event": "start"},), error="timed out after 60 s"
        ),
        sections=("env", "p2p"),
    )
    r = judge_one(died, "workload.E016", gpus())
    assert r.status == Status.ERROR and "during p2p" in r.message
    not_selected = WorkloadRun(suite=ProbeRun(name="suite", records=()), sections=("env",))
    assert judge_one(not_selected, "workload.E016", gpus()).status == Status.SKIP


def test_the_probe_code_on_the_cpu():
    """The pair timing runs on any two torch devices (here the CPU twice: the code path, not a figure); the
    section itself needs two CUDA GPUs and says so without them."""
    torch = pytest.importorskip("torch")
    from hostcheck.inside import workload as probes

    cpu = torch.device("cpu")
    got = probes.pair_rate(torch, cpu, cpu, 1 << 20, 0.01, 0.02)
    assert got["gbs"] > 0 and got["ok"] is True and got["bytes"] == 1 << 20 and got["batches"] >= 3
    out = probes.probe_p2p({"device": "cpu"})
    assert out == {"skipped": "0 CUDA GPUs: no pair to measure", "pairs": []}
    assert "p2p" in probes.SECTIONS
