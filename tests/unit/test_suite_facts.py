"""The workload's typed per-GPU facts (hostcheck.gather.suite): read once from the suite's raw records, and what
the checks judge and the report publishes alike. Hostile figures become "not measured", never a value."""

from __future__ import annotations

import pytest
from workload_runs import by_id, gpu, judge_workload

from hostcheck.child.launch import ProbeRun
from hostcheck.gather import suite
from hostcheck.gather.workload import WorkloadRun

H100 = "NVIDIA H100 80GB HBM3"


def suite_run(**sections) -> ProbeRun:
    recs = []
    for name, data in sections.items():
        recs += [{"probe": name, "event": "start"}, {"probe": name, "ok": True, "data": data}]
    return ProbeRun(name="suite", records=tuple(recs))


ENV = {"cuda_available": True, "gpus": [{"index": 0, "pci_bus_id": "0000:18:00.0"}, {"index": 1}]}
HOSTILE = (float("nan"), "fast", True, 10**400, {"x": [1]}, None)


def run_with(bf16_of_gpu1, copy_of_gpu1, **more) -> WorkloadRun:
    matmul = {
        "gpus": [
            {"index": 0, "name": H100, "dtypes": {"bf16": {"tflops": 700, "n": 8192}}},
            {"index": 1, "name": H100, "dtypes": {"bf16": {"tflops": bf16_of_gpu1, "n": 8192}}},
            "not a row",
        ]
    }
    bandwidth = {
        "gpus": [
            {"index": 0, "name": H100, "device_copy": {"gbs": 2900.0, "bytes": 1 << 30}},
            {"index": 1, "name": H100, "device_copy": {"gbs": copy_of_gpu1, "bytes": 1 << 30}},
        ]
    }
    return WorkloadRun(suite=suite_run(env=ENV, matmul=matmul, bandwidth=bandwidth), **more)


@pytest.mark.parametrize("bad", HOSTILE, ids=lambda v: type(v).__name__)
def test_a_hostile_figure_is_not_measured_for_the_checks_and_the_report_alike(bad):
    run = run_with(bad, bad)
    (row0, row1) = run.matmul.rows  # the row that is no object is left out
    assert row0.figure("bf16") == suite.Measured(value=700.0, size=8192)
    assert row1.figure("bf16").value is None and run.bandwidth.rows[1].figure("device_copy").value is None
    figures = {d.index: d for d in run.devices}
    assert "bf16" not in figures.get(1, suite.DeviceFigures(1)).matmul_flops_per_second
    assert figures[0].matmul_flops_per_second == {"bf16": 700e12} and figures[0].pci_bus_id == "0000:18:00.0"
    r = by_id(judge_workload(run, [gpu(0, name=H100), gpu(1, name=H100)]))
    assert r["workload.E001"].value == 700.0 and "1 measured" in r["workload.E001"].message
    assert r["workload.E008"].value == 2900.0


def test_a_measured_figure_is_the_same_number_in_the_check_and_the_report():
    # Absent: GPU 1's figures are numbers, so both judge and publish them (in the record's unit, in base units).
    run = run_with(350, 1000.0)
    assert run.matmul.rows[1].figure("bf16") == suite.Measured(value=350.0, size=8192)
    figures = {d.index: d for d in run.devices}
    assert figures[1].matmul_flops_per_second["bf16"] == 350e12
    assert figures[1].copy_bytes_per_second["device_copy"] == 1000e9
    r = by_id(judge_workload(run, [gpu(0, name=H100), gpu(1, name=H100)]))
    assert r["workload.E001"].value == 350.0 and r["workload.E001"].status == "fail"
    assert r["workload.E008"].value == 1000.0 and r["workload.E008"].status == "fail"


def test_a_figure_keeps_its_error_text_and_finiteness():
    matmul = {
        "gpus": [
            {"index": 0, "dtypes": {"bf16": {"error": "CUDA OOM"}, "fp16": {"tflops": 1, "finite": False}}}
        ]
    }
    row = WorkloadRun(suite=suite_run(env=ENV, matmul=matmul)).matmul.rows[0]
    assert row.figure("bf16") == suite.Measured(error="CUDA OOM")
    assert row.figure("fp16") == suite.Measured(value=1.0, finite=False)
    assert row.figure("tf32") is suite.NO_MEASURE


