"""The PromQL joins docs/operations.md gives run as `promtool test rules` cases: hostcheck's own textfile (as
node_exporter would serve it) beside a dcgm-exporter sample transcribed from its repository
(fixtures/promql/dcgm-exporter-sample.prom, with its source). Needs promtool (Debian's `prometheus` package);
skipped without it unless GPUNODE_NEED_PROMTOOL=1 (scripts/test sets it after installing the package)."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from pathlib import Path

import hostcheck_scenarios as S
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from hostcheck.check.render.prometheus import render_prometheus
from hostcheck.checks import all_checks
from hostcheck.core import build_report, evaluate
from hostcheck.report import gpu_records

ROOT = Path(__file__).resolve().parents[2]
DCGM = Path(__file__).parent / "fixtures" / "promql" / "dcgm-exporter-sample.prom"
PROMTOOL = shutil.which("promtool")
HOST = "testhost"  # the sample's hostname label: hostcheck on the same node reports the same name
UUID = "GPU-00000000-0000-0000-0000-000000000000"

pytestmark = pytest.mark.skipif(
    PROMTOOL is None and os.environ.get("GPUNODE_NEED_PROMTOOL") != "1",
    reason="promtool is not installed (Debian: apt-get install prometheus)",
)

# Scrape labels: the two exporters are two targets on one node.
NODE_EXPORTER = {"job": "node", "instance": f"{HOST}:9100"}
DCGM_EXPORTER = {"job": "dcgm", "instance": f"{HOST}:9400"}
DCGM_GPU0 = {
    "gpu": "0",
    "UUID": UUID,
    "pci_bus_id": "",
    "device": "nvidia0",
    "modelName": "NVIDIA T400 4GB",
    "hostname": HOST,
    **DCGM_EXPORTER,
}

#: docs/operations.md's joins -> the samples each must give on hostcheck's GPU 0 beside the dcgm-exporter sample.
EXPECTED: dict[str, list[tuple[dict[str, str], float]]] = {
    "DCGM_FI_DEV_SM_CLOCK * on (UUID) group_left() hostcheck_gpu_info": [(DCGM_GPU0, 139)],
    "DCGM_FI_DEV_SM_CLOCK * on (hostname, device) group_left() hostcheck_gpu_info": [(DCGM_GPU0, 139)],
    "DCGM_FI_DEV_SM_CLOCK unless on (hostname, device) hostcheck_gpu_info": [],
    # Per-link series (labels gpu, UUID, ..., link) summed per GPU meet DCGM's per-GPU NVLink total.
    'sum by (UUID) (hostcheck_gpu_nvlink_errors{counter="crc_flit"}) - on (UUID) '
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": [({"UUID": UUID}, 0)],
    "(hostcheck_gpu_nvlink_up == 0) * on (UUID) group_left(modelName) hostcheck_gpu_info": [],
}


def docs_joins() -> list[str]:
    """The expressions of docs/operations.md's promql block that join with dcgm-exporter (DCGM_ series) or
    group_left a label, without their comments."""
    text = (ROOT / "docs" / "operations.md").read_text()
    block = re.search(r"```promql\n(.*?)```", text, re.S)
    assert block, "docs/operations.md has no promql block"
    exprs = [line.split("  #", 1)[0].strip() for line in block.group(1).splitlines()]
    return [e for e in exprs if "DCGM_" in e or "group_left(" in e]


def hostcheck_series(host: str = HOST, nvml=None) -> list[tuple[str, dict[str, str], float]]:
    """hostcheck's textfile for one healthy GPU named as the sample's, parsed, with node_exporter's labels."""
    snap = S.make_snapshot(nvml=nvml)
    results, v = evaluate(snap, [c for c in all_checks() if c.category != "workload"])
    report = build_report(snap, results, v, started=0.0, when="2026-05-01T12:00:00+00:00")
    gpu0 = dataclasses.replace(gpu_records(snap)[0], name="NVIDIA T400 4GB")
    assert gpu0.uuid == UUID
    report = dataclasses.replace(report, gpus=(gpu0,), host={**report.host, "hostname": host})
    return parse(render_prometheus(report), NODE_EXPORTER)


