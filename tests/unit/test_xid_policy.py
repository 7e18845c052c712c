"""The configurable GPU policy: the shipped XID data file, gpu.E011 under a site's XID policy, thresholds
from the configuration (gpu.E009, gpu.E006), and a site's [[gpu_models]] figures before the built-in SKUs."""

from __future__ import annotations

import dataclasses
import json
import re

import hostcheck_scenarios as S
import pytest
from workload_runs import WORKLOAD_CHECKS, by_id

import hostcheck.gather as G
from hostcheck import config
from hostcheck.checks import all_checks
from hostcheck.checks.workload import sku
from hostcheck.child.launch import ProbeRun
from hostcheck.core import evaluate
from hostcheck.gather import Options, Snapshot
from hostcheck.gather.base import CmdResult
from hostcheck.gather.gpuinfo import NvmlSnapshot
from hostcheck.gather.system import SystemSnapshot, XidEvent, gather_system, read_xids
from hostcheck.gather.workload import WorkloadRun
from hostcheck.registry import REGISTRY, Status, run_checks
from hostcheck.sweep.judge import FINDINGS as SWEEP_FINDINGS

URL = ("https://", "http://")


def judge(snapshot):
    core = [c for c in all_checks() if c.category != "workload"]
    results, _ = evaluate(snapshot, core)
    return {r.id: r for r in results}


def cfg(doc: dict) -> config.Config:
    return config.parse(doc, "t.toml")


def xid_snapshot(xids, conf: config.Config | None = None) -> Snapshot:
    """The healthy H100 node with XID events on GPU 1 (bus 2a) and the given configuration."""
    ev = tuple(XidEvent(pci="0000:2a:00", xid=x, text=f"pid=1, event {x}") for x in xids)
    return S.make_snapshot(
        system=S.h100_system(xid_events=ev), options=Options(config=conf) if conf else None
    )


# ------------------------------------------------------------------------------------------- data file


def test_every_xid_row_cites_a_public_source_and_has_a_valid_action():
    data = json.loads(config.XID_DATA.read_text())
    assert data["source"].strip() and data["unlisted"] in config.XID_ACTIONS and data["window_hours"] > 0
    rows = data["xids"]
    assert rows
    xids = [r["xid"] for r in rows]
    assert len(xids) == len(set(xids)), "duplicate xid rows"
    for r in rows:
        assert isinstance(r["xid"], int) and r["xid"] > 0, r
        assert r["action"] in config.XID_ACTIONS, r
        assert r["meaning"].strip(), r
        assert r["source"].strip().startswith(URL), r
        assert all(u.startswith(URL) for u in r.get("see", [])), r
        # Wherever the policy departs from NVIDIA's own immediate action, the row says why.
        if r["action"] != "fail":
            assert r.get("why", "").strip(), r


def test_the_xid_window_is_the_data_files_even_for_a_policy_built_in_code():
    window = json.loads(config.XID_DATA.read_text())["window_hours"]
    assert config.default_xid_policy().window_hours == window
    assert config.XidPolicy().window_hours == window


@pytest.mark.parametrize(
    ("planted", "why"),
    [
        ({"unlisted": "warn", "xids": []}, "window_hours"),
        ({"window_hours": 0, "xids": []}, "window_hours must be a positive number"),
        ({"window_hours": "2", "xids": []}, "window_hours must be a positive number"),
        ({"window_hours": 2, "xids": [{"xid": 79, "action": "panic"}]}, "panic"),
    ],
)
def test_a_malformed_xid_file_is_named_never_a_silent_default(tmp_path, planted, why):
    bad = tmp_path / "xid.json"
    bad.write_text(json.dumps(planted))
    with pytest.raises(ValueError, match=re.escape(str(bad))) as e:
        config._xid_from_data(bad)
    assert why in str(e.value)
    good = dict(planted, window_hours=2, xids=[{"xid": 79, "action": "fail"}])
    bad.write_text(json.dumps(good))
    assert config._xid_from_data(bad).window_hours == 2.0


def test_shipped_policy_is_the_data_file():
    p = config.default_xid_policy()
    assert p.window_hours == 2.0 and p.unlisted == "warn"
    # Hardware and driver faults fail; a contained ECC error (94) warns, an uncontained one (95) fails.
    assert {48, 64, 74, 79, 95, 119, 120, 140} <= p.fail
    assert p.action(94) == "warn" and p.action(109) == "warn" and p.action(63) == "warn"
    assert {13, 31, 43} <= p.ignore
    assert p.action(99999) == "warn"
    assert p.meaning[79][0] == "GPU has fallen off the bus" and p.meaning[79][1].startswith(URL)


