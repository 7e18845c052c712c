"""The real probe code on the CPU with tiny sizes: AMP numerics, the DataLoader, gloo DDP, the suite."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")

from workload_runs import judge_one, judge_workload  # noqa: E402

from hostcheck.checks.workload import grading  # noqa: E402
from hostcheck.gather import workload as api  # noqa: E402
from hostcheck.gather.suite import section as read_section  # noqa: E402
from hostcheck.inside import workload as probes  # noqa: E402
from hostcheck.registry import Status  # noqa: E402

TINY_AMP = {
    "device": "cpu",
    "cnn": {"channels": [4, 8], "batch": 4, "size": 16},
    "transformer": {"d": 32, "heads": 2, "layers": 1, "batch": 2, "seq": 8},
    "warmup": 1,
    "steps": 3,
}
TINY_DL = {"device": "cpu", "images": 12, "batch": 4, "crop": 32, "size": [96, 80], "workers": [0, 1]}


def by_id(findings):
    return {f.id: f for f in findings}


def test_dataloader_probe_on_cpu_decodes_real_jpegs_with_workers():
    out = probes.probe_dataloader(TINY_DL)
    assert set(out["results"]) == {"0", "1"}
    for w, r in out["results"].items():
        assert "error" not in r, (w, r)
        assert r["images"] == 12 and r["ips"] > 0
    assert out["best_workers"] in (0, 1) and out["zero_ips"] > 0
    ds = probes.JpegDataset(probes.write_jpegs(str(_tmp()), 2, size=(64, 48)), crop=32)
    x, y = ds[1]
    assert tuple(x.shape) == (3, 32, 32) and x.dtype == torch.float32 and y == 1
    assert -3.0 < float(x.mean()) < 3.0  # normalised


def _tmp():
    import tempfile

    return tempfile.mkdtemp(prefix="hostcheck-test-")


def test_recommended_workers():
    assert probes.recommended_workers(2, 1) == 1
    assert probes.recommended_workers(16, 1) == 8
    assert probes.recommended_workers(96, 8) == 8
    assert probes.recommended_workers(32, 8) == 3


def test_matmul_and_bandwidth_probes_run_on_cpu():
    out = probes.probe_matmul({"device": "cpu", "n": 64, "warmup_s": 0.01, "measure_s": 0.02})
    d = out["gpus"][0]["dtypes"]
    assert d["fp32"]["tflops"] > 0 and d["fp32"]["finite"]
    bw = probes.probe_bandwidth({"device": "cpu", "copy_bytes": 1 << 20})
    assert bw["host_copy_gbs"] > 0 and bw["gpus"] == []


def test_the_whole_default_run_on_cpu_end_to_end_with_a_real_two_process_gloo_ddp():
    tiny = {
        "matmul": {"n": 64, "warmup_s": 0.01, "measure_s": 0.02},
        "bandwidth": {"copy_bytes": 1 << 20},
        # fp16 autocast + GradScaler run on the CPU too (torch >= 2.3): the GPU's code path, scaler included.
        "amp": dict({k: v for k, v in TINY_AMP.items() if k != "device"}, modes=["fp32", "bf16", "fp16"]),
        "dataloader": {k: v for k, v in TINY_DL.items() if k != "device"},
        "ddp": {"bw_bytes": 1 << 16, "bw_iters": 2},
    }
    run = api.gather_workload(sys.executable, device="cpu", timeout=120, ddp_timeout=90, section_args=tiny)
    assert run.suite.ok, (run.suite.error, run.suite.stderr_tail)
    # No GPU: the DDP check ran as two real gloo processes (all_reduce, one DDP step, busbw).
    assert run.ddp_mode == "gloo" and len(run.ddp) == 2
    assert all(r.ok for r in run.ddp), [(r.error, r.stderr_tail) for r in run.ddp]
    assert sorted(r.data["data"]["rank"] for r in run.ddp) == [0, 1]
    for r in run.ddp:
        d = r.data["data"]
        assert d["allreduce_value"] == [2.0, 2.0] and d["ddp_param_maxdiff"] == 0.0
        assert d["busbw_gbs"] == pytest.approx(d["algbw_gbs"])  # 2(n-1)/n = 1 for n = 2
    # The AMP probe trained both models in fp32 and bf16 autocast: finite losses that fall.
    amp, err = read_section(run.suite, "amp")
    assert err is None and set(amp["models"]) == {"cnn", "transformer"}
    for kind, modes in amp["models"].items():
        assert set(modes) == {"fp32", "bf16", "fp16"}, kind
        if kind == "transformer":
            r = modes["fp16"]
            assert r["scale"] is not None and 0 <= r["skipped"] < r["steps"]
        for mode, r in modes.items():
            assert "error" not in r, (kind, mode, r)
            assert grading.loss_numerics(r["losses"])[0] == "pass", (kind, mode, r["losses"])
            assert r["per_s"] > 0 and r["steps"] == 4
    f = by_id(judge_workload(run))
    assert "2-process gloo" in f["workload.E012"].message and f["workload.E013"].status == "skip"
    assert f["workload.E009"].status == "pass", f["workload.E009"]
    assert f["workload.E010"].status == "skip" and "on the CPU" in f["workload.E010"].message
    assert f["workload.E011"].status in ("pass", "warn"), f["workload.E011"]
    assert f["workload.E012"].status == "pass", f["workload.E012"]
    assert f["workload.E001"].status == "skip" and f["workload.E005"].status == "skip"
    assert not [x for x in f.values() if x.status == "error"], [x for x in f.values() if x.status == "error"]


def test_multinode_without_a_gpu_runs_one_gloo_rank_per_node_through_torchrun():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mn = api.MultiNode(nnodes="1", rdzv_endpoint=f"127.0.0.1:{port}", rdzv_id="unit", timeout=90)
    run = api.gather_workload(
        sys.executable,
        device="cpu",
        sections=("env",),
        section_args={"ddp": {"bw_bytes": 1 << 16, "bw_iters": 2}},
        multinode=mn,
    )
    (r,) = run.multinode
    assert r.ok, (r.error, r.stderr_tail)
    f = judge_one(run, "workload.E014")
    assert f.status == "pass" and f.message.startswith("world 1: 1 local rank(s) correct"), f


def test_rates_stop_at_the_batch_cap_unless_a_long_run_lifts_it():
    # The long half of benchmarks/matmul_h2d_long_vs_short.py lifts the cap; with it the 30 s run would be ~4 s.
    cpu = torch.device("cpu")
    capped = probes.matmul_rate(torch, cpu, "fp32", 8, 0.0, 0.3)
    lifted = probes.matmul_rate(torch, cpu, "fp32", 8, 0.0, 0.3, max_batches=10**6)
    assert capped["batches"] == 200 and lifted["batches"] > 200


def test_one_rank_ddp_does_not_time_a_no_op_all_reduce():
    out = probes.probe_ddp_inprocess({"device": "cpu", "backend": "gloo"})
    assert out["world"] == 1 and out["allreduce_ok"] and out["ddp_ok"]
    assert "busbw_gbs" not in out and "moves no data" in out["bw_skipped"]
    suite = api.ProbeRun(
        name="suite",
        records=(
            {"probe": "ddp", "event": "start"},
            {"probe": "ddp", "ok": True, "data": dict(out, backend="nccl")},
        ),
    )
    f = by_id(judge_workload(api.WorkloadRun(suite=suite, ddp_mode="in-suite")))
    assert f["workload.E013"].status == Status.SKIP and "not measured" in f["workload.E013"].message


def test_dataloader_sizes_keep_every_worker_busy_and_cap_the_zero_worker_run():
    assert probes.dataloader_images([0, 4, 8], 16) == 384  # 3 batches for each of 8 workers
    assert probes.dataloader_images([0, 1], 16) == 192
    out = probes.probe_dataloader(dict(TINY_DL, images=40, workers=[0], zero_batches=3))
    assert out["results"]["0"]["images"] == 12  # 3 batches of 4, not the whole epoch of 40