def test_each_fact_is_read_once_from_the_records(monkeypatch):
    reads: list[str] = []
    real = suite.suite_section
    monkeypatch.setattr(suite, "suite_section", lambda run, name: reads.append(name) or real(run, name))
    run = run_with(350, 1000.0)
    judge_workload(run, [gpu(0, name=H100), gpu(1, name=H100)])
    assert run.devices and run.matmul is run.matmul
    assert {"env", "matmul", "bandwidth", "amp"} <= set(reads) and len(reads) == len(set(reads)), reads


def burn_run(**row) -> WorkloadRun:
    base = {
        "device": "cuda:0",
        "tflops_first": 700,
        "tflops_last": 690,
        "tflops_min": 680,
        "tflops_median": 695,
    }
    recs = ({"probe": "burn", "ok": True, "data": {"seconds": 60, "gpus": [dict(base, windows=60, **row)]}},)
    return WorkloadRun(suite=suite_run(env=ENV), burn=ProbeRun(name="burn", records=recs), burn_requested=60)


@pytest.mark.parametrize("garbage", ["2", [1], {"n": 1}])
def test_a_burn_mismatch_count_that_is_no_number_fails_it(garbage):
    run = burn_run(mismatches=garbage)
    assert run.burn_result.rows[0].finite is False
    assert by_id(judge_workload(run))["workload.E015"].status == "fail"


def test_a_clean_burn_count_passes():
    run = burn_run(mismatches=0, finite=True)
    assert run.burn_result.rows[0] == suite.BurnRow(
        device="cuda:0", first=700.0, last=690.0, lowest=680.0, median=695.0, mismatches=0, windows=60
    )
    result = by_id(judge_workload(run))["workload.E015"]
    assert result.status == "pass" and result.message.startswith("60 s of matmul stress")


def ddp_rank(index: int, **data) -> ProbeRun:
    rec = {"probe": "ddp_worker", "ok": True, "data": {"rank": index, "world": 2, "backend": "nccl", **data}}
    return ProbeRun(name=f"ddp{index}", records=(rec,))


def test_a_rank_result_is_read_once_and_a_diverged_loss_is_shown_as_it_was():
    ok = {"allreduce_ok": True, "ddp_ok": True, "ddp_loss": 0.5, "busbw_gbs": 300.0, "bw_bytes": 1 << 30}
    run = WorkloadRun(suite=suite_run(env=ENV), ddp_mode="nccl", ddp=(ddp_rank(0, **ok), ddp_rank(1, **ok)))
    assert run.ddp_results.ranks[0] == suite.RankResult(
        rank=0,
        world=2,
        backend="nccl",
        allreduce_ok=True,
        ddp_ok=True,
        ddp_loss=0.5,
        busbw_gbs=300.0,
        bw_bytes=1 << 30,
    )
    assert by_id(judge_workload(run))["workload.E012"].status == "pass"
    # Planted: rank 1's step diverged (NaN loss, ddp_ok false): it fails, and its detail shows the NaN.
    bad = dict(ok, ddp_ok=False, ddp_loss=float("nan"))
    run = WorkloadRun(suite=suite_run(env=ENV), ddp_mode="nccl", ddp=(ddp_rank(0, **ok), ddp_rank(1, **bad)))
    r = by_id(judge_workload(run))["workload.E012"]
    assert r.status == "fail" and "DDP step loss nan" in r.details[1]


@pytest.mark.parametrize("bad", HOSTILE, ids=lambda v: type(v).__name__)
def test_hostile_rank_figures_are_not_measured(bad):
    data = {
        "allreduce_ok": True,
        "ddp_ok": True,
        "world": bad,
        "busbw_gbs": bad,
        "bw_bytes": bad,
        "rank": bad,
    }
    run = WorkloadRun(suite=suite_run(env=ENV), ddp_mode="nccl", ddp=(ddp_rank(0, **data),))
    got = run.ddp_results.ranks[0]
    assert (got.world, got.busbw_gbs, got.bw_bytes, got.rank) == (None, None, None, None)
    assert by_id(judge_workload(run))["workload.E013"].status in ("skip", "error")