# ------------------------------------------------------------------------------------------- gpu.E011


def test_title_does_not_promise_a_fixed_window():
    title = REGISTRY["gpu.E011"].title
    assert "2 h" not in title and "XID" in title


def test_default_policy_fails_hardware_warns_contained_and_passes_application_faults():
    r = judge(xid_snapshot([79]))["gpu.E011"]
    assert r.status == Status.FAIL and "Xid 79 (GPU has fallen off the bus)" in r.message
    assert "drain the node" in r.hint
    r = judge(xid_snapshot([94]))["gpu.E011"]
    assert r.status == Status.WARN and "Contained memory error" in r.message
    r = judge(xid_snapshot([13, 31]))["gpu.E011"]
    assert r.status == Status.PASS and r.value == 2
    assert all("[ignore]" in d for d in r.details) and "Xid 13" in r.message


def test_site_policy_moves_xids_between_fail_warn_and_ignore():
    conf = cfg({"xid": {"fail": [13], "warn": [79], "ignore": [94, 48]}})
    results = judge(xid_snapshot([13], conf))
    assert results["gpu.E011"].status == Status.FAIL
    assert "Xid 13 (Graphics Engine Exception)" in results["gpu.E011"].message
    assert judge(xid_snapshot([79], conf))["gpu.E011"].status == Status.WARN
    r = judge(xid_snapshot([94, 48], conf))["gpu.E011"]
    assert r.status == Status.PASS and r.hint is None
    assert r.details[0].startswith("GPU 1 (0000:2a:00): Xid 94 [ignore]")


def test_fail_wins_and_the_message_names_every_xid_with_its_meaning():
    r = judge(xid_snapshot([13, 94, 95]))["gpu.E011"]
    assert r.status == Status.FAIL and r.value == 3
    assert "Xid 95 (Uncontained memory error)" in r.message
    assert "also Xid 94 (Contained memory error)" in r.message
    assert "ignored: Xid 13 (Graphics Engine Exception)" in r.message


@pytest.mark.parametrize(
    ("unlisted", "status"), [("fail", Status.FAIL), ("warn", Status.WARN), ("ignore", Status.PASS)]
)
def test_unlisted_xids_follow_the_policy(unlisted, status):
    conf = cfg({"xid": {"unlisted": unlisted}})
    r = judge(xid_snapshot([4242], conf))["gpu.E011"]
    assert r.status == status and "not in the XID policy" in r.details[0]


def test_a_policy_built_in_code_is_honoured_too():
    policy = config.XidPolicy(
        fail=frozenset({7}),
        warn=frozenset({8}),
        ignore=frozenset({9}),
        unlisted="ignore",
        meaning={7: ("seven", "")},
    )
    conf = config.Config(xid=policy)
    assert judge(xid_snapshot([7], conf))["gpu.E011"].status == Status.FAIL
    assert judge(xid_snapshot([8], conf))["gpu.E011"].status == Status.WARN
    assert judge(xid_snapshot([9, 79], conf))["gpu.E011"].status == Status.PASS  # 79 is unlisted here


# --------------------------------------------------------------------------------------- XID window


def test_read_xids_asks_journald_for_the_window_it_is_given():
    calls = []

    def runner(argv, timeout):
        calls.append(argv)
        return CmdResult(rc=0, stdout="", stderr="")

    _events, source = read_xids(runner, hours=0.5)
    assert calls[0][-1] == "-30min" and source.endswith("last 0.5 h")
    calls.clear()
    read_xids(runner, hours=0.001)  # under a minute: still asks for one
    assert calls[0][-1] == "-1min"
    calls.clear()
    snap = gather_system(runner, xid_window_hours=6)
    assert [a[-1] for a in calls if a[0] == "journalctl"] == ["-360min"]
    assert snap.xid_source.endswith("last 6 h")


def test_gather_passes_the_configured_window_to_the_system_gatherer(monkeypatch):
    seen = {}

    def fake_gather_system(**kw):
        seen.update(kw)
        return SystemSnapshot()

    monkeypatch.setattr(G, "gather_system", fake_gather_system)
    G.gather(Options(config=cfg({"xid": {"window_hours": 6}})), needs={"system"})
    assert seen.pop("runner") is not None  # the run's one runner (the kernel log read once: test_gather)
    assert seen == {"xid_window_hours": 6.0}


