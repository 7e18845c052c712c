"""RDMA fabric (fabric.E001-E009) from sysfs trees: a healthy 8 x H100 InfiniBand node and a RoCE node
(tests/unit/fixtures/fabrictree.py, transcribed from the kernel's ABI documents and public dumps), with one fault
planted at a time, twice where a counter must rise between two runs. Each fault is caught by exactly its check,
and the healthy trees pass every check (the GPUs through the fake NVML), scoring 100.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import fabrictree as T
import hostcheck_scenarios as S
import pytest

from hostcheck import gather as G
from hostcheck.checks import all_checks
from hostcheck.config import Config, parse
from hostcheck.core import evaluate
from hostcheck.gather import Options
from hostcheck.gather.rdma import gather_rdma, nccl_list, parse_acs, parse_enum, parse_pci_link, parse_rate
from hostcheck.gather.state import load_state
from hostcheck.registry import Status

FABRIC_IDS = {f"fabric.E00{i}" for i in range(1, 10)}
NOT_OK = (Status.WARN, Status.FAIL, Status.ERROR)
HEALTHY_ENV = "NCCL_IB_HCA=mlx5\nNCCL_SOCKET_IFNAME==eth0\nNCCL_NET_GDR_LEVEL=PXB\n"
EXPECTED = {"fabric": {"expected_ports": 8, "rate_gbps": 400, "link_layer": "InfiniBand"}}


def run(root: Path, tmp: Path, now: float, config: Config | None = None, env: str = HEALTHY_ENV):
    """One real gather of the rdma part (state loaded and saved once), judged with the fake NVML's healthy node."""
    env_file = tmp / "env"
    env_file.write_text(env)
    opts = Options(host_root=str(root), state_file=str(tmp / "state.json"), env_file=str(env_file))
    snap = G.gather(dataclasses.replace(opts, config=config or Config()), {"rdma"})
    rdma = dataclasses.replace(snap.rdma, taken_at=now)
    whole = S.make_snapshot(options=dataclasses.replace(opts, config=config or Config()))
    whole = dataclasses.replace(whole, rdma=rdma)
    results, verdict = evaluate(whole, [c for c in all_checks() if c.category != "workload"])
    return {r.id: r for r in results}, verdict


def not_ok(results) -> set[str]:
    return {i for i, r in results.items() if r.status in NOT_OK}


@pytest.fixture(params=["h100_ib", "h100_roce"])
def node(request, tmp_path):
    return T.build(tmp_path / "host", request.param), request.param


@pytest.fixture
def ib(tmp_path):
    return T.build(tmp_path / "host", "h100_ib")


def test_the_healthy_trees_pass_every_check_and_score_100(node, tmp_path):
    root, kind = node
    first, _ = run(root, tmp_path, 1000.0)
    assert not_ok(first) == set()
    assert "first run" in " ".join(first["fabric.E003"].details)
    results, verdict = run(root, tmp_path, 1300.0)
    assert {i: results[i].status for i in FABRIC_IDS} == dict.fromkeys(FABRIC_IDS, Status.PASS)
    assert verdict.score == 100 and not_ok(results) == set()
    assert "8 RDMA ports ACTIVE/LinkUp" in results["fabric.E001"].message
    assert ("nvidia_peermem" if kind == "h100_roce" else "DMA-BUF") in results["fabric.E008"].message
    assert "GPU 0 (0000:18:00.0): mlx5_0 (switch)" in results["fabric.E006"].details


def test_the_healthy_ib_tree_passes_against_the_expected_fabric(ib, tmp_path):
    results, _ = run(ib, tmp_path, 1000.0, config=parse(EXPECTED))
    assert {i: results[i].status for i in FABRIC_IDS} == dict.fromkeys(FABRIC_IDS, Status.PASS)


def _port(i: int, name: str, text: str):
    return lambda root: (T.port_dir(root, i) / name).write_text(text + "\n")


def _counter(i: int, name: str, value: int):
    return lambda root: (T.port_dir(root, i) / "counters" / name).write_text(f"{value}\n")


def _acs_on(root: Path) -> None:
    g = T.GPU_BUSES[5]
    T.bridge_config(root, T.bdf(g - 1, 1)).write_bytes(T.config_space(0x1D))


def _proprietary(root: Path) -> None:
    (root / "proc/driver/nvidia/version").write_text(T.PROPRIETARY_DRIVER)