def amp_run(losses) -> WorkloadRun:
    fp32 = {"losses": [2.0, 1.0], "per_s": 100.0, "unit": "img/s", "steps": 4}
    fp16 = {"losses": losses, "skipped": 0, "steps": 4, "per_s": 300.0, "unit": "img/s"}
    amp = {"device": "cuda:0", "models": {"cnn": {"fp32": fp32, "fp16": fp16}}}
    return WorkloadRun(suite=suite_run(env=ENV, amp=amp))


@pytest.mark.parametrize(
    ("losses", "status"),
    [
        ([2.0, 1.0], "pass"),  # absent: finite losses that fall
        ([2.0, float("nan")], "fail"),  # a NaN loss is a number that went wrong: the numerics fail
        ([2.0, "1.0"], "error"),  # a loss that is no number says nothing about the GPU: not measured
        ("2.0", "error"),
    ],
)
def test_amp_losses_are_read_once_and_garbage_is_no_verdict(losses, status):
    run = amp_run(losses)
    assert run.amp.models["cnn"]["fp32"] == suite.AmpRun(
        losses=(2.0, 1.0), steps=4, per_s=100.0, unit="img/s"
    )
    assert by_id(judge_workload(run))["workload.E009"].status == status
    assert by_id(judge_workload(run))["workload.E010"].value == 3.0


def p2p_run(gbs) -> WorkloadRun:
    pairs = [
        {"src": 0, "dst": 1, "gbs": 40.0, "p2p": True, "ok": True},
        {"src": 1, "dst": 0, "gbs": gbs, "p2p": "yes"},
    ]
    return WorkloadRun(suite=suite_run(env=ENV, p2p={"pairs": [*pairs, "no pair"], "names": [H100, 3]}))


@pytest.mark.parametrize("bad", HOSTILE, ids=lambda v: type(v).__name__)
def test_a_hostile_pair_figure_is_not_measured(bad):
    run = p2p_run(bad)
    assert run.p2p.names == (H100,) and len(run.p2p.pairs) == 2
    assert run.p2p.pairs[1] == suite.PeerPair(src=1, dst=0)  # "yes" is no flag
    r = by_id(judge_workload(run))["workload.E016"]
    assert r.status == "error" and "GPU 1 -> GPU 0: not measured (no figure)" in r.details


def test_a_measured_pair_is_judged():
    r = by_id(judge_workload(p2p_run(40.0)))["workload.E016"]
    assert r.status != "error" and r.value == 40.0


def loader_run(**over) -> WorkloadRun:
    results = {"0": {"ips": 100.0, "first_epoch_s": 1.0}, "4": {"ips": 300.0, "first_epoch_s": 0.5}, "x": {}}
    data = {
        "results": results,
        "best_workers": 4,
        "best_ips": 300.0,
        "zero_ips": 100.0,
        "cpus": 8,
        "crop": 224,
    }
    return WorkloadRun(suite=suite_run(env=ENV, dataloader={**data, "pin_memory": True, **over}))


def test_the_dataloader_is_read_once_in_worker_order():
    run = loader_run()
    assert [r.workers for r in run.dataloader.runs] == [0, 4]  # a worker count that is no number is left out
    r = by_id(judge_workload(run))["workload.E011"]
    assert r.status == "pass" and r.value == 300.0 and "num_workers=4, pin_memory=True" in r.message


@pytest.mark.parametrize("bad", HOSTILE, ids=lambda v: type(v).__name__)
def test_a_hostile_dataloader_figure_is_not_measured(bad):
    run = loader_run(best_ips=bad, cpus=bad)
    assert (run.dataloader.best_ips, run.dataloader.cpus) == (None, None)
    assert by_id(judge_workload(run))["workload.E011"].status == "error"