# --------------------------------------------------------------------------------------- thresholds


def test_every_threshold_row_says_where_it_comes_from_and_is_the_default():
    data = json.loads(config.THRESHOLDS_DATA.read_text())
    assert data["schema"] == 1 and data["about"].strip()
    rows = {r["name"]: r for r in data["thresholds"]}
    assert len(rows) == len(data["thresholds"]), "duplicate threshold rows"
    defaults = config.Thresholds()
    assert set(rows) == set(dataclasses.asdict(defaults))
    for name, r in rows.items():
        # A sweep's line belongs to the finding it names (hostcheck.sweep.judge), not to a node check.
        assert r["check"] in REGISTRY or r["check"] in SWEEP_FINDINGS, name
        assert r["unit"].strip() and r["why"].strip(), name
        value = getattr(defaults, name)
        assert type(r["value"]) is type(value) and r["value"] == value > 0, name
        # A public figure names its public source; hostcheck's own choice says so and why.
        assert r["basis"] in ("public", "own"), name
        if r["basis"] == "public":
            assert r["source"].startswith(URL), name
        else:
            assert r["source"].strip() and "own" in r["why"], name
        assert all(u.startswith(URL) for u in r.get("see", [])), name
    assert defaults.gpu_temp_warn_c < defaults.gpu_temp_fail_c
    assert (defaults.gpu_temp_warn_c, defaults.gpu_temp_fail_c, defaults.retired_pages_fail) == (
        80.0,
        84.0,
        63,
    )


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda rows: rows[0].update(value=-1), "gpu_temp_warn_c: value must be a positive number"),
        (lambda rows: rows[1].update(value="84"), "gpu_temp_fail_c: value must be a positive number"),
        (lambda rows: rows[2].update(source=""), "retired_pages_fail: unit, source and why"),
        (lambda rows: rows.append(dict(rows[0])), "gpu_temp_warn_c: duplicate row"),
        (lambda rows: rows[0].pop("value"), "'value'"),
    ],
)
def test_a_malformed_thresholds_file_fails_loudly(tmp_path, change, said):
    data = json.loads(config.THRESHOLDS_DATA.read_text())
    change(data["thresholds"])
    path = tmp_path / "thresholds.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=re.escape(f"{path}: ") + ".*" + re.escape(said)):
        config._threshold_defaults(path)


def test_temperature_thresholds_come_from_the_configuration():
    snap = S.make_snapshot(nvml=S.FakeNvml(gpus=S.gpus_with(0, temp=72)))
    assert judge(snap)["gpu.E009"].status == Status.PASS
    conf = cfg({"thresholds": {"gpu_temp_warn_c": 70, "gpu_temp_fail_c": 75}})
    r = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=S.gpus_with(0, temp=72)), options=Options(config=conf)))
    assert r["gpu.E009"].status == Status.WARN and "70 C" in r["gpu.E009"].message
    r = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=S.gpus_with(0, temp=76)), options=Options(config=conf)))
    assert r["gpu.E009"].status == Status.FAIL and r["gpu.E009"].expected == "< 70 (fail at 75)"


def test_retired_page_limit_comes_from_the_configuration():
    # 10 pages per cause (the fake answers both causes alike): 20 retired pages in all.
    gpus = S.gpus_with(0, retired=list(range(10)), retired_pending=0)
    assert judge(S.make_snapshot(nvml=S.FakeNvml(gpus=gpus)))["gpu.E006"].status == Status.WARN
    conf = cfg({"thresholds": {"retired_pages_fail": 20}})
    r = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=gpus), options=Options(config=conf)))["gpu.E006"]
    assert r.status == Status.FAIL and "RMA threshold 20" in r.message


@pytest.mark.parametrize(("per_cause", "status"), [(31, Status.WARN), (32, Status.FAIL)])
def test_the_default_retired_page_limit_is_dcgm_s(per_cause, status):
    """62 retired pages warn, 64 fail: DCGM's limit is 63 or more (the fake answers both causes alike)."""
    gpus = S.gpus_with(0, retired=list(range(per_cause)), retired_pending=0)
    assert judge(S.make_snapshot(nvml=S.FakeNvml(gpus=gpus)))["gpu.E006"].status == status