def parse(text: str, scrape: dict[str, str]) -> list[tuple[str, dict[str, str], float]]:
    # prometheus_client names a counter's sample <family>_total; Prometheus keeps the name the exporter wrote.
    return [
        (s.name if s.name in text else fam.name, {**s.labels, **scrape}, s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    ]


def selector(name: str, labels: dict[str, str]) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    # An empty label value is no label at all in Prometheus (dcgm-exporter's pci_bus_id="" in the sample).
    return name + "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items() if v != "") + "}"


def run_promtool(tmp_path: Path, series, cases: dict[str, list[tuple[dict[str, str], float]]]):
    doc = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": selector(n, labels), "values": f"{value!r}x10"} for n, labels, value in series
                ],
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "5m",
                        "exp_samples": [
                            {"labels": selector("", labels), "value": value} for labels, value in want
                        ],
                    }
                    for expr, want in cases.items()
                ],
            }
        ],
    }
    path = tmp_path / "joins.test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return subprocess.run(
        [PROMTOOL or "promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )


def test_the_docs_list_exactly_the_joins_tested_here():
    assert set(docs_joins()) >= set(EXPECTED), docs_joins()


def test_every_join_in_the_docs_returns_what_it_says_with_a_real_dcgm_exporter_sample(tmp_path):
    series = hostcheck_series() + parse(DCGM.read_text(), DCGM_EXPORTER)
    cases = dict(EXPECTED)
    # group_left(modelName): hostcheck's figure gains the model, the way dcgm-exporter's series carry it.
    temp = next((labels, v) for n, labels, v in series if n == "hostcheck_gpu_temperature_celsius")
    cases["hostcheck_gpu_temperature_celsius * on (UUID) group_left(modelName) hostcheck_gpu_info"] = [
        ({**temp[0], "modelName": "NVIDIA T400 4GB"}, temp[1])
    ]
    assert set(docs_joins()) == set(cases), "a join in docs/operations.md has no expected result here"
    done = run_promtool(tmp_path, series, cases)
    assert done.returncode == 0, done.stdout + done.stderr


def test_without_hostname_and_device_the_node_and_device_joins_find_nothing(tmp_path):
    """The fault the labels fix, planted: hostcheck's series as before (no hostname, no device label) join on
    the UUID only; promtool then sees the on(hostname, device) joins fail, so the test above would catch it."""
    old = [
        (n, {k: v for k, v in labels.items() if k not in ("hostname", "device")}, value)
        for n, labels, value in hostcheck_series()
    ]
    series = old + parse(DCGM.read_text(), DCGM_EXPORTER)
    assert run_promtool(tmp_path, series, {k: v for k, v in EXPECTED.items() if "UUID" in k}).returncode == 0
    for expr in (e for e in EXPECTED if "hostname" in e):
        assert run_promtool(tmp_path, series, {expr: EXPECTED[expr]}).returncode != 0, expr


def test_the_nvlink_joins_name_the_link_that_is_down_and_the_errors_dcgm_has_not_counted(tmp_path):
    """Faults planted on GPU 0: link 7 down and 5 CRC flit errors on link 2 that DCGM's total (0) lacks."""
    fake = S.FakeNvml(gpus=S.gpus_with(0, nvlink_down=(7,), nvlink_errors={(2, "crc_flit"): 5}))
    series = hostcheck_series(nvml=fake) + parse(DCGM.read_text(), DCGM_EXPORTER)
    down = next(
        labels for n, labels, _ in series if n == "hostcheck_gpu_nvlink_up" and labels.get("link") == "7"
    )
    cases = {
        'sum by (UUID) (hostcheck_gpu_nvlink_errors{counter="crc_flit"}) - on (UUID) '
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": [({"UUID": UUID}, 5)],
        "(hostcheck_gpu_nvlink_up == 0) * on (UUID) group_left(modelName) hostcheck_gpu_info": [
            ({**down, "modelName": "NVIDIA T400 4GB"}, 0)
        ],
    }
    done = run_promtool(tmp_path, series, cases)
    assert done.returncode == 0, done.stdout + done.stderr