def _firmware(root: Path) -> None:
    (root / "sys/class/infiniband/mlx5_7/fw_ver").write_text("28.40.1000\n")


#: fault -> (plant, expected non-pass ids, their status, words the message must hold, config, env)
FAULTS = {
    "port_down": (
        lambda r: (_port(3, "state", "1: DOWN")(r), _port(3, "phys_state", "3: Disabled")(r)),
        "fabric.E001",
        Status.FAIL,
        "mlx5_3 port 1: state DOWN, physical state Disabled",
        None,
        HEALTHY_ENV,
    ),
    "port_at_200": (
        _port(6, "rate", "200 Gb/sec (4X HDR)"),
        "fabric.E002",
        Status.WARN,
        "mlx5_6 port 1 at 200",
        None,
        HEALTHY_ENV,
    ),
    "port_at_200_expected_400": (
        _port(6, "rate", "200 Gb/sec (4X HDR)"),
        "fabric.E002",
        Status.FAIL,
        "mlx5_6 port 1 at 200 Gb/s, expected 400",
        EXPECTED,
        HEALTHY_ENV,
    ),
    "link_downed_rising": (
        _counter(2, "link_downed", 1),
        "fabric.E004",
        Status.FAIL,
        "mlx5_2 port 1: link went down 1",
        None,
        HEALTHY_ENV,
    ),
    "symbol_error_rising": (
        _counter(4, "symbol_error", 5),
        "fabric.E003",
        Status.WARN,
        "mlx5_4 port 1: 5 new error",
        None,
        HEALTHY_ENV,
    ),
    "symbol_error_storm": (
        _counter(4, "symbol_error", 500),
        "fabric.E003",
        Status.FAIL,
        "mlx5_4 port 1: 500 new",
        None,
        HEALTHY_ENV,
    ),
    "nic_on_the_other_numa_node": (
        lambda r: T.move_nic(r, 3),
        "fabric.E006",
        Status.WARN,
        "GPU 3 (0000:5d:00.0)",
        None,
        HEALTHY_ENV,
    ),
    "acs_on_the_switch": (
        _acs_on,
        "fabric.E007",
        Status.FAIL,
        "between GPU 5 (0000:ab:00.0) and mlx5_5: ACSCtl SrcValid+ ReqRedir+",
        None,
        HEALTHY_ENV,
    ),
    "no_gpudirect_path": (
        _proprietary,
        "fabric.E008",
        Status.FAIL,
        "no GPUDirect RDMA path",
        None,
        HEALTHY_ENV,
    ),
    "stale_nccl_ib_hca": (
        lambda r: None,
        "fabric.E009",
        Status.FAIL,
        "NCCL_IB_HCA names mlx5_8, which does not exist",
        None,
        "NCCL_IB_HCA==mlx5_0,mlx5_8\n",
    ),
    "nccl_ifname_down": (
        lambda r: (r / "sys/devices/virtual/net/eth0/operstate").write_text("down\n"),
        "fabric.E009",
        Status.FAIL,
        "NCCL_SOCKET_IFNAME names eth0: eth0 down",
        None,
        HEALTHY_ENV,
    ),
    "firmware_drift": (_firmware, "fabric.E005", Status.WARN, "mlx5_7 at 28.40.1000", None, HEALTHY_ENV),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_is_caught_by_exactly_its_check(fault, ib, tmp_path):
    plant, want, status, words, config, env = FAULTS[fault]
    cfg = parse(config) if config else None
    first, _ = run(ib, tmp_path, 1000.0, config=cfg)  # the healthy tree first: the counters' baseline
    assert not_ok(first) == set()
    plant(ib)
    results, verdict = run(ib, tmp_path, 1300.0, config=cfg, env=env)
    assert not_ok(results) == {want}, {i: results[i].message for i in not_ok(results)}
    assert results[want].status is status and words in results[want].message, results[want].message
    assert results[want].hint
    assert verdict.counts[status.value] == 1 and (status is Status.WARN or not verdict.ready)


def test_counters_already_high_on_a_first_run_are_a_baseline_not_a_fault(ib, tmp_path):
    _counter(2, "link_downed", 3)(ib)
    _counter(4, "symbol_error", 900)(ib)
    results, _ = run(ib, tmp_path, 1000.0)
    assert not_ok(results) == set()
    assert any("baseline" in d for d in results["fabric.E004"].details)


def test_a_counter_that_went_down_is_a_new_baseline(ib, tmp_path):
    _counter(4, "symbol_error", 50)(ib)
    run(ib, tmp_path, 1000.0)
    _counter(4, "symbol_error", 0)(ib)  # the counters were cleared (perfquery -R, a reboot)
    results, _ = run(ib, tmp_path, 1300.0)
    assert results["fabric.E003"].status is Status.PASS


def test_a_node_without_rdma_devices_skips_every_fabric_check(tmp_path):
    root = tmp_path / "host"
    (root / "sys").mkdir(parents=True)
    results, _ = run(root, tmp_path, 1000.0)
    assert {results[i].status for i in FABRIC_IDS} == {Status.SKIP}
    assert "no RDMA device on this node" in results["fabric.E001"].message


def test_acs_unreadable_without_root_is_a_skip_never_off_or_fail(ib, tmp_path):
    for cfg in (ib / "sys/devices").rglob("config"):
        cfg.write_bytes(T.config_space(0x1D)[:64])  # what a non-root reader gets
    results, _ = run(ib, tmp_path, 1000.0)
    assert results["fabric.E007"].status is Status.SKIP and "run as root" in results["fabric.E007"].message
    assert not_ok(results) == set()


def test_the_state_is_loaded_once_and_saved_once_with_every_namespace(ib, tmp_path, monkeypatch):
    from hostcheck.gather import state as st

    calls = {"load": 0, "save": 0}
    load, save = st.load_state, st.save_state

    def counted(name, fn):
        def wrapper(*a, **k):
            calls[name] += 1
            return fn(*a, **k)

        return wrapper

    monkeypatch.setattr(st, "load_state", counted("load", load))
    monkeypatch.setattr(st, "save_state", counted("save", save))
    state = tmp_path / "state.json"
    state.write_text(
        json.dumps({"schema": 1, "taken_at": 1.0, "counters": {"dstate": {"x": 1}, "other": {"y": 2}}})
    )
    snap = G.gather(Options(host_root=str(ib), state_file=str(state)), {"hardware", "rdma"})
    assert calls == {"load": 1, "save": 1}
    kept = load_state(str(state)).previous
    assert kept["rdma"]["mlx5_0:1.symbol_error"] == 0 and "aer" in kept  # both gatherers' counters
    assert kept["other"] == {"y": 2}  # a namespace this run did not read keeps its values
    assert snap.rdma.state.write_error is None and snap.hardware.state is snap.rdma.state


def test_the_command_line_reads_the_fabric_under_the_host_root(ib, tmp_path, capsys):
    from hostcheck import command

    env = tmp_path / "env"
    env.write_text("NCCL_IB_HCA==mlx5_9\n")
    argv = [
        "check",
        "--quick",
        "--json",
        "--only",
        "fabric",
        "--facts-dir",
        str(tmp_path),
        "--env-file",
        str(env),
    ]
    argv += ["--host-root", str(ib), "--state-file", str(tmp_path / "st.json")]
    assert command.main(argv) == 1
    doc = json.loads(capsys.readouterr().out)
    got = {c["id"]: c["status"] for c in doc["checks"]}
    assert got["fabric.E009"] == "fail" and got["fabric.E001"] == "pass"


# --- the pure parsers -------------------------------------------------------------------------------------


def test_parsers_read_the_kernels_forms_and_refuse_garbage():
    assert parse_enum("4: ACTIVE\n") == "ACTIVE" and parse_enum("5: LinkUp") == "LinkUp"
    assert parse_rate("400 Gb/sec (4X NDR)") == 400.0 and parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    assert parse_rate("fast") is None and parse_rate("9" * 40 + " Gb/sec") is None
    target = "../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:18:00.0"
    assert parse_pci_link(target, "0000:18:00.0") == ("pci0000:15", ("0000:15:01.0", "0000:16:00.0"))
    assert parse_pci_link("../../../devices/platform/x", "0000:18:00.0") is None
    assert parse_acs(T.config_space(0)) == () and parse_acs(T.config_space(0x1D)) == (
        "SrcValid",
        "ReqRedir",
        "CmpltRedir",
        "UpstreamFwd",
    )
    assert parse_acs(T.config_space(0)[:64]) is None and parse_acs(T.config_space(None)) == ()
    assert nccl_list("^=mlx5_1:1,mlx5_2") == (True, True, [("mlx5_1", 1), ("mlx5_2", None)])


def test_an_extended_capability_loop_ends():
    import struct

    data = bytearray(4096)
    struct.pack_into("<I", data, 0x100, 0x0001 | (1 << 16) | (0x100 << 20))  # AER pointing at itself
    assert parse_acs(bytes(data)) == ()


def test_the_rdma_snapshot_names_ports_and_nics(ib):
    snap = gather_rdma(str(ib))
    assert [d.name for d in snap.devices] == [f"mlx5_{i}" for i in range(8)]
    d = snap.devices[0]
    assert (d.pci, d.numa_node, d.fw_ver, d.netdevs) == ("0000:1a:00.0", 0, T.FIRMWARE, ("ibp26s0",))
    assert d.ports[0].rate_gbps == 400.0 and d.ports[0].hw_counters["out_of_buffer"] == 0


# --- outputs ----------------------------------------------------------------------------------------------


def _report(root: Path, tmp: Path, plant=None):
    from hostcheck.core import build_report

    run(root, tmp, 1000.0)
    if plant:
        plant(root)
    env_file = tmp / "env"
    opts = Options(host_root=str(root), state_file=str(tmp / "state.json"), env_file=str(env_file))
    snap = dataclasses.replace(S.make_snapshot(options=opts), rdma=G.gather(opts, {"rdma"}).rdma)
    results, verdict = evaluate(snap, [c for c in all_checks() if c.category != "workload"])
    return build_report(snap, results, verdict, started=0.0, when="2026-11-26T00:00:00Z")


def test_per_port_series_parse_and_join_the_gpus_series(ib, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from hostcheck.check.render.prometheus import render_prometheus

    text = render_prometheus(_report(ib, tmp_path))
    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    up = {(s.labels["device"], s.labels["port"]): s for s in samples if s.name == "hostcheck_rdma_port_up"}
    assert len(up) == 8 and all(s.value == 1 for s in up.values())
    rate = [s for s in samples if s.name == "hostcheck_rdma_port_rate_bits_per_second"]
    assert {s.value for s in rate} == {400e9}
    # The join: a port's gpu/UUID are those of hostcheck_gpu_info (and dcgm-exporter's) for the GPU beside it.
    gpus = {(s.labels["gpu"], s.labels["UUID"]) for s in samples if s.name == "hostcheck_gpu_info"}
    ports = {(s.labels["gpu"], s.labels["UUID"]): k for k, s in up.items()}
    assert set(ports) == gpus and ports[("3", "GPU-00000000-0000-0000-0000-000000000003")] == ("mlx5_3", "1")
    errors = [s for s in samples if s.name == "hostcheck_rdma_port_error_counter"]
    assert len(errors) == 8 * 12 and {s.labels["counter"] for s in errors} >= {"symbol_error", "link_downed"}


def test_the_json_report_carries_the_ports_and_matches_the_schema(ib, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    from hostcheck.config import THRESHOLDS_DATA

    doc = _report(ib, tmp_path).to_dict()
    schema = json.loads((THRESHOLDS_DATA.parent / "hostcheck-report.schema.json").read_text())
    jsonschema.validate(doc, schema)
    assert doc["ports"][0] == {
        "device": "mlx5_0",
        "port": 1,
        "link_layer": "InfiniBand",
        "state": "ACTIVE",
        "phys_state": "LinkUp",
        "rate_bits_per_second": 400e9,
        "counters": dict.fromkeys(T.ERROR_COUNTERS, 0),
        "gpu": 0,
        "uuid": "GPU-00000000-0000-0000-0000-000000000000",
    }


def test_the_drain_reason_names_the_port(ib, tmp_path):
    from hostcheck.slurm import drain_reason

    report = _report(ib, tmp_path, lambda r: (T.port_dir(r, 3) / "state").write_text("1: DOWN\n"))
    assert not report.verdict.ready
    reason = drain_reason(report, "hostcheck")
    assert reason.startswith("hostcheck:") and "mlx5_3 port 1" in reason and len(reason) <= 80


def test_the_fleet_page_lists_each_nodes_fabric_faults(ib, tmp_path):
    from hostcheck.fleet import render as fleet_render
    from hostcheck.fleet import reports as fleet

    bad = _report(ib, tmp_path, lambda r: (T.port_dir(r, 3) / "state").write_text("1: DOWN\n")).to_dict()
    nodes = [
        fleet.summarise("gpu-07", bad),
        fleet.summarise("gpu-08", _report(T.build(tmp_path / "ok"), tmp_path / "ok").to_dict()),
    ]
    md = fleet_render.render_fabric_markdown(nodes)
    assert (
        "## Fabric faults" in md
        and "gpu-07" in md
        and "mlx5_3 port 1: state DOWN" in md
        and "gpu-08" not in md
    )
    page = fleet_render.render_html(nodes, "now", fleet_render.render_fabric_html(nodes))
    assert "<h2 id='fabric'>Fabric faults</h2>" in page and "mlx5_3 port 1" in page
    assert (
        fleet_render.render_fabric_markdown([nodes[1]]) == ""
        and fleet_render.render_fabric_html([nodes[1]]) == ""
    )


# --- the configuration and NCCL's list forms -------------------------------------------------------------


def test_the_fabric_section_is_checked_like_every_other():
    from hostcheck.config import ConfigError

    assert parse(EXPECTED).fabric.rate_gbps == 400.0
    for bad, key in (
        ({"fabric": {"link_layer": "Omni-Path"}}, "fabric.link_layer"),
        ({"fabric": {"rate": 400}}, "fabric.rate"),
        ({"fabric": {"expected_ports": -1}}, "fabric.expected_ports"),
        ({"thresholds": {"rdma_link_downed_rise_fail": 0}}, "thresholds.rdma_link_downed_rise_fail"),
    ):
        with pytest.raises(ConfigError) as exc:
            parse(bad)
        assert exc.value.key == key


@pytest.mark.parametrize(
    "env, status, words",
    [
        ("NCCL_IB_HCA=^mlx5\n", Status.FAIL, "excludes every active RDMA port"),
        ("NCCL_IB_HCA=^=mlx5_3\n", Status.PASS, "NCCL_IB_HCA=^=mlx5_3"),
        ("NCCL_IB_HCA==mlx5_0:1,mlx5_1:1\n", Status.PASS, "every named device exists and is up"),
        ("NCCL_IB_HCA==mlx5_0:2\n", Status.FAIL, "names mlx5_0:2, which does not exist"),
        ("NCCL_SOCKET_IFNAME=bond\n", Status.FAIL, "matches no network interface"),
        ("NCCL_SOCKET_IFNAME=^docker,lo\n", Status.PASS, "NCCL_SOCKET_IFNAME=^docker,lo"),
        ("NCCL_NET_GDR_LEVEL=NEAR\n", Status.WARN, "not one of LOC, PIX, PXB, PHB, SYS"),
        ("NCCL_IB_DISABLE=1\n", Status.WARN, "will not use the active RDMA ports"),
        ("OMP_NUM_THREADS=8\n", Status.PASS, "no NCCL device variable set"),
    ],
)
def test_nccl_variables_in_their_documented_forms(ib, tmp_path, env, status, words):
    results, _ = run(ib, tmp_path, 1000.0, env=env)
    r = results["fabric.E009"]
    assert r.status is status and words in r.message, r.message
    assert str(tmp_path / "env") in r.message


def test_a_slower_nic_of_another_model_is_no_peer(ib, tmp_path):
    dev = "sys/class/infiniband/mlx5_8"
    T.put(ib, f"{dev}/board_id", "MT_0000000359\n")  # a front-end NIC of another model
    T.put(ib, f"{dev}/fw_ver", "22.36.1010\n")
    T.rdma_port(ib, dev, 1, "InfiniBand", "200 Gb/sec (4X HDR)")
    results, _ = run(ib, tmp_path, 1000.0)
    assert not_ok(results) == set(), {i: results[i].message for i in not_ok(results)}
    assert "9 active ports, all at the same rate as their peers" in results["fabric.E002"].message


def test_the_fleet_pages_fabric_section_lists_nvlink_faults_too(tmp_path):
    from hostcheck.fleet import render as fleet_render
    from hostcheck.fleet import reports as fleet

    doc = _report(T.build(tmp_path / "ok"), tmp_path / "ok").to_dict()
    assert fleet_render.render_fabric_markdown([fleet.summarise("gpu-09", doc)]) == ""
    (row,) = [c for c in doc["checks"] if c["id"] == "nvlink.E001"]
    row.update(status="fail", message="GPU 3 (GPU-3): 1 of 18 NVLinks down (link 7)")
    md = fleet_render.render_fabric_markdown([fleet.summarise("gpu-09", doc)])
    assert "gpu-09" in md and "`nvlink.E001` fail: GPU 3 (GPU-3): 1 of 18 NVLinks down (link 7)" in md
