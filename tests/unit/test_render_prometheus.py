"""The Prometheus textfile, parsed with prometheus_client's own parser: dcgm-exporter's per-GPU labels, base
units in metric names and no ``unit`` label, titles in an _info series, the last-success carry-over, and hostile
strings that must still parse."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
import threading
from datetime import datetime, timezone
from pathlib import Path

import hostcheck_scenarios as S
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hostcheck.check.render.prometheus import (
    LAST_SUCCESS,
    READ_LIMIT,
    UNITS,
    check_value_metric,
    read_last_success,
    render_prometheus,
)
from hostcheck.checks import all_checks
from hostcheck.child.launch import ProbeRun
from hostcheck.core import build_report, evaluate
from hostcheck.gather.base import NOT_SUPPORTED, Unavailable
from hostcheck.gather.gpuinfo import BusId, GpuInfo
from hostcheck.gather.system import XidEvent
from hostcheck.gather.workload import WorkloadRun
from hostcheck.outfile import write_report
from hostcheck.registry import Result, Status
from hostcheck.report import GpuRecord, Report, gpu_records, nvml_bus_id
from hostcheck.score import verdict

CHECKS_DIR = Path(__file__).resolve().parents[2] / "hostcheck" / "checks"
SCHEMA = Path(__file__).resolve().parents[2] / "hostcheck" / "data" / "hostcheck-report.schema.json"
WHEN = "2026-11-23T03:00:00Z"
WHEN_EPOCH = datetime(2026, 11, 23, 3, tzinfo=timezone.utc).timestamp()
DCGM_LABELS = {"gpu", "UUID", "pci_bus_id"}
CORE = [c for c in all_checks() if c.category != "workload"]


def report_for(snap, checks=None, when: str = WHEN) -> Report:
    results, v = evaluate(snap, checks if checks is not None else CORE)
    report = build_report(snap, results, v, started=0.0, when=when)
    return dataclasses.replace(report, gpus=gpu_records(snap))


def families(text: str) -> dict:
    """name -> family; the text must parse, name every family once and give each a HELP and a TYPE line."""
    out = {}
    for fam in text_string_to_metric_families(text):
        assert fam.name not in out, f"{fam.name} twice: its samples are not together"
        out[fam.name] = fam
    for name in out:
        assert f"# HELP {name} " in text and f"# TYPE {name} gauge\n" in text, name
    return out


def samples(text: str, name: str) -> list:
    return [s for s in families(text)[name].samples if s.name == name] if name in families(text) else []


def value(text: str, name: str, **labels: str) -> float:
    found = [s.value for s in samples(text, name) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def assert_well_labelled(text: str) -> None:
    for fam in families(text).values():
        assert fam.documentation, fam.name
        for s in fam.samples:
            assert "unit" not in s.labels, s
            if s.name.startswith("hostcheck_gpu_"):
                assert set(s.labels) >= DCGM_LABELS, s


# ------------------------------------------------------------------------------------------ a workload run


def suite_run(n: int = 8, order=None) -> WorkloadRun:
    """A finished suite on the 8 x H100 fixture; ``order``: CUDA device i is NVML GPU order[i] (by PCI address)."""
    order = order or list(range(n))
    env = {
        "cuda_available": True,
        "gpus": [
            {"index": i, "name": S.h100_gpu(0)["name"], "pci_bus_id": f"0000:{S.H100_BUSES[order[i]]}:00.0"}
            for i in range(n)
        ],
    }
    matmul = {
        "gpus": [
            {
                "index": i,
                "name": S.h100_gpu(0)["name"],
                "dtypes": {"bf16": {"tflops": 700.0 + order[i], "finite": True}, "fp16": {"tflops": 690.0}},
            }
            for i in range(n)
        ]
    }
    bandwidth = {
        "gpus": [
            {
                "index": i,
                "name": S.h100_gpu(0)["name"],
                "h2d_pinned": {"gbs": 54.0},
                "d2h_pinned": {"gbs": 55.0},
                "h2d_pageable": {"error": "RuntimeError: boom"},
                "device_copy": {"gbs": 2950.0},
            }
            for i in range(n)
        ]
    }
    recs = []
    for name, data in (("env", env), ("matmul", matmul), ("bandwidth", bandwidth)):
        recs += [{"probe": name, "event": "start"}, {"probe": name, "ok": True, "data": data}]
    burn = {
        "seconds": 60,
        "n": 8192,
        "gpus": [
            {"device": f"cuda:{i}", "index": i, "tflops_median": 650.0, "tflops_min": 600.0, "mismatches": 0}
            for i in range(n)
        ],
    }
    return WorkloadRun(
        suite=ProbeRun(name="suite", records=tuple(recs)),
        burn=ProbeRun(name="burn", records=({"probe": "burn", "ok": True, "data": burn},)),
        burn_requested=60,
        sections=("env", "matmul", "bandwidth"),
    )


# ------------------------------------------------------------------------------------------ the format


def test_healthy_node_parses_with_dcgm_labels_and_no_unit_label():
    snap = S.make_snapshot()
    text = render_prometheus(report_for(snap))
    assert_well_labelled(text)
    info = {s.labels["gpu"]: s.labels for s in samples(text, "hostcheck_gpu_info")}
    assert sorted(info, key=int) == [str(i) for i in range(8)]
    assert info["0"] == {
        "gpu": "0",
        "UUID": "GPU-00000000-0000-0000-0000-000000000000",
        "pci_bus_id": "00000000:18:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "hostname": "h100-node-01",
    }
    assert info["5"]["pci_bus_id"] == "00000000:AB:00.0"  # NVML's upper case, as dcgm-exporter has it
    assert value(text, "hostcheck_gpu_temperature_celsius", gpu="3") == 37
    assert value(text, "hostcheck_gpu_memory_total_bytes", gpu="0") == 80 * 2**30
    assert value(text, "hostcheck_gpu_pcie_link_width_lanes", gpu="0", link="current") == 16
    assert value(text, "hostcheck_gpu_nvlink_active_links", gpu="7") == 18
    assert value(text, "hostcheck_gpu_xid_events", gpu="0") == 0
    assert value(text, "hostcheck_gpu_lost", gpu="0") == 0


def test_every_per_gpu_series_carries_dcgm_exporters_hostname_and_device():
    """dcgm-exporter labels each GPU series gpu, UUID, pci_bus_id, device ("nvidia<gpu>") and hostname: with
    the same labels, on(hostname, device) joins; a node whose hostname is unknown gets no empty hostname label."""
    report = report_for(S.make_snapshot())
    text = render_prometheus(report)
    per_gpu = [s for f in families(text).values() if f.name.startswith("hostcheck_gpu_") for s in f.samples]
    assert per_gpu
    for s in per_gpu:
        assert s.labels["device"] == "nvidia" + s.labels["gpu"], s
        assert s.labels["hostname"] == "h100-node-01", s
    nameless = dataclasses.replace(report, host={**report.host, "hostname": ""})
    per_gpu = [
        s
        for f in families(render_prometheus(nameless)).values()
        if f.name.startswith("hostcheck_gpu_")
        for s in f.samples
    ]
    assert per_gpu and all("hostname" not in s.labels and s.labels["device"] for s in per_gpu)
    assert "hostname" not in {k for s in samples(text, "hostcheck_score") for k in s.labels}


def test_titles_are_in_an_info_series_and_status_keeps_its_encoding():
    text = render_prometheus(report_for(S.SCENARIOS["row_remap_pending"][0]()))
    fams = families(text)
    assert value(text, "hostcheck_check_info", check="gpu.E005", category="gpu") == 1
    assert {s.labels["title"] for s in fams["hostcheck_check_info"].samples} >= {
        "Row remapping (pending / failed)"
    }
    status = fams["hostcheck_check_status"]
    assert "0 pass, 1 warn, 2 fail, 3 error, -1 skip" in status.documentation
    assert all(set(s.labels) == {"check", "category"} for s in status.samples)
    assert len(status.samples) == len(CORE)
    assert value(text, "hostcheck_check_status", check="gpu.E005") == 2
    assert value(text, "hostcheck_check_status", check="gpu.E006") == -1  # H100: no page retirement
    assert value(text, "hostcheck_ready", fail_level="fail") == 0
    assert sum(s.value for s in fams["hostcheck_checks"].samples) == len(CORE)
    assert value(text, "hostcheck_last_run_timestamp_seconds") == WHEN_EPOCH
    assert value(text, "hostcheck_gpu_row_remap_pending", gpu="5") == 1
    assert value(text, "hostcheck_gpu_remapped_rows", gpu="5", cause="uncorrectable") == 2
    versions = samples(text, "hostcheck_info")[0].labels
    assert versions["driver"] == "580.159.04" and versions["torch"] == "2.11.0+cu130"


def test_check_values_have_base_units_in_their_names_and_are_scaled():
    snap = dataclasses.replace(S.make_snapshot(), workload=suite_run())
    text = render_prometheus(report_for(snap, all_checks()))
    assert_well_labelled(text)
    assert value(text, "hostcheck_check_value_flops_per_second", check="workload.E001") == pytest.approx(
        700e12
    )
    assert value(text, "hostcheck_check_value_bytes_per_second", check="workload.E005") == pytest.approx(54e9)
    assert value(text, "hostcheck_check_value_bytes_per_second", check="workload.E008") == pytest.approx(
        2950e9
    )
    assert value(text, "hostcheck_check_value_celsius", check="gpu.E009") == 41  # the hottest GPU
    assert value(text, "hostcheck_check_value_bytes", check="tuning.E001") == 1024 * 2**30
    assert value(text, "hostcheck_check_value", check="gpu.E002") == 8  # GPUs: a count, no unit
    assert value(text, "hostcheck_check_value", check="gpu.E011") == 0  # events
    for fam in families(text).values():
        if fam.name.startswith("hostcheck_check_value"):
            assert all(set(s.labels) == {"check"} for s in fam.samples), fam.name


def test_workload_figures_per_gpu_follow_the_pci_address_not_the_cuda_order():
    order = [7, 6, 5, 4, 3, 2, 1, 0]  # CUDA_DEVICE_ORDER that is not NVML's
    snap = dataclasses.replace(S.make_snapshot(), workload=suite_run(order=order))
    rec = {g.index: g for g in gpu_records(snap)}
    assert rec[7].matmul_flops_per_second["bf16"] == pytest.approx(707e12)  # CUDA device 0 is NVML GPU 7
    assert rec[0].matmul_flops_per_second == {"bf16": pytest.approx(700e12), "fp16": pytest.approx(690e12)}
    assert rec[0].copy_bytes_per_second == {
        "h2d_pinned": pytest.approx(54e9),
        "d2h_pinned": pytest.approx(55e9),
        "device_copy": pytest.approx(2950e9),
    }  # the failed pageable copy is left out, not given as 0
    assert rec[0].quantities["burn_median_flops_per_second"] == pytest.approx(650e12)
    assert rec[0].quantities["burn_result_mismatches"] == 0
    text = render_prometheus(report_for(snap, all_checks()))
    assert_well_labelled(text)
    assert value(text, "hostcheck_gpu_matmul_flops_per_second", gpu="7", dtype="bf16") == pytest.approx(
        707e12
    )
    assert value(text, "hostcheck_gpu_copy_bytes_per_second", gpu="2", copy="h2d_pinned") == pytest.approx(
        54e9
    )
    assert value(text, "hostcheck_gpu_burn_flops_per_second", gpu="1", stat="min") == pytest.approx(600e12)
    uuid = value(text, "hostcheck_gpu_info", gpu="7", UUID="GPU-00000000-0000-0000-0000-000000000007")
    assert uuid == 1


def test_a_cpu_workload_run_gives_no_gpu_figures():
    recs = (
        {"probe": "matmul", "event": "start"},
        {
            "probe": "matmul",
            "ok": True,
            "data": {"gpus": [{"index": None, "dtypes": {"fp32": {"tflops": 1.0}}}]},
        },
    )
    run = WorkloadRun(suite=ProbeRun(name="suite", records=recs))
    snap = dataclasses.replace(S.make_snapshot(), workload=run)
    assert all(not g.matmul_flops_per_second for g in gpu_records(snap))


def test_hostile_workload_records_give_no_figure_and_never_raise():
    rows = [
        {
            "index": 0,
            "dtypes": {"bf16": {"tflops": 10**400}, "fp16": {"tflops": True}, "tf32": "fast", "fp32": {}},
        },
        {"index": True, "dtypes": {"bf16": {"tflops": 1.0}}},  # a bool is no device index
        {"index": "1", "dtypes": {"bf16": {"tflops": 1.0}}},
        "not a row",
    ]
    bw = [{"index": 0, "h2d_pinned": {"gbs": 1e300}, "d2h_pinned": {"gbs": float("nan")}, "name": "x"}]
    recs = []
    for name, data in (("env", {"gpus": "none"}), ("matmul", {"gpus": rows}), ("bandwidth", {"gpus": bw})):
        recs += [{"probe": name, "event": "start"}, {"probe": name, "ok": True, "data": data}]
    burn = ProbeRun(name="burn", records=({"probe": "burn", "ok": True, "data": {"gpus": [{"index": 0}]}},))
    run = WorkloadRun(suite=ProbeRun(name="suite", records=tuple(recs)), burn=burn)
    records = gpu_records(dataclasses.replace(S.make_snapshot(), workload=run))
    assert all(not g.matmul_flops_per_second and not g.copy_bytes_per_second for g in records)
    assert not any(k.startswith("burn_") for k in records[0].quantities)
    json.dumps([g.to_dict() for g in records], allow_nan=False)


# ------------------------------------------------------------------------------------------ units


def _units_in_checks() -> set[str]:
    """Every unit string a check can give: unit="..." keywords and "unit": "..." dict entries."""
    found = set()
    for path in CHECKS_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "unit":
                assert isinstance(node.value, ast.Constant), f"{path}: a computed unit: list it by hand here"
                found.add(node.value.value)
            if isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values):
                    if isinstance(k, ast.Constant) and k.value == "unit" and isinstance(v, ast.Constant):
                        found.add(v.value)
    return {u for u in found if u is not None}


def test_every_unit_a_check_uses_has_a_metric():
    used = _units_in_checks()
    assert {"TFLOP/s", "GB/s", "C", "bytes", "GPUs", "events"} <= used  # the walk finds them
    assert used <= set(UNITS), sorted(used - set(UNITS))


@pytest.mark.parametrize(
    ("unit", "name", "factor"),
    [
        ("TFLOP/s", "hostcheck_check_value_flops_per_second", 1e12),
        ("GB/s", "hostcheck_check_value_bytes_per_second", 1e9),
        ("GiB", "hostcheck_check_value_bytes", 2**30),
        ("MiB", "hostcheck_check_value_bytes", 2**20),
        ("bytes", "hostcheck_check_value_bytes", 1),
        ("s", "hostcheck_check_value_seconds", 1),
        ("ms", "hostcheck_check_value_seconds", 1e-3),
        ("%", "hostcheck_check_value_ratio", 0.01),
        ("x", "hostcheck_check_value_ratio", 1),
        ("C", "hostcheck_check_value_celsius", 1),
        ("°C", "hostcheck_check_value_celsius", 1),
        ("img/s", "hostcheck_check_value_images_per_second", 1),
        ("events", "hostcheck_check_value", 1),
        ("pages", "hostcheck_check_value", 1),
        ("GPUs", "hostcheck_check_value", 1),
        ("threads/GPU", "hostcheck_check_value", 1),
        (None, "hostcheck_check_value", 1),
        ("", "hostcheck_check_value", 1),
        ("furlongs/fortnight", "hostcheck_check_value", 1),  # unknown: plain, never a unit label
    ],
)
def test_unit_table(unit, name, factor):
    assert check_value_metric(unit) == (name, factor)


def test_every_unit_name_is_a_valid_metric_name_ending_in_its_base_unit():
    for unit, (suffix, factor) in UNITS.items():
        name, _ = check_value_metric(unit)
        assert name.replace("_", "").isalnum() and factor > 0, unit
        assert not suffix or name.endswith(suffix)


# ------------------------------------------------------------------------------------------ per-GPU data


def test_unavailable_figures_are_left_out_not_zero():
    nv = S.FakeNvml(fail={"nvmlDeviceGetTemperature@2": S.NOT_SUPPORTED})
    snap = S.make_snapshot(nvml=nv)
    rec = {g.index: g for g in gpu_records(snap)}
    assert "temperature_celsius" not in rec[2].quantities and rec[3].quantities["temperature_celsius"] == 37
    assert "retired_pages_double_bit" not in rec[0].quantities  # H100: NOT_SUPPORTED
    text = render_prometheus(report_for(snap))
    assert {s.labels["gpu"] for s in samples(text, "hostcheck_gpu_temperature_celsius")} == {
        str(i) for i in range(8) if i != 2
    }


def test_a_lost_gpu_keeps_a_record_that_says_so():
    nv = S.FakeNvml(fail={"nvmlDeviceGetHandleByIndex@4": S.GPU_IS_LOST})
    rec = {g.index: g for g in gpu_records(S.make_snapshot(nvml=nv))}
    assert rec[4].quantities == {"lost": 1} and rec[4].uuid is None
    text = render_prometheus(report_for(S.make_snapshot(nvml=nv)))
    assert_well_labelled(text)
    assert value(text, "hostcheck_gpu_lost", gpu="4", UUID="", pci_bus_id="") == 1


def test_no_nvml_no_gpu_records_and_still_a_valid_file():
    snap = S.SCENARIOS["no_nvml"][0]()
    assert gpu_records(snap) == ()
    text = render_prometheus(report_for(snap))
    assert_well_labelled(text)
    assert not any(n.startswith("hostcheck_gpu_") for n in families(text))


def test_xid_events_are_counted_per_gpu_by_pci_address():
    xids = (
        XidEvent(pci="0000:3a:00", xid=79, text="GPU has fallen off the bus"),
        XidEvent(pci="0000:3a:00", xid=13, text="Graphics Engine Exception"),
        XidEvent(pci="0000:ff:00", xid=13, text="not one of ours"),
    )
    snap = S.make_snapshot(system=S.h100_system(xid_events=xids))
    rec = {g.index: g for g in gpu_records(snap)}
    assert rec[2].quantities["xid_events"] == 2 and rec[0].quantities["xid_events"] == 0
    unreadable = S.make_snapshot(system=S.h100_system(xid_events=Unavailable(NOT_SUPPORTED, "no journal")))
    assert all("xid_events" not in g.quantities for g in gpu_records(unreadable))


def test_nvml_bus_id_form():
    assert nvml_bus_id("0000:3b:00.0") == "00000000:3B:00.0"
    assert nvml_bus_id("0001:af:1f.7") == "00000001:AF:1F.7"
    assert nvml_bus_id(None) is None and nvml_bus_id("garbage") == "garbage"


def test_the_workload_figures_are_parsed_once_into_typed_devices():
    run = suite_run(2, order=[1, 0])
    d0 = run.devices[0]
    assert run.devices is run.devices  # parsed once, then kept
    assert (d0.index, d0.pci_bus_id) == (0, f"0000:{S.H100_BUSES[1]}:00.0")
    assert d0.matmul_flops_per_second == {"bf16": pytest.approx(701e12), "fp16": pytest.approx(690e12)}
    assert d0.copy_bytes_per_second["device_copy"] == pytest.approx(2950e9)
    assert "h2d_pageable" not in d0.copy_bytes_per_second  # an error row is no figure
    assert d0.quantities == {
        "burn_median_flops_per_second": pytest.approx(650e12),
        "burn_min_flops_per_second": pytest.approx(600e12),
        "burn_result_mismatches": 0,
    }
    # Planted: what a broken or hostile child writes never becomes a figure.
    rows = [
        {
            "index": 0,
            "dtypes": {"bf16": {"tflops": float("nan")}, "fp16": {"tflops": True}, 7: {"tflops": 1}},
        },
        {"index": True, "dtypes": {"bf16": {"tflops": 1.0}}},
        "row",
        {"index": 1, "dtypes": {"bf16": {"tflops": 10**400}}},
    ]
    recs = ({"probe": "matmul", "event": "start"}, {"probe": "matmul", "ok": True, "data": {"gpus": rows}})
    bad = WorkloadRun(suite=ProbeRun(name="suite", records=recs), sections=("matmul",))
    assert [(d.index, d.matmul_flops_per_second) for d in bad.devices] == []


def test_the_pci_address_is_typed_once_where_it_is_read():
    gpu = S.make_snapshot().nvml.gpus[0]  # the fake NVML answers 00000000:18:00.0
    assert isinstance(gpu.pci_bus_id, BusId) and gpu.pci_bus_id == "0000:18:00.0"
    assert (gpu.pci_bus_id.nvml, gpu.pci_bus_id.kernel) == ("00000000:18:00.0", "0000:18:00")
    # Built by hand (a test, another gatherer): typed the same way; text that is no address stays as it was.
    assert GpuInfo(index=0, pci_bus_id="0000:3B:00.0").pci_bus_id.nvml == "00000000:3B:00.0"
    assert GpuInfo(index=0, pci_bus_id="garbage").pci_bus_id.kernel == "garbage"
    assert GpuInfo(index=0, pci_bus_id=Unavailable(NOT_SUPPORTED, "x")).pci_bus_id.kind == NOT_SUPPORTED


def test_the_json_document_carries_the_gpus_and_matches_the_schema():
    jsonschema = pytest.importorskip("jsonschema")
    snap = dataclasses.replace(S.make_snapshot(), workload=suite_run())
    doc = json.loads(json.dumps(report_for(snap, all_checks()).to_dict()))
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    g0 = doc["gpus"][0]
    assert g0["pci_bus_id"] == "00000000:18:00.0" and g0["uuid"].startswith("GPU-")
    assert g0["quantities"]["temperature_celsius"] == 34
    assert g0["matmul_flops_per_second"]["bf16"] == pytest.approx(700e12)
    assert Report(results=(), verdict=verdict([])).to_dict()["gpus"] == []


# ------------------------------------------------------------------------------------------ last success


def test_a_ready_run_sets_last_success_to_its_own_time(tmp_path):
    report = report_for(S.make_snapshot())
    assert report.verdict.ready
    text = render_prometheus(report, last_success=123.0)
    assert value(text, LAST_SUCCESS) == WHEN_EPOCH
    path = tmp_path / "hostcheck.prom"
    write_report(str(path), text)
    assert read_last_success(str(path)) == WHEN_EPOCH


def test_a_run_that_is_not_ready_keeps_the_old_files_value(tmp_path):
    path = str(tmp_path / "hostcheck.prom")
    write_report(path, render_prometheus(report_for(S.make_snapshot())))
    bad = report_for(S.SCENARIOS["pcie_x8"][0](), when="2026-11-24T03:00:00Z")
    assert not bad.verdict.ready
    write_report(path, render_prometheus(bad, last_success=read_last_success(path)))
    text = Path(path).read_text()
    assert value(text, LAST_SUCCESS) == WHEN_EPOCH
    assert value(text, "hostcheck_last_run_timestamp_seconds") == WHEN_EPOCH + 86400
    # and again: the carried value survives any number of bad runs
    write_report(path, render_prometheus(bad, last_success=read_last_success(path)))
    assert read_last_success(path) == WHEN_EPOCH


def test_a_run_that_is_not_ready_and_no_old_value_has_no_last_success():
    bad = report_for(S.SCENARIOS["pcie_x8"][0]())
    text = render_prometheus(bad, last_success=None)
    assert LAST_SUCCESS not in families(text)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"garbage\x00\xff\xfe not a textfile\n",
        f"{LAST_SUCCESS} NaN\n".encode(),
        f"{LAST_SUCCESS} +Inf\n".encode(),
        f"{LAST_SUCCESS} -5\n".encode(),
        f"{LAST_SUCCESS} twelve\n".encode(),
        f"{LAST_SUCCESS}_other 5\n".encode(),
        f"# {LAST_SUCCESS} 5\n".encode(),
        b"#" * (READ_LIMIT + 10) + f"\n{LAST_SUCCESS} 5\n".encode(),  # past what is read
    ],
)
def test_a_garbage_old_file_gives_no_last_success(tmp_path, content):
    path = tmp_path / "hostcheck.prom"
    path.write_bytes(content)
    assert read_last_success(str(path)) is None
    bad = report_for(S.SCENARIOS["pcie_x8"][0]())
    assert LAST_SUCCESS not in families(render_prometheus(bad, read_last_success(str(path))))


def test_last_success_reads_what_a_textfile_may_hold(tmp_path):
    path = tmp_path / "hostcheck.prom"
    path.write_text(f"# HELP x y\n{LAST_SUCCESS}{{}} 1.7e9 1700000000000\n")
    assert read_last_success(str(path)) == 1.7e9
    assert read_last_success(str(tmp_path / "missing.prom")) is None
    assert read_last_success(str(tmp_path)) is None  # a folder


def test_last_success_never_opens_a_fifo_or_follows_a_link(tmp_path):
    fifo = tmp_path / "fifo.prom"
    os.mkfifo(fifo)
    box = {}
    t = threading.Thread(target=lambda: box.update(v=read_last_success(str(fifo))), daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive() and box == {"v": None}
    target = tmp_path / "target.prom"
    target.write_text(f"{LAST_SUCCESS} 5\n")
    (tmp_path / "link.prom").symlink_to(target)
    assert read_last_success(str(tmp_path / "link.prom")) is None


# ------------------------------------------------------------------------------------------ hostile strings

HOSTILE = 'quote " backslash \\ newline \n tab \t cr \r brace } {x="y"} # HELP ünï€ode 🐍 \\n \udc80 end'


def test_hostile_strings_in_titles_messages_versions_and_gpu_names_still_parse():
    results = [
        Result(
            id="gpu.E001",
            title=HOSTILE,
            category="gpu",
            weight=1.0,
            status=Status.FAIL,
            message=HOSTILE,
            value=3.5,
            unit=HOSTILE,  # an unknown unit: the plain value, and never a label
            hint=HOSTILE,
        ),
        Result(
            id="gpu.E002",
            title="t",
            category="gpu",
            weight=1.0,
            status=Status.PASS,
            message="m",
            value=math.nan,
        ),
        Result(
            id="gpu.E003",
            title="t",
            category="gpu",
            weight=1.0,
            status=Status.PASS,
            message="m",
            value=10**400,
        ),
        Result(
            id="gpu.E004",
            title="t",
            category="gpu",
            weight=1.0,
            status=Status.PASS,
            message="m",
            value=10**400,
            unit="GiB",
        ),
    ]
    gpu = GpuRecord(
        index=0,
        uuid=HOSTILE,
        pci_bus_id=HOSTILE,
        name=HOSTILE,
        quantities={"temperature_celsius": 30, HOSTILE: 1},
        matmul_flops_per_second={HOSTILE: 1e12},
        copy_bytes_per_second={HOSTILE: 1e9},
    )
    report = Report(
        results=tuple(results),
        verdict=verdict(results),
        versions={"driver": HOSTILE, HOSTILE: "x", "9lives": "y", "__reserved": "z", "none": None},
        time=HOSTILE,
        gpus=(gpu,),
    )
    text = render_prometheus(report, last_success=5.0)
    text.encode("utf-8")  # writable: no lone surrogate left
    assert_well_labelled(text)
    clean = HOSTILE.replace("\udc80", "?")
    assert value(text, "hostcheck_check_info", check="gpu.E001")
    assert samples(text, "hostcheck_check_info")[0].labels["title"] == clean
    assert value(text, "hostcheck_check_value", check="gpu.E001") == 3.5
    assert math.isnan(value(text, "hostcheck_check_value", check="gpu.E002"))
    assert {s.labels["check"] for s in samples(text, "hostcheck_check_value")} == {"gpu.E001", "gpu.E002"}
    assert not samples(text, "hostcheck_check_value_bytes")  # an int beyond any float is left out
    assert samples(text, "hostcheck_gpu_info")[0].labels == {
        "gpu": "0",
        "UUID": clean,
        "pci_bus_id": clean,
        "device": "nvidia0",
        "modelName": clean,
    }
    assert value(text, "hostcheck_gpu_matmul_flops_per_second", dtype=clean) == 1e12
    versions = samples(text, "hostcheck_info")[0].labels
    assert versions["driver"] == clean and versions["k_9lives"] == "y" and versions["reserved"] == "z"
    assert "none" not in versions
    assert value(text, "hostcheck_last_run_timestamp_seconds") == 0  # an unparsable time
    assert value(text, LAST_SUCCESS) == 5.0  # not ready: carried over
