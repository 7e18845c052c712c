"""The workload gatherer (hostcheck.gather.workload) with a fake training Python, and through the core."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from workload_runs import WORKLOAD_IDS, judge_workload

from hostcheck.child.launch import MARKER
from hostcheck.gather import workload as api

# ------------------------------------------------------------------- gather_workload with a fake Python

FAKE_PYTHON = """#!{exe}
import json, os, sys, time
M = {marker!r}
probe = sys.argv[sys.argv.index("--json-args") - 1]
args = json.loads(sys.argv[sys.argv.index("--json-args") + 1])
scenario = os.environ.get("FAKE_SCENARIO", "ok")
def emit(r):
    print(M + json.dumps(r), flush=True)
if probe == "suite":
    for name in args["sections"]:
        emit({{"probe": name, "event": "start"}})
        if scenario == "hang" and name == "amp":
            time.sleep(120)
        if scenario == "segv" and name == "matmul":
            import signal; os.kill(os.getpid(), signal.SIGSEGV)
        if name == "env":
            data = {{"cuda_available": False, "gpus": [], "cpus": 2}}
        elif name == "ddp":
            assert args["args"]["ddp"]["single_gpu_only"] is True
            data = {{"deferred": True, "gpus": 0}}
        elif name == "matmul":
            data = {{"gpus": [{{"index": None, "dtypes": {{"fp32": {{"tflops": 0.2}}}}}}]}}
        elif name == "dataloader":
            data = {{"cpus": 2, "results": {{"0": {{"ips": 100.0}}}}, "best_workers": 0, "best_ips": 100.0,
                    "zero_ips": 100.0}}
        else:
            data = {{}}
        emit({{"probe": name, "ok": True, "data": data}})
elif probe == "ddp_worker":
    assert args["backend"] == "gloo", args
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    emit({{"probe": "ddp_worker", "ok": True, "data": {{"rank": rank, "world": world, "backend": "gloo",
          "allreduce_ok": True, "allreduce_value": [world, world], "ddp_ok": True, "busbw_gbs": 1.0,
          "algbw_gbs": 1.0, "bw_bytes": 4194304}}}})