# ---------------------------------------------------------------------------------- site GPU models


def matmul_run(name: str, tflops: dict[str, float], copy: float) -> WorkloadRun:
    rows = [
        {"index": 0, "name": name, "dtypes": {k: {"tflops": v, "finite": True} for k, v in tflops.items()}}
    ]
    bw = [{"index": 0, "name": name, "device_copy": {"gbs": copy}}]
    data = {
        "env": {"cuda_available": True, "gpus": [{"index": 0, "name": name}]},
        "matmul": {"gpus": rows},
        "bandwidth": {"gpus": bw},
    }
    recs = []
    for probe, d in data.items():
        recs += [{"probe": probe, "event": "start"}, {"probe": probe, "ok": True, "data": d}]
    return WorkloadRun(suite=ProbeRun(name="suite", records=tuple(recs)))


def judge_run(run: WorkloadRun, conf: config.Config | None = None) -> dict:
    snap = Snapshot(
        options=Options(config=conf) if conf else Options(),
        workload=run,
        nvml=NvmlSnapshot(gpus=(), device_count=0),
    )
    return by_id(run_checks(WORKLOAD_CHECKS, snap))


H100 = "NVIDIA H100 80GB HBM3"


def test_site_figure_overrides_the_built_in_sku_and_can_fail():
    run = matmul_run(H100, {"bf16": 766.0, "fp16": 745.0}, 2950.0)
    f = judge_run(run)
    assert f["workload.E001"].status == "pass" and f["workload.E002"].status == "pass"
    conf = cfg({"gpu_models": [{"match": "H100.*HBM3", "name": "H100 at 1000 W", "bf16_tflops": 1200}]})
    fig = sku.matmul_figure(H100, "bf16", conf)
    assert fig.value == 1200.0 and fig.basis == sku.SITE and "config file t.toml" in fig.source
    f = judge_run(run, conf)
    # 766 / 1200 = 0.64: a site's own figure fails like a measured one (an estimate would only warn).
    assert f["workload.E001"].status == "fail" and "site" in f["workload.E001"].expected
    assert "config file t.toml" in f["workload.E001"].details[0]
    # A dtype the site leaves out keeps the built-in figure.
    assert f["workload.E002"].status == "pass" and sku.matmul_figure(H100, "fp16", conf).basis == sku.ESTIMATE


def test_unknown_model_gets_figures_only_from_the_configuration():
    name = "NVIDIA Z999 Prototype"
    run = matmul_run(name, {"bf16": 95.0, "fp16": 90.0}, 950.0)
    f = judge_run(run)
    assert f["workload.E001"].status == "skip" and f["workload.E008"].status == "skip"
    conf = cfg({"gpu_models": [{"match": "z999", "name": "Z999", "bf16_tflops": 100, "copy_gbs": 1000}]})
    assert sku.lookup(name) is None and sku.site_model(name, conf).name == "Z999"
    f = judge_run(run, conf)
    assert f["workload.E001"].status == "pass" and f["workload.E008"].status == "pass"
    assert f["workload.E002"].status == "skip"  # no site figure, no built-in SKU: no verdict
    assert sku.copy_figure(name, conf).basis == sku.SITE


def test_blackwell_skus_bf16_is_published_the_rest_estimates_from_dense_datasheet_peaks():
    b200, gb200 = sku.lookup("NVIDIA B200"), sku.lookup("NVIDIA GB200")
    assert b200.key == "b200" and gb200.key == "gb200"
    assert (b200.matmul["bf16"].value, gb200.matmul["bf16"].value) == (1745.0, 1822.0)
    for s in (b200, gb200):
        assert s.matmul["bf16"].basis == sku.PUBLISHED and "ml-engineering" in s.matmul["bf16"].source
        others = [f for dt, f in s.matmul.items() if dt != "bf16"]
        assert all(f.basis == sku.ESTIMATE for f in others) and s.copy_gbs.basis == sku.ESTIMATE
    # Dense peaks, not the "with sparsity" ones: 2,250 (B200) and 2,500 (GB200) bf16 TFLOP/s.
    assert b200.peak_matmul["bf16"] == 2250 and gb200.peak_matmul["bf16"] == 2500
    assert "2250 dense" in b200.matmul["fp16"].source and "2500 dense" in gb200.matmul["fp16"].source
