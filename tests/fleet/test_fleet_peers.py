"""The fleet comparison: one node slower than the other nodes of its GPU model is flagged on both pages with
its numbers; a healthy fleet's spread, and nodes of another model, never are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hostcheck import command
from hostcheck.fleet import peers as fleet_peers

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
#: A healthy fleet's spread between nodes: a few percent.
SPREAD = (1.0, 0.98, 1.02, 0.99, 1.01, 0.995)


def node(host, model=H100, factor=1.0, busbw=470.0, n=8, bf16=780.0, copy=3000.0, h2d=54.0):
    gpus = [
        {
            "index": i,
            "uuid": f"GPU-{host}-{i}",
            "pci_bus_id": f"00000000:{i:02X}:00.0",
            "name": model,
            "quantities": {},
            "matmul_flops_per_second": {"bf16": bf16 * factor * 1e12, "fp16": 740e12},
            "copy_bytes_per_second": {"device_copy": copy * factor * 1e9, "h2d_pinned": h2d * factor * 1e9},
        }
        for i in range(n)
    ]
    e013 = {"id": "workload.E013", "status": "pass", "weight": 1, "message": "x", "value": busbw * factor}
    return {
        "schema_version": 1,
        "host": {"hostname": host},
        "versions": {"driver": "580.159.04", "torch": "2.11.0"},
        "checks": [e013],
        "score": {"value": 100, "ready": True},
        "gpus": gpus,
    }


def fleet_of(slow: str | None = None, factor: float = 0.6) -> dict[str, dict]:
    return {
        f"gpu00{i}": node(f"gpu00{i}", factor=(factor if f"gpu00{i}" == slow else 1.0) * s)
        for i, s in enumerate(SPREAD)
    }


def test_one_slow_node_is_flagged_on_every_figure_with_its_numbers():
    found = fleet_peers.outliers(fleet_of(slow="gpu003"), 0.10)
    assert {o.host for o in found} == {"gpu003"}
    assert {o.figure for o in found} == {"matmul_bf16", "device_copy", "h2d_pinned", "allreduce_busbw"}
    mm = next(o for o in found if o.figure == "matmul_bf16")
    assert mm.group == H100 and mm.unit == "TFLOP/s"
    assert mm.value == pytest.approx(780 * 0.99 * 0.6) and mm.median == pytest.approx(780 * 1.0)
    assert mm.ratio == pytest.approx(0.99 * 0.6, abs=0.01)
    bus = next(o for o in found if o.figure == "allreduce_busbw")
    assert bus.group == f"{H100} x 8" and bus.value == pytest.approx(470 * 0.99 * 0.6)
    assert "of the fleet median" in mm.text() and "TFLOP/s" in mm.text()


def test_a_healthy_fleet_and_another_model_are_never_flagged():
    assert fleet_peers.outliers(fleet_of(), 0.10) == []
    mixed = fleet_of()
    mixed["a100-1"] = node("a100-1", model=A100, bf16=271, copy=1800, busbw=228)
    mixed["a100-2"] = node("a100-2", model=A100, bf16=268, copy=1790, busbw=225)
    assert fleet_peers.outliers(mixed, 0.10) == []  # A100s are compared with A100s only
    # A 4-GPU H100 node's all_reduce is not compared with 8-GPU nodes'.
    mixed["h100-4"] = node("h100-4", n=4, busbw=200.0)
    assert fleet_peers.outliers(mixed, 0.10) == []


def test_a_node_just_inside_the_tolerance_is_not_flagged():
    assert fleet_peers.outliers(fleet_of(slow="gpu003", factor=0.92), 0.10) == []
    assert {o.host for o in fleet_peers.outliers(fleet_of(slow="gpu003", factor=0.85), 0.10)} == {"gpu003"}


@pytest.mark.parametrize(
    "bad",
    [
        None,
        "text",
        {"gpus": "x"},
        {"gpus": [1, None, {"name": 5}, {"name": H100, "matmul_flops_per_second": "fast"}]},
        {"gpus": [{"name": H100, "matmul_flops_per_second": {"bf16": float("nan")}}]},
        {"gpus": [{"name": H100, "copy_bytes_per_second": {"device_copy": True}}], "checks": "x"},
        {"checks": [{"id": "workload.E013", "status": "pass", "value": 10**400}], "gpus": []},
    ],
)
def test_hostile_reports_give_no_figure_and_never_raise(bad):
    reports = fleet_of()
    reports["bad"] = bad
    assert fleet_peers.node_figures(bad) == {} or all(
        v > 0 for v, _ in fleet_peers.node_figures(bad).values()
    )
    assert fleet_peers.outliers(reports, 0.10) == []


def _write(tmp: Path, reports: dict) -> Path:
    d = tmp / "nodes"
    d.mkdir()
    for host, data in reports.items():
        (d / f"{host}.json").write_text(json.dumps(data))
    return d


@pytest.fixture
def conf(tmp_path, monkeypatch):
    """The configuration file hostcheck fleet reads (the one hostcheck check reads), here empty."""
    path = tmp_path / "hostcheck.toml"
    path.write_text("")
    monkeypatch.setattr("hostcheck.config.DEFAULT_PATH", str(path))
    return path


def test_fleet_pages_list_the_slow_node_with_numbers_and_readiness_is_unchanged(tmp_path, conf, capsys):
    reports = fleet_of(slow="gpu003")
    reports["gpu003"]["host"]["hostname"] = "<b>gpu003</b>"
    d = _write(tmp_path, reports)
    rc = command.main(["fleet", str(d), "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0  # a flag is a warning: every node is still ready
    assert "slower than their fleet peers: " in out
    assert "gpu003 matmul_bf16 463.3 TFLOP/s = 59% of the fleet median 780 TFLOP/s" in out
    md = (tmp_path / "fleet.md").read_text()
    assert "## Nodes slower than their fleet peers" in md
    assert "| gpu003 | NVIDIA H100 80GB HBM3 | matmul_bf16 | 463.3 TFLOP/s | 780 TFLOP/s | 59% |" in md
    page = (tmp_path / "fleet.html").read_text()
    assert "<table id='fleet-peers'>" in page and "463.3 TFLOP/s" in page and "<b>gpu003" not in page


def test_fleet_pages_say_none_for_a_healthy_fleet_and_the_config_sets_the_tolerance(tmp_path, conf, capsys):
    d = _write(tmp_path, fleet_of(slow="gpu003", factor=0.85))
    assert command.main(["fleet", str(d), "--out", str(tmp_path)]) == 0
    assert "slower than their fleet peers" in capsys.readouterr().out  # 15% below: flagged at 10%
    conf.write_text("[thresholds]\nfleet_peer_tolerance = 0.2\n")
    assert command.main(["fleet", str(d), "--out", str(tmp_path)]) == 0
    assert "slower than their fleet peers" not in capsys.readouterr().out
    assert "None." in (tmp_path / "fleet.md").read_text()
    assert "<p id='fleet-peers'>None.</p>" in (tmp_path / "fleet.html").read_text()
    conf.write_text("[thresholds]\nfleet_peer_tolerance = 2\n")
    assert command.main(["fleet", str(d), "--out", str(tmp_path)]) == 2  # a bad file is a usage error


def test_the_comparison_as_json_and_prometheus_with_the_numbers(tmp_path, conf, capsys):
    d = _write(tmp_path, fleet_of(slow="gpu003"))
    assert command.main(["fleet", str(d), "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    doc = json.loads((tmp_path / "fleet-peers.json").read_text())
    assert doc["tolerance"] == 0.1 and {o["host"] for o in doc["outliers"]} == {"gpu003"}
    mm = next(o for o in doc["outliers"] if o["figure"] == "matmul_bf16")
    assert mm["value"] == pytest.approx(463.3, abs=0.1) and mm["median"] == pytest.approx(780)
    prom = (tmp_path / "fleet-peers.prom").read_text()
    assert "# TYPE hostcheck_fleet_peer_ratio gauge" in prom
    assert f'hostcheck_fleet_peer_ratio{{node="gpu003",group="{H100}",figure="matmul_bf16"}} 0.594' in prom
    assert "hostcheck_fleet_peer_outliers 4" in prom
    # A healthy fleet: no outlier, and the files say so.
    d2 = tmp_path / "healthy"
    d2.mkdir()
    for host, data in fleet_of().items():
        (d2 / f"{host}.json").write_text(json.dumps(data))
    assert command.main(["fleet", str(d2), "--out", str(tmp_path / "o2")]) == 0
    assert json.loads((tmp_path / "o2" / "fleet-peers.json").read_text())["outliers"] == []
    assert "hostcheck_fleet_peer_outliers 0" in (tmp_path / "o2" / "fleet-peers.prom").read_text()


def test_fleet_config_names_the_file_and_wins_over_the_default(tmp_path, conf, capsys):
    # Old: fleet read only the default file, so a site keeping its settings elsewhere could not set the tolerance.
    d = _write(tmp_path, fleet_of(slow="gpu003", factor=0.85))
    site = tmp_path / "site.toml"
    site.write_text("[thresholds]\nfleet_peer_tolerance = 0.2\n")
    assert command.main(["fleet", str(d), "--out", str(tmp_path), "--config", str(site)]) == 0
    assert "slower than their fleet peers" not in capsys.readouterr().out
    # Absent the option, the default file (empty here) holds: 15% below is flagged at 10%.
    assert command.main(["fleet", str(d), "--out", str(tmp_path)]) == 0
    assert "slower than their fleet peers" in capsys.readouterr().out
    # A named file that is missing is a usage error, never a silent fall back to the default.
    assert command.main(["fleet", str(d), "--out", str(tmp_path), "--config", str(tmp_path / "no.toml")]) == 2