"""


@pytest.fixture
def fake_python(tmp_path):
    p = tmp_path / "python"
    p.write_text(FAKE_PYTHON.format(exe=sys.executable, marker=MARKER))
    p.chmod(0o755)
    return str(p)


def by_id(findings):
    return {f.id: f for f in findings}


def test_no_gpu_defers_ddp_to_two_gloo_processes(fake_python, monkeypatch):
    monkeypatch.setenv("FAKE_SCENARIO", "ok")
    run = api.gather_workload(fake_python, timeout=20, ddp_timeout=20, gpu_possible=True)
    assert run.suite.ok and run.ddp_mode == "gloo" and len(run.ddp) == 2
    f = by_id(judge_workload(run))
    assert f["workload.E012"].status == "pass"
    assert "gloo" in f["workload.E012"].message and "NCCL not exercised" in f["workload.E012"].message
    assert f["workload.E013"].status == "skip"
    assert f["workload.E001"].status == "skip" and "no CUDA GPU" in f["workload.E001"].message
    assert f["workload.E004"].value == 0.2
    json.dumps(run.to_dict())  # serialisable for --json


def test_every_workload_deadline_follows_the_options(fake_python, monkeypatch):
    """DDP ranks once had a fixed 120 s and multi-node a fixed 300 s, whatever --workload-timeout said."""
    from hostcheck.gather import Options

    seen = {}
    monkeypatch.setattr(api, "launch_local_ddp", lambda *a, **k: seen.setdefault("ddp", a[4]) and ())
    monkeypatch.setenv("FAKE_SCENARIO", "ok")
    api.gather_workload(fake_python, timeout=7, gpu_possible=True)
    assert seen["ddp"] == 7
    got = {}
    monkeypatch.setattr(api, "gather_workload", lambda python, **k: got.update(k) or api.WorkloadRun())
    opts = Options(workload_timeout_s=9, rdzv_timeout_s=33, nnodes="2", rdzv_endpoint="n1:29400", burn=5)
    api.gather_for(opts, fake_python, {})
    assert got["timeout"] == 9 and got["multinode"].timeout == 33 and got["burn"] == 5
    # The whole run's ceiling: suite and its re-run, two DDP tries, two tries of the all_reduce through the NICs
    # and the GPUDirect write runs (default sections), the rendezvous, burn, and the slack.
    nics = 9 * 2 + api.GDR_LIMIT_S
    assert api.gather_limit(opts) == 9 * 4 + nics + 33 + (5 + 9) + api.GATHER_SLACK_S
    assert api.gather_limit(Options(workload_timeout_s=9)) == 9 * 4 + nics + api.GATHER_SLACK_S
    without = Options(workload_timeout_s=9, workload_sections=("env", "ddp"))
    assert api.gather_limit(without) == 9 * 4 + api.GATHER_SLACK_S


def test_a_hang_mid_suite_becomes_errors_for_that_section_and_the_rest(fake_python, monkeypatch):
    monkeypatch.setenv("FAKE_SCENARIO", "hang")
    t0 = time.monotonic()
    run = api.gather_workload(fake_python, timeout=1.0, ddp_timeout=20, gpu_possible=True)
    assert time.monotonic() - t0 < 15
    f = by_id(judge_workload(run))
    assert f["workload.E009"].status == "error" and "during amp" in f["workload.E009"].message
    assert f["workload.E001"].status == "skip"  # matmul finished before the hang
    # The sections the hung process never reached ran again in a fresh process.
    assert run.suite_rest is not None and run.suite_rest.ok
    assert [r["probe"] for r in run.suite_rest.records if r.get("event") == "start"] == ["dataloader", "ddp"]
    assert f["workload.E011"].status == "pass" and f["workload.E011"].value == 100.0
    # No GPU (the env section said so): the DDP check ran as two gloo processes.
    assert run.ddp_mode == "gloo" and f["workload.E012"].status == "pass"


def test_a_crash_in_the_suite_is_an_error_result(fake_python, monkeypatch):
    monkeypatch.setenv("FAKE_SCENARIO", "segv")
    run = api.gather_workload(fake_python, timeout=20, ddp_timeout=20, gpu_possible=True)
    f = by_id(judge_workload(run))
    assert f["workload.E001"].status == "error"
    assert "SIGSEGV" in f["workload.E001"].message and "during matmul" in f["workload.E001"].message
    # A crash in one probe is an error for that probe only: the rest ran in a process of their own.
    assert run.suite_rest is not None and f["workload.E009"].status != "error"
    assert f["workload.E011"].status == "pass" and f["workload.E012"].status == "pass"


def test_a_workload_gatherer_that_died_makes_every_workload_check_an_error():
    from hostcheck.gather.base import TIMEOUT, Unavailable

    results = judge_workload(Unavailable(TIMEOUT, "gathering workload did not finish in 9 s"))
    assert [r.id for r in results] == WORKLOAD_IDS and len(results) == 18
    assert {r.status for r in results} == {"error"}
    assert all("did not complete" in r.message and "9 s" in r.message for r in results)


def test_torchrun_argv_for_multinode():
    mn = api.MultiNode(nnodes="2", rdzv_endpoint="node1:29400", rdzv_id="job7")
    argv = api.torchrun_argv("/venv/bin/python", mn, {"bw_iters": 5})
    assert argv[:3] == ["/venv/bin/python", "-m", "torch.distributed.run"]
    joined = " ".join(argv)
    assert "--nnodes 2" in joined and "--nproc-per-node gpu" in joined
    assert "--rdzv-backend c10d --rdzv-endpoint node1:29400 --rdzv-id job7" in joined
    assert argv[-3:] == ["ddp_worker", "--json-args", '{"bw_iters": 5}']
    assert argv[-4] == "hostcheck.inside.workload" and "--no-python" in argv


def test_multinode_tells_torchrun_this_nodes_address(monkeypatch):
    # Nodes that cannot resolve each other's names still meet: rank 0 is announced by address.
    seen = {}
    monkeypatch.setattr(api, "run_child", lambda argv, timeout, name, env: seen.setdefault("env", env))
    api.launch_multinode("/venv/bin/python", api.MultiNode(nnodes="2", rdzv_endpoint="127.0.0.1:29400"))
    assert seen.pop("env")["PET_LOCAL_ADDR"] == "127.0.0.1"
    api.launch_multinode(
        "/venv/bin/python",
        api.MultiNode(nnodes="2", rdzv_endpoint="127.0.0.1:29400"),
        env={"PET_LOCAL_ADDR": "10.1.2.3"},
    )
    assert seen.pop("env")["PET_LOCAL_ADDR"] == "10.1.2.3"  # the admin's choice wins
    assert api.local_addr_towards("no-such-host.invalid:29400") is None
    assert api.local_addr_towards("not an endpoint") is None


# ------------------------------------------------------------------------ through the core


def test_the_core_gathers_the_workload_with_the_training_python_and_judges_each_check(
    fake_python, monkeypatch
):
    from hostcheck.checks import all_checks
    from hostcheck.gather import Options, gather
    from hostcheck.registry import run_checks, select

    monkeypatch.setenv("FAKE_SCENARIO", "ok")
    checks = select(all_checks(), only=["workload"])
    assert [c.id for c in checks] == WORKLOAD_IDS and all(c.needs == {"workload", "nvml"} for c in checks)
    assert not [c for c in select(all_checks(), quick=True) if c.category == "workload"]
    options = Options(python=fake_python, env_file="/nonexistent/training.env", workload_timeout_s=20)
    snap = gather(options, {"workload"})
    assert snap.workload.python == fake_python and snap.workload.ddp_mode == "gloo"
    assert snap.torch is None and "workload" in snap.timings  # only what the checks need is gathered
    f = {r.id: r for r in run_checks(checks, snap)}
    assert f["workload.E012"].status == "pass" and "gloo" in f["workload.E012"].message
    assert f["workload.E001"].status == "skip"
    json.dumps(snap.workload.to_dict())


def test_sections_not_asked_for_are_not_run_and_their_checks_skip(fake_python, monkeypatch):
    from hostcheck.gather import Options, gather

    monkeypatch.setenv("FAKE_SCENARIO", "ok")
    options = Options(python=fake_python, workload_timeout_s=20, workload_sections=("env", "matmul"))
    snap = gather(options, {"workload"})
    f = {r.id: r for r in judge_workload(snap.workload)}
    assert f["workload.E004"].value == 0.2  # matmul ran
    for cid in ("workload.E009", "workload.E011", "workload.E012"):
        assert f[cid].status == "skip" and "not selected" in f[cid].message


def test_benchmark_script_has_a_cheap_help():

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "matmul_h2d_long_vs_short.py"
    p = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "within 5%" in p.stdout


def test_a_training_python_without_torch_gives_errors_with_a_hint(tmp_path):
    # A real interpreter whose sys.path cannot see torch: every section reports the import error.
    py = tmp_path / "python"
    py.write_text(f'#!/bin/sh\nexec {sys.executable} -S -E "$@"\n')
    py.chmod(0o755)
    run = api.gather_workload(str(py), timeout=30, ddp_timeout=30, gpu_possible=True)
    f = by_id(judge_workload(run))
    assert f["workload.E001"].status == "error" and "No module named 'torch'" in f["workload.E001"].message
    assert "gpunode_pytorch" in f["workload.E001"].hint
    assert f["workload.E012"].status == "error"
