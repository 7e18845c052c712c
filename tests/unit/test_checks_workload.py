"""Pure judging of the workload checks: thresholds, formulas, SKU table, findings from recorded runs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from workload_runs import H100, WORKLOAD_IDS, ddp_single, gpu_suite, judge_workload, rank_runs, suite

from hostcheck.checks.workload import grading
from hostcheck.checks.workload import sku as S
from hostcheck.child.launch import ProbeRun
from hostcheck.gather.workload import WorkloadRun
from hostcheck.registry import worst

# ------------------------------------------------------------------------------------------ thresholds


@pytest.mark.parametrize(
    ("fraction", "status"),
    [(1.2, "pass"), (0.90, "pass"), (0.8999, "warn"), (0.75, "warn"), (0.7499, "fail"), (0.0, "fail")],
)
def test_fraction_of_achievable_thresholds(fraction, status):
    assert grading.fraction_status(fraction) == status


def test_judge_fraction_scores_by_fraction_and_estimates_never_fail():
    assert grading.judge_fraction(702, 780) == ("pass", pytest.approx(0.9))
    assert grading.judge_fraction(700, 780)[0] == "warn"
    assert grading.judge_fraction(500, 780)[0] == "fail"
    assert grading.judge_fraction(500, 780, estimate=True)[0] == "warn"
    assert grading.judge_fraction(500, None) == (None, None)  # unknown SKU: measured, no verdict
    assert grading.judge_fraction(None, 780) == (None, None)


def test_busbw_formula():
    assert grading.busbw(100.0, 1) == 0.0
    assert grading.busbw(100.0, 2) == pytest.approx(100.0)
    assert grading.busbw(100.0, 4) == pytest.approx(150.0)
    assert grading.busbw(100.0, 8) == pytest.approx(175.0)
    assert grading.algbw(256 * 2**20, 0.002) == pytest.approx(134.2177, rel=1e-4)
    with pytest.raises(ValueError):
        grading.busbw(1.0, 0)


def test_pcie_theoretical_per_generation_and_width():
    assert grading.pcie_theoretical_gbs(1, 1) == pytest.approx(0.25)
    assert grading.pcie_theoretical_gbs(2, 16) == pytest.approx(8.0)
    assert grading.pcie_theoretical_gbs(3, 16) == pytest.approx(15.754, rel=1e-3)
    assert grading.pcie_theoretical_gbs(4, 16) == pytest.approx(31.508, rel=1e-3)
    assert grading.pcie_theoretical_gbs(5, 16) == pytest.approx(63.015, rel=1e-3)
    assert grading.pcie_theoretical_gbs(5, 8) == pytest.approx(31.508, rel=1e-3)
    assert grading.pcie_theoretical_gbs(None, 16) is None
    assert grading.pcie_theoretical_gbs(9, 16) is None


def test_pinned_expectation_matches_the_reference_node_and_azure_floor():
    ach = grading.pinned_achievable_gbs(5, 16)
    # Reference H100: 54 GB/s pinned on gen5 x16 passes; Azure's 48 GB/s floor sits on our pass line.
    assert grading.judge_fraction(54.0, ach)[0] == "pass"
    assert grading.DEFAULT.achievable_pass_fraction * ach == pytest.approx(48.2, abs=0.1)
    assert grading.judge_fraction(45.0, ach)[0] == "warn"
    assert grading.judge_fraction(27.0, ach)[0] == "fail"  # a gen5 x8 link's worth


def test_busbw_thresholds_by_interconnect():
    assert grading.busbw_status(200, 8, nvlink=True) == "pass"
    assert grading.busbw_status(185, 8, nvlink=True) == "warn"  # within 1.05 x 180
    assert grading.busbw_status(150, 8, nvlink=True) == "fail"
    assert grading.busbw_status(20, 2, nvlink=False) == "pass"
    assert grading.busbw_status(17, 2, nvlink=False) == "fail"
    assert grading.busbw_status(0.0, 1, nvlink=True) is None  # one GPU: nothing to judge
    assert grading.busbw_status(200, 8, nvlink=None) is None


def test_amp_scaler_and_loss_rules():
    assert grading.amp_speedup_status(3.1) == "pass"
    assert grading.amp_speedup_status(1.1) == "warn"
    assert grading.amp_speedup_status(0.9) == "fail"
    assert grading.scaler_status(0, 8) == "pass"
    assert grading.scaler_status(5, 8) == "warn"
    assert grading.scaler_status(8, 8) == "fail"
    assert grading.loss_numerics([2.3, 2.1, 1.9])[0] == "pass"
    assert grading.loss_numerics([2.3, 2.4])[0] == "fail"
    assert grading.loss_numerics([2.3, float("nan"), 1.0])[0] == "fail"
    assert grading.loss_numerics([2.3, float("inf")])[0] == "fail"
    assert grading.loss_numerics([2.3])[0] == "error"


def test_worst():
    assert worst([]) == "skip"
    assert worst(["pass", "skip"]) == "pass"
    assert worst(["pass", "warn", "fail"]) == "fail"
    assert worst(["fail", "error"]) == "error"


# ------------------------------------------------------------------------------------------------ SKUs


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA A100-SXM4-40GB", "a100-sxm-40"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm-80"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie-40"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA A10", "a10"),
        ("Tesla V100-SXM2-32GB", "v100-sxm2"),
        ("Tesla V100-PCIE-16GB", "v100-pcie"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA GeForce RTX 3090", "rtx-3090"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB200", "gb200"),
    ],
)
def test_sku_lookup(name, key):
    assert S.lookup(name).key == key


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA A10G",
        "NVIDIA L40",
        "NVIDIA B100",
        "Quadro RTX 8000",
        # NVML's names of other parts that hold a known one's name: Grace Hopper is no H200 and no H100 SXM
        # (other memory, NVLink-C2C), A800/H800 are export parts with less NVLink, V100S and 4090 D other bins.
        "NVIDIA GH200 480GB",
        "NVIDIA GH200 144G HBM3e",
        "NVIDIA A800-SXM4-80GB",
        "NVIDIA H800",
        "Tesla V100S-PCIE-32GB",
        "NVIDIA GeForce RTX 4090 D",
        "NVIDIA GeForce RTX 3090 Ti",
        "",
        None,
    ],
)
def test_unknown_sku_has_no_reference(name):
    """A name no row matches exactly is an unknown SKU: no absolute line of any kind (peers only)."""
    assert S.lookup(name) is None
    assert S.matmul_figure(name, "bf16") is None and S.copy_figure(name) is None
    assert (
        S.allreduce_line(name, 8) is None and S.peer_copy_line(name) is None and S.nvlink_line(name) is None
    )


def test_every_figure_cites_a_source_and_is_plausible():
    for _, sku in S.SKUS:
        figs = list(sku.matmul.items())
        assert figs, sku.key
        for dt, fig in figs:
            assert dt in S.DTYPES and fig.source and fig.basis in (S.MEASURED, S.PUBLISHED, S.ESTIMATE)
            assert 5 < fig.value < 2500, (sku.key, dt, fig)
        assert sku.copy_gbs and sku.copy_gbs.source and 200 < sku.copy_gbs.value < 8000


def test_the_h100_figures_say_where_they_come_from():
    """Nothing was measured by this project: H100 SXM's bf16 is ml-engineering's published figure (it can fail),
    the rest are estimates from the datasheet (they warn only)."""
    bf16 = S.matmul_figure("NVIDIA H100 80GB HBM3", "bf16")
    assert (bf16.value, bf16.basis) == (
        794.5,
        S.PUBLISHED,
    ) and "github.com/stas00/ml-engineering" in bf16.source
    assert S.matmul_figure("NVIDIA H100 80GB HBM3", "fp16").basis == S.ESTIMATE
    copy = S.copy_figure("NVIDIA H100 80GB HBM3")
    assert (copy.value, copy.basis) == (2540.0, S.ESTIMATE)
    assert not [f for _, s in S.SKUS for f in (*s.matmul.values(), s.copy_gbs) if f.basis == S.MEASURED]
    assert grading.judge_fraction(766, 794.5)[0] == "pass"
    assert S.matmul_figure("Tesla V100-SXM2-16GB", "bf16") is None  # no bf16 fast path


# --------------------------------------------------------------------------------- findings from runs

LINK_OK = {
    "pcie_gen_max": 5,
    "pcie_width_max": 16,
    "pcie_gen_current": 5,
    "pcie_width_current": 16,
    "nvlink_active": 18,
    "numa_node": 0,
}


def by_id(findings):
    return {f.id: f for f in findings}


def test_reference_h100_node_passes_everything_it_ran():
    run = WorkloadRun(suite=gpu_suite(ddp=ddp_single()), ddp_mode="in-suite")
    findings = judge_workload(run, [dict(LINK_OK, index=0, name=H100)])
    assert [f.id for f in findings] == WORKLOAD_IDS
    f = by_id(findings)
    for cid in (
        "E001",
        "E002",
        "E003",
        "E004",
        "E005",
        "E006",
        "E007",
        "E008",
        "E009",
        "E010",
        "E011",
        "E012",
    ):
        assert f["workload." + cid].status == "pass", f["workload." + cid]
    assert f["workload.E001"].value == 766.0 and f["workload.E001"].unit == "TFLOP/s"
    assert "794.5" in f["workload.E001"].expected and "published" in f["workload.E001"].expected
    assert f["workload.E010"].value == pytest.approx(3.0)  # the worse model (CNN) counts
    assert f["workload.E013"].status == "skip" and "one GPU" in f["workload.E013"].message
    assert f["workload.E014"].status == "skip" and f["workload.E015"].status == "skip"
    json.dumps([x.to_dict() for x in findings])


def test_slow_matmul_and_unknown_sku():
    run = WorkloadRun(suite=gpu_suite(tflops={"bf16": 600.0, "fp16": 500.0}), ddp_mode="")
    f = by_id(judge_workload(run))
    assert f["workload.E001"].status == "warn" and f["workload.E001"].hint  # 600/794.5 = 0.76
    # 500/794.5 = 0.63 of an estimate: far below it warns (never a silent pass), and says the line is an estimate.
    e2 = f["workload.E002"]
    assert e2.status == "warn" and "only an estimate" in e2.message and "estimate" in e2.expected
    assert f["workload.E003"].status == "skip"  # not measured
    run = WorkloadRun(suite=gpu_suite(name="NVIDIA B300"))
    f = by_id(judge_workload(run))
    assert f["workload.E001"].status == "skip" and f["workload.E001"].value == 766.0
    assert "no verdict" in f["workload.E001"].message
    assert "unknown SKU 'NVIDIA B300': no line of its own" in f["workload.E001"].details[0]
    assert f["workload.E008"].status == "skip" and "unknown SKU" in f["workload.E008"].details[0]


def test_amp_details_say_the_cnn_baseline_uses_tf32_convolutions():
    s = gpu_suite()
    amp = next(r for r in s.records if r.get("probe") == "amp" and "data" in r)["data"]
    f = by_id(judge_workload(WorkloadRun(suite=s)))
    assert not any("TF32" in d for d in f["workload.E010"].details)
    amp["conv_tf32"] = True
    f = by_id(judge_workload(WorkloadRun(suite=s)))
    assert any("convolutions in TF32" in d for d in f["workload.E010"].details)


def test_tf32_forced_off_is_named_in_the_hint():
    s = gpu_suite(tflops={"bf16": 766.0, "fp16": 745.0, "tf32": 50.0, "fp32": 49.0})
    s.records[1]["data"]["precision_env"] = {"NVIDIA_TF32_OVERRIDE": "0"}  # TF32 runs at fp32 speed
    f = by_id(judge_workload(WorkloadRun(suite=s)))
    # 50 of tf32's 397.2, an estimate: a warning that names the variable, not a fail.
    assert f["workload.E003"].status == "warn" and "NVIDIA_TF32_OVERRIDE=0" in f["workload.E003"].hint
    assert f["workload.E001"].hint is None  # bf16 is fine and untouched by it


def test_worst_gpu_decides_and_each_gpu_is_listed():
    s = gpu_suite(n=2)
    rows = s.records[3]["data"]["gpus"]
    rows[1]["dtypes"]["bf16"]["tflops"] = 400.0
    f = by_id(judge_workload(WorkloadRun(suite=s)))
    assert f["workload.E001"].status == "fail" and f["workload.E001"].value == 400.0
    assert len(f["workload.E001"].details) == 2


def test_pinned_far_below_the_link_fails_with_a_width_hint():
    link = dict(LINK_OK, index=0, pcie_width_current=8, numa_node=1)
    f = by_id(judge_workload(WorkloadRun(suite=gpu_suite(h2d=26.0)), [link]))
    e5 = f["workload.E005"]
    assert e5.status == "fail" and e5.value == 26.0
    assert "x8 of x16" in e5.hint and "IOMMU" in e5.hint and "NUMA" in e5.hint and "node 1" in e5.hint
    assert "48.2" in e5.expected
    # Without NVML link facts: measured, no verdict.
    f = by_id(judge_workload(WorkloadRun(suite=gpu_suite(h2d=26.0)), []))
    assert f["workload.E005"].status == "skip" and f["workload.E005"].value == 26.0


def test_amp_numerics_and_no_speedup_findings():
    bad = {
        "device": "cuda:0",
        "models": {
            "cnn": {
                "fp32": {"losses": [2.4, 2.2], "per_s": 1000.0, "skipped": 0, "steps": 2},
                "fp16": {"losses": [2.4, float("nan")], "per_s": 900.0, "skipped": 2, "steps": 2},
            },
            "transformer": {"fp32": {"error": "RuntimeError: CUDA error"}},
        },
    }
    f = by_id(judge_workload(WorkloadRun(suite=gpu_suite(amp=bad))))
    assert f["workload.E009"].status == "error"
    assert (
        "non-finite" in f["workload.E009"].message
        and "GradScaler skipped 2 of 2" in f["workload.E009"].message
    )
    assert f["workload.E010"].status == "fail" and f["workload.E010"].value == pytest.approx(0.9)


def test_dataloader_worker_crash_points_at_shm():
    dl = {
        "cpus": 16,
        "results": {
            "0": {"ips": 300.0},
            "8": {"error": "RuntimeError: DataLoader worker (pid 7) is killed by signal: Bus error."},
        },
        "best_workers": 0,
        "best_ips": 300.0,
        "zero_ips": 300.0,
        "shm_bytes": 64 * 2**20,
    }
    f = by_id(judge_workload(WorkloadRun(suite=gpu_suite(dl=dl))))
    assert f["workload.E011"].status == "fail" and "/dev/shm is 64 MiB" in f["workload.E011"].hint
    dl = dict(dl, results={"0": {"ips": 300.0}, "8": {"ips": 310.0}}, best_workers=8, best_ips=310.0)
    assert by_id(judge_workload(WorkloadRun(suite=gpu_suite(dl=dl))))["workload.E011"].status == "warn"


def test_multi_gpu_busbw_judged_by_interconnect():
    links = [dict(LINK_OK, index=i, name=H100) for i in range(8)]
    run = WorkloadRun(suite=gpu_suite(n=8), ddp_mode="nccl", ddp=rank_runs(8, 150.0))
    f = by_id(judge_workload(run, links))
    assert f["workload.E012"].status == "pass"
    assert f["workload.E013"].status == "fail" and "NVLink" in f["workload.E013"].message
    pcie = [dict(LINK_OK, index=i, nvlink_active=0) for i in range(8)]
    assert by_id(judge_workload(run, pcie))["workload.E013"].status == "pass"
    assert by_id(judge_workload(run, []))["workload.E013"].status == "skip"


def test_an_unknown_sku_gets_no_absolute_all_reduce_line():
    """Meta GCM's generic 180 GB/s NVLink floor fails only a SKU whose datasheet NVLink can reach it: an unknown
    SKU (here an H800-class name) and a V100 SXM2 (150 GB/s one way) only warn below it, and say why."""
    run = WorkloadRun(suite=gpu_suite(n=8), ddp_mode="nccl", ddp=rank_runs(8, 150.0))
    for name, said in (("NVIDIA H800", "unknown SKU"), ("Tesla V100-SXM2-32GB", "cannot reach")):
        links = [dict(LINK_OK, index=i, name=name) for i in range(8)]
        e13 = by_id(judge_workload(run, links))["workload.E013"]
        assert e13.status == "warn" and said in e13.message and "not a fail" in e13.message, e13


def test_ddp_wrong_sum_fails_and_hang_fails():
    run = WorkloadRun(suite=gpu_suite(n=2), ddp_mode="nccl", ddp=rank_runs(2, 50.0, ok=False))
    assert by_id(judge_workload(run))["workload.E012"].status == "fail"
    hung = (ProbeRun(name="ddp[0]", error="timed out after 120 s and was killed", timed_out=True),)
    f = by_id(judge_workload(WorkloadRun(suite=gpu_suite(n=1), ddp_mode="nccl", ddp=hung)))
    assert f["workload.E012"].status == "fail" and "hung" in f["workload.E012"].message
    assert "NCCL_DEBUG=INFO" in f["workload.E012"].hint
    assert f["workload.E013"].status == "error"
    crashed = (
        ProbeRun(name="ddp[0]", error="crashed (exit 1): NCCL error", rc=1),
        ProbeRun(name="ddp[1]", error="killed 10 s after a peer process failed", timed_out=True, rc=-9),
    )
    f = by_id(judge_workload(WorkloadRun(suite=gpu_suite(n=2), ddp_mode="nccl", ddp=crashed)))
    assert f["workload.E012"].status == "error" and "NCCL error" in f["workload.E012"].message


def test_burn_findings():
    def burn(gpus):
        return ProbeRun(
            name="burn", records=({"probe": "burn", "ok": True, "data": {"seconds": 60, "gpus": gpus}},)
        )

    ok = {
        "device": "cuda:0",
        "tflops_first": 700,
        "tflops_last": 690,
        "tflops_min": 680,
        "tflops_median": 695,
        "windows": 60,
        "mismatches": 0,
        "finite": True,
    }
    run = WorkloadRun(suite=gpu_suite(), burn=burn([ok]), burn_requested=60)
    assert by_id(judge_workload(run))["workload.E015"].status == "pass"
    hot = dict(ok, tflops_last=500, tflops_min=480)
    run = WorkloadRun(suite=gpu_suite(), burn=burn([hot]), burn_requested=60)
    assert by_id(judge_workload(run))["workload.E015"].status == "warn"
    sdc = dict(ok, mismatches=2)
    run = WorkloadRun(suite=gpu_suite(), burn=burn([sdc]), burn_requested=60)
    assert by_id(judge_workload(run))["workload.E015"].status == "fail"


def test_multinode_finding():
    recs = tuple(
        {
            "probe": "ddp_worker",
            "ok": True,
            "data": {"rank": r, "world": 16, "allreduce_ok": True, "ddp_ok": True, "busbw_gbs": 90.0},
        }
        for r in range(8)
    )
    run = WorkloadRun(
        suite=gpu_suite(), multinode=(ProbeRun(name="mn", records=recs),), multinode_requested=True
    )
    f = by_id(judge_workload(run))["workload.E014"]
    assert f.status == "pass" and "world 16" in f.message and f.value == 90.0
    bad = ProbeRun(name="mn", error="timed out after 300 s and was killed", timed_out=True)
    run = WorkloadRun(suite=gpu_suite(), multinode=(bad,), multinode_requested=True)
    f = by_id(judge_workload(run))["workload.E014"]
    assert f.status == "fail" and "rendezvous" in f.hint
    crashed = ProbeRun(
        name="mn",
        error="crashed (exit 1): hostcheck/inside/workload.py FAILED",
        rc=1,
        stderr_tail="Root Cause (first observed failure):\n[0]:\n  exitcode  : 1 (pid: 77)\n====",
    )
    run = WorkloadRun(suite=gpu_suite(), multinode=(crashed,), multinode_requested=True)
    f = by_id(judge_workload(run))["workload.E014"]
    assert f.status == "error" and "  exitcode  : 1 (pid: 77)" in f.details  # torchrun's report, kept
    raised = replace(
        crashed, records=({"probe": "ddp_worker", "ok": False, "error": "DistStoreError: wait timeout"},)
    )
    run = WorkloadRun(suite=gpu_suite(), multinode=(raised,), multinode_requested=True)
    f = by_id(judge_workload(run))["workload.E014"]
    assert "rank error: DistStoreError: wait timeout" in f.message  # the rank's own reason comes first


# ------------------------------------------------------------------------------------------ NVML side


def test_nvml_counts_active_nvlinks_per_gpu(scenarios):
    """The busbw floor depends on the interconnect: the NVML gatherer counts each GPU's active links."""
    from hostcheck.gather.base import GPU_LOST
    from hostcheck.gather.nvml import gather_nvml

    gpus = [scenarios.h100_gpu(0), scenarios.h100_gpu(1, nvlinks=None), scenarios.h100_gpu(2, nvlinks=4)]
    snap = gather_nvml(nvml=scenarios.FakeNvml(gpus), proc_name=str)
    assert [g.nvlink_active for g in snap.gpus] == [18, 0, 4]  # PCIe-only: NOT_SUPPORTED on link 0 is 0
    lost = gather_nvml(nvml=scenarios.FakeNvml(gpus, fail={"nvmlDeviceGetNvLinkState@1": 15}), proc_name=str)
    assert lost.gpus[1].nvlink_active.kind == GPU_LOST and lost.gpus[1].lost is not None
    # The judging reads them: eight NVLink GPUs at PCIe speed fail, the same on PCIe-only GPUs pass.
    run = WorkloadRun(suite=gpu_suite(n=8), ddp_mode="nccl", ddp=rank_runs(8, 150.0))
    nv = gather_nvml(nvml=scenarios.FakeNvml([scenarios.h100_gpu(i) for i in range(8)]), proc_name=str)
    assert by_id(judge_workload(run, list(nv.gpus)))["workload.E013"].status == "fail"


def test_sections_not_selected_are_skipped_not_errors():
    run = WorkloadRun(
        suite=suite(env={"cuda_available": True}, matmul={"gpus": []}), sections=("env", "matmul")
    )
    f = by_id(judge_workload(run))
    assert f["workload.E009"].status == "skip" and "not selected" in f["workload.E009"].message
    assert f["workload.E012"].status == "skip"
    assert all(x.status != "error" for x in f.values()), [x for x in f.values() if x.status == "error"]
