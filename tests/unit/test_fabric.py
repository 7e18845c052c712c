"""RDMA fabric (fabric.E001-E009) from sysfs trees: a healthy 8 x H100 InfiniBand node and a RoCE node
(tests/unit/fixtures/fabrictree.py, transcribed from the kernel's ABI documents and public dumps), with one fault
planted at a time, between two runs where a counter must rise. Each fault is caught by exactly its check, its drain
reason names the device and the number in 80 characters, and the healthy trees pass every check, scoring 100.
The real node layouts (DGX, cloud, RoCE) and the real captures are tests/unit/test_fabric_layouts.py's.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import fabrictree as T
import hostcheck_scenarios as S
import pytest

from hostcheck import gather as G
from hostcheck.checks import all_checks
from hostcheck.config import Config, parse
from hostcheck.core import evaluate
from hostcheck.gather import Options
from hostcheck.gather.rdma import (
    gather_rdma,
    nccl_list,
    parse_acs,
    parse_enum,
    parse_pci_link,
    parse_rate,
    per,
    saturated,
)
from hostcheck.gather.state import load_state
from hostcheck.registry import Status

FABRIC_IDS = {f"fabric.E00{i}" for i in range(1, 10)}
COUNTER_IDS = {"fabric.E003", "fabric.E004"}
NOT_OK = (Status.WARN, Status.FAIL, Status.ERROR)
HEALTHY_ENV = "NCCL_IB_HCA=mlx5\nNCCL_SOCKET_IFNAME==eth0\nNCCL_NET_GDR_LEVEL=PXB\n"
EXPECTED = {"fabric": {"expected_ports": 8, "rate_gbps": 400, "link_layer": "InfiniBand"}}
FIVE_MIN = 300.0


@pytest.fixture
def clock(monkeypatch):
    """The gatherer's clock, set by each run: the state file records when the counters were read."""
    now = {"t": 1_000_000.0}
    monkeypatch.setattr(G.time, "time", lambda: now["t"])
    return now


def gather_at(root: Path, tmp: Path, now: float, config: Config | None = None, env: str = HEALTHY_ENV, **kw):
    """One real gather of the rdma part at ``now`` (state loaded and saved once), judged with the fake NVML's
    healthy node."""
    env_file = tmp / "env"
    env_file.write_text(env)
    opts = Options(
        host_root=str(root),
        state_file=str(tmp / "state.json"),
        env_file=str(env_file),
        facts_dir=str(tmp),
        config=config or Config(),
        **kw,
    )
    snap = G.gather(opts, {"rdma"})
    whole = dataclasses.replace(S.make_snapshot(options=opts), rdma=snap.rdma)
    return whole


def run(root: Path, tmp: Path, now: float, clock: dict, config: Config | None = None, env: str = HEALTHY_ENV):
    clock["t"] = now
    whole = gather_at(root, tmp, now, config, env)
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


def test_the_healthy_trees_pass_every_check_and_score_100(node, tmp_path, clock):
    root, kind = node
    first, _ = run(root, tmp_path, 1000.0, clock)
    assert not_ok(first) == set()
    # The first run records the counters without judging them: said, never a pass.
    assert {first[i].status for i in COUNTER_IDS} == {Status.SKIP}
    assert "first run" in first["fabric.E003"].message
    results, verdict = run(root, tmp_path, 1000.0 + FIVE_MIN, clock)
    assert {i: results[i].status for i in FABRIC_IDS} == dict.fromkeys(FABRIC_IDS, Status.PASS)
    assert verdict.score == 100 and not_ok(results) == set()
    assert "8 of 8 RDMA ports ACTIVE/LinkUp" in results["fabric.E001"].message
    assert "8 on GPU rails" in results["fabric.E001"].message
    assert "over 5 min" in results["fabric.E003"].message
    assert ("nvidia_peermem" if kind == "h100_roce" else "DMA-BUF") in results["fabric.E008"].message
    assert "GPU 0 (0000:18:00.0): mlx5_0 PIX" in results["fabric.E006"].details


def test_the_healthy_ib_tree_passes_against_the_expected_fabric(ib, tmp_path, clock):
    run(ib, tmp_path, 1000.0, clock, config=parse(EXPECTED))
    results, _ = run(ib, tmp_path, 1000.0 + FIVE_MIN, clock, config=parse(EXPECTED))
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


#: fault -> (plant, the one non-pass id, its status, words the message holds, the drain reason's words, config, env)
FAULTS = {
    "port_down": (
        lambda r: (_port(3, "state", "1: DOWN")(r), _port(3, "phys_state", "3: Disabled")(r)),
        "fabric.E001",
        Status.FAIL,
        "mlx5_3 port 1 (rail of GPU 3): state DOWN, physical state Disabled",
        "mlx5_3:1 DOWN/Disabled",
        None,
        HEALTHY_ENV,
    ),
    "port_at_200": (
        _port(6, "rate", "200 Gb/sec (4X HDR)"),
        "fabric.E002",
        Status.WARN,
        "mlx5_6 port 1: at 200 Gb/s, its peers at 400",
        "mlx5_6:1 at 200 Gb/s, peers 400",
        None,
        HEALTHY_ENV,
    ),
    "port_at_200_expected_400": (
        _port(6, "rate", "200 Gb/sec (4X HDR)"),
        "fabric.E002",
        Status.FAIL,
        "mlx5_6 port 1: at 200 Gb/s, expected 400 ([fabric] class 'rails')",
        "mlx5_6:1 at 200 Gb/s of 400",
        EXPECTED,
        HEALTHY_ENV,
    ),
    "link_downed_rising": (
        _counter(2, "link_downed", 1),
        "fabric.E004",
        Status.FAIL,
        "mlx5_2 port 1: link_downed +1 in 5 min (1/h), line 1 new",
        "mlx5_2:1 link_downed +1 (1/h)",
        None,
        HEALTHY_ENV,
    ),
    "symbol_error_storm": (
        _counter(4, "symbol_error", 500),
        "fabric.E003",
        Status.FAIL,
        "mlx5_4 port 1: symbol_error +500 in 5 min: 500/h, line 120/h (counted over a whole h)",
        "mlx5_4:1 symbol_error 500/h",
        None,
        HEALTHY_ENV,
    ),
    "buffer_overrun": (
        _counter(1, "excessive_buffer_overrun_errors", 1),
        "fabric.E003",
        Status.FAIL,
        "mlx5_1 port 1: excessive_buffer_overrun_errors +1 in 5 min",
        "mlx5_1:1 excessive_buffer_overrun_errors +1",
        None,
        HEALTHY_ENV,
    ),
    "link_error_recovery_flapping": (
        _counter(5, "link_error_recovery", 40),
        "fabric.E003",
        Status.WARN,
        "mlx5_5 port 1: link_error_recovery +40 in 5 min: 8/min",
        "mlx5_5:1 link_error_recovery 8/min",
        None,
        HEALTHY_ENV,
    ),
    "vl15_dropped": (
        _counter(0, "VL15_dropped", 3),
        "fabric.E003",
        Status.WARN,
        "mlx5_0 port 1: VL15_dropped +3 in 5 min",
        "mlx5_0:1 VL15_dropped +3",
        None,
        HEALTHY_ENV,
    ),
    "nic_on_the_other_numa_node": (
        lambda r: T.move_nic(r, 3),
        "fabric.E006",
        Status.WARN,
        "GPU 3 (0000:5d:00.0) and mlx5_3 (0000:5f:00.0): SYS, across the SMP interconnect between NUMA nodes "
        "(QPI/UPI) (the GPU on NUMA node 0, the NIC on 1)",
        "GPU 3-mlx5_3 SYS",
        None,
        HEALTHY_ENV,
    ),
    "acs_on_the_switch": (
        _acs_on,
        "fabric.E007",
        Status.FAIL,
        "between GPU 5 (0000:ab:00.0) and mlx5_5: ACSCtl SrcValid+ ReqRedir+",
        "ACS on 0000:aa:01.0 (GPU 5-mlx5_5)",
        None,
        HEALTHY_ENV,
    ),
    "no_gpudirect_path": (
        _proprietary,
        "fabric.E008",
        Status.FAIL,
        "no GPUDirect RDMA path",
        "no GPUDirect path (8 GPUs",
        None,
        HEALTHY_ENV,
    ),
    "stale_nccl_ib_hca": (
        lambda r: None,
        "fabric.E009",
        Status.FAIL,
        "NCCL_IB_HCA==mlx5_0,mlx5_8 (",
        "IB_HCA mlx5_8 absent (env:1)",
        None,
        "NCCL_IB_HCA==mlx5_0,mlx5_8\n",
    ),
    "nccl_ifname_down": (
        lambda r: (r / "sys/devices/virtual/net/eth0/operstate").write_text("down\n"),
        "fabric.E009",
        Status.FAIL,
        "names eth0: eth0 down",
        "SOCKET_IFNAME eth0 down (env:2)",
        None,
        HEALTHY_ENV,
    ),
    "firmware_drift": (
        _firmware,
        "fabric.E005",
        Status.WARN,
        "mlx5_7 at 28.40.1000",
        "mlx5_7 fw 28.40.1000, others 28.39.1002",
        None,
        HEALTHY_ENV,
    ),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_is_caught_by_exactly_its_check_and_its_drain_reason_names_it(fault, ib, tmp_path, clock):
    from hostcheck.core import build_report
    from hostcheck.slurm import drain_reason

    plant, want, status, words, reason_words, config, env = FAULTS[fault]
    cfg = parse(config) if config else None
    first, _ = run(ib, tmp_path, 1000.0, clock, config=cfg)  # the healthy tree first: the counters' baseline
    assert not_ok(first) == set()
    plant(ib)
    results, verdict = run(ib, tmp_path, 1000.0 + FIVE_MIN, clock, config=cfg, env=env)
    assert not_ok(results) == {want}, {i: results[i].message for i in not_ok(results)}
    assert results[want].status is status and words in results[want].message, results[want].message
    assert results[want].hint and results[want].brief
    assert verdict.counts[status.value] == 1 and (status is Status.WARN or not verdict.ready)
    if status is Status.FAIL:
        report = build_report(
            S.make_snapshot(), list(results.values()), verdict, started=0.0, when="2026-11-26T00:00:00Z"
        )
        reason = drain_reason(report, "hostcheck")
        assert reason == f"hostcheck: {want} {results[want].brief}" and len(reason) <= 80, reason
        assert reason_words in reason and re.search(r"\d", results[want].brief)
    else:
        assert reason_words in results[want].brief


def test_a_slow_rise_below_its_line_is_said_never_judged(ib, tmp_path, clock):
    """NVSentinel's lines: symbol errors fail above 120/h, transmit discards warn above 100/s; below, said."""
    run(ib, tmp_path, 1000.0, clock)
    _counter(4, "symbol_error", 5)(ib)
    _counter(2, "port_xmit_discards", 900)(ib)
    results, _ = run(ib, tmp_path, 1000.0 + FIVE_MIN, clock)
    r = results["fabric.E003"]
    assert r.status is Status.PASS, r.message
    assert any(
        "mlx5_4 port 1: symbol_error +5 in 5 min: 5/h" in d and "below the line" in d for d in r.details
    )
    assert any("port_xmit_discards +900 in 5 min: 3/s" in d for d in r.details)


def test_a_rise_is_a_rate_over_the_time_between_the_two_readings(ib, tmp_path, clock):
    """130 symbol errors: over 30 minutes they are counted over a whole hour (130/h, fail); over two hours 65/h."""
    run(ib, tmp_path, 1000.0, clock)
    _counter(4, "symbol_error", 130)(ib)
    fast, _ = run(ib, tmp_path, 1000.0 + 1800, clock)
    assert fast["fabric.E003"].status is Status.FAIL and "130/h" in fast["fabric.E003"].message
    _counter(4, "symbol_error", 260)(ib)
    slow, _ = run(ib, tmp_path, 1000.0 + 1800 + 7200, clock)
    assert slow["fabric.E003"].status is Status.PASS
    assert any("symbol_error +130 in 2 h: 65/h" in d for d in slow["fabric.E003"].details)
    assert per(130, 1800, "h") == 130 and per(130, 7200, "h") == 65 and per(3000, 300, "s") == 10


def test_the_state_file_says_when_each_namespace_was_read(ib, tmp_path, clock):
    run(ib, tmp_path, 1000.0, clock)
    state = load_state(str(tmp_path / "state.json"))
    assert state.read_at == {"rdma": 1000.0} and state.elapsed_s(1300.0, "rdma") == 300.0
    # A file written before the times were kept: counts still judged, rates not, and said.
    doc = json.loads((tmp_path / "state.json").read_text())
    del doc["read_at"]
    (tmp_path / "state.json").write_text(json.dumps(doc))
    _counter(4, "symbol_error", 900)(ib)
    _counter(2, "link_downed", 1)(ib)
    results, _ = run(ib, tmp_path, 1300.0, clock)
    assert results["fabric.E004"].status is Status.FAIL and "rate unknown" in results["fabric.E004"].message
    assert results["fabric.E003"].status is Status.PASS
    assert any(
        "rate not judged (the last reading's time unknown)" in d for d in results["fabric.E003"].details
    )


def test_counters_already_high_on_a_first_run_are_recorded_not_judged(ib, tmp_path, clock):
    _counter(2, "link_downed", 3)(ib)
    _counter(4, "symbol_error", 900)(ib)
    results, _ = run(ib, tmp_path, 1000.0, clock)
    assert not_ok(results) == set() and results["fabric.E004"].status is Status.SKIP
    assert any("link_downed 3 since the counters were cleared" in d for d in results["fabric.E004"].details)


def test_a_counter_that_went_down_is_a_new_baseline(ib, tmp_path, clock):
    _counter(4, "symbol_error", 50)(ib)
    run(ib, tmp_path, 1000.0, clock)
    _counter(4, "symbol_error", 0)(ib)  # the counters were cleared (perfquery -R, a reboot)
    results, _ = run(ib, tmp_path, 1300.0, clock)
    assert results["fabric.E003"].status is Status.PASS


def test_a_saturated_counter_cannot_rise_and_is_said_not_judged(ib, tmp_path, clock):
    """link_downed is 8 bits, local_link_integrity_errors 4 (the kernel's PORT_PMA_ATTR widths): at 255 and 15
    they stop. One that reaches its maximum since the last run rose by at least that much."""
    assert saturated("link_downed", 255) and not saturated("link_downed", 254)
    assert saturated("local_link_integrity_errors", 15) and not saturated("symbol_error", 255)
    _counter(1, "link_downed", 255)(ib)
    run(ib, tmp_path, 1000.0, clock)
    results, _ = run(ib, tmp_path, 1300.0, clock)
    r = results["fabric.E004"]
    assert r.status is Status.PASS and "mlx5_1 port 1: link_downed saturated at 255" in " ".join(r.details)
    _counter(3, "link_downed", 255)(ib)
    results, _ = run(ib, tmp_path, 1600.0, clock)
    assert (
        "link_downed +255 in 5 min, now saturated at 255: at least that many"
        in results["fabric.E004"].message
    )


def test_a_port_without_readable_counters_is_said_never_passed(ib, tmp_path, clock):
    for i in range(8):
        for k in T.ERROR_COUNTERS:
            (T.port_dir(ib, i) / "counters" / k).write_text("N/A (no PMA)\n")
    run(ib, tmp_path, 1000.0, clock)
    results, _ = run(ib, tmp_path, 1300.0, clock)
    for i in COUNTER_IDS:
        assert results[i].status is Status.SKIP and "N/A (no PMA)" in results[i].message, results[i].message


def test_a_node_without_rdma_devices_skips_every_fabric_check(tmp_path, clock):
    root = tmp_path / "host"
    (root / "sys").mkdir(parents=True)
    results, _ = run(root, tmp_path, 1000.0, clock)
    assert {results[i].status for i in FABRIC_IDS} == {Status.SKIP}
    assert "no RDMA device on this node" in results["fabric.E001"].message


def test_acs_unreadable_without_root_is_a_skip_never_off_or_fail(ib, tmp_path, clock):
    for cfg in (ib / "sys/devices").rglob("config"):
        cfg.write_bytes(T.config_space(0x1D)[:64])  # what a non-root reader gets
    results, _ = run(ib, tmp_path, 1000.0, clock)
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
        json.dumps(
            {
                "schema": 1,
                "taken_at": 1.0,
                "counters": {"dstate": {"x": 1}, "other": {"y": 2}},
                "read_at": {"other": 1.0},
            }
        )
    )
    snap = G.gather(Options(host_root=str(ib), state_file=str(state)), {"hardware", "rdma"})
    assert calls == {"load": 1, "save": 1}
    kept = load_state(str(state))
    assert kept.previous["rdma"]["mlx5_0:1.symbol_error"] == 0 and "aer" in kept.previous  # both gatherers'
    assert kept.previous["other"] == {"y": 2}  # a namespace this run did not read keeps its values
    assert kept.read_at["other"] == 1.0 and kept.read_at["rdma"] > 1.0  # and its time
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
    got = {c["id"]: c for c in doc["checks"]}
    assert got["fabric.E009"]["status"] == "fail" and got["fabric.E001"]["status"] == "pass"
    assert f"{env}:1" in got["fabric.E009"]["message"]


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
    assert d.ports[0].counters_unread == ""


# --- outputs ----------------------------------------------------------------------------------------------


def _report(root: Path, tmp: Path, clock: dict, plant=None):
    from hostcheck.core import build_report

    run(root, tmp, 1000.0, clock)
    if plant:
        plant(root)
    clock["t"] = 1300.0
    snap = gather_at(root, tmp, 1300.0)
    results, verdict = evaluate(snap, [c for c in all_checks() if c.category != "workload"])
    return build_report(snap, results, verdict, started=0.0, when="2026-11-26T00:00:00Z")


def test_per_port_series_parse_and_join_the_gpus_series(ib, tmp_path, clock):
    from prometheus_client.parser import text_string_to_metric_families

    from hostcheck.check.render.prometheus import render_prometheus

    text = render_prometheus(_report(ib, tmp_path, clock))
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


def test_the_json_report_carries_the_ports_and_matches_the_schema(ib, tmp_path, clock):
    jsonschema = pytest.importorskip("jsonschema")
    from hostcheck.config import THRESHOLDS_DATA

    doc = _report(ib, tmp_path, clock).to_dict()
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


def test_the_fleet_page_lists_each_nodes_fabric_faults(ib, tmp_path, clock):
    from hostcheck.fleet import render as fleet_render
    from hostcheck.fleet import reports as fleet

    bad = _report(
        ib, tmp_path, clock, lambda r: (T.port_dir(r, 3) / "state").write_text("1: DOWN\n")
    ).to_dict()
    ok_tmp = tmp_path / "ok"
    ok_tmp.mkdir()
    nodes = [
        fleet.summarise("gpu-07", bad),
        fleet.summarise("gpu-08", _report(T.build(ok_tmp / "host"), ok_tmp, clock).to_dict()),
    ]
    md = fleet_render.render_fabric_markdown(nodes)
    assert (
        "## Fabric faults" in md
        and "gpu-07" in md
        and "mlx5_3 port 1 (rail of GPU 3): state DOWN" in md
        and "gpu-08" not in md
    )
    page = fleet_render.render_html(nodes, "now", fleet_render.render_fabric_html(nodes))
    assert "<h2 id='fabric'>Fabric faults</h2>" in page and "mlx5_3 port 1" in page
    assert (
        fleet_render.render_fabric_markdown([nodes[1]]) == ""
        and fleet_render.render_fabric_html([nodes[1]]) == ""
    )


def test_a_fault_on_every_port_of_a_large_node_is_one_grouped_line(ib, tmp_path, clock):
    """Today's worst case was one line per port (over 2,600 characters as a drain reason): now one line."""
    run(ib, tmp_path, 1000.0, clock)
    for i in range(8):
        _port(i, "state", "1: DOWN")(ib)
        _port(i, "phys_state", "2: Polling")(ib)
    results, _ = run(ib, tmp_path, 1300.0, clock)
    r = results["fabric.E001"]
    assert r.status is Status.FAIL and r.message.count("state DOWN") == 1 and "(+2 more)" in r.message
    assert len(r.message) < 300 and r.brief == "mlx5_0:1 DOWN/Polling"


# --- the configuration -------------------------------------------------------------------------------------


def test_the_fabric_section_is_checked_like_every_other():
    from hostcheck.config import ConfigError

    with pytest.raises(ConfigError, match=r"retired: fabric\.E003 judges each port counter per unit of time"):
        parse({"thresholds": {"rdma_error_rise_fail": 101}})
    assert parse(EXPECTED).fabric.rate_gbps == 400.0
    rails_twice = {"expected_ports": 8, "ports": [{"name": "r", "role": "rail", "count": 8}]}
    for bad, key in (
        ({"fabric": {"link_layer": "Omni-Path"}}, "fabric.link_layer"),
        ({"fabric": {"rate": 400}}, "fabric.rate"),
        ({"fabric": {"expected_ports": -1}}, "fabric.expected_ports"),
        ({"fabric": {"max_distance": "NEAR"}}, "fabric.max_distance"),
        ({"fabric": {"nccl_users": ["ro ot"]}}, "fabric.nccl_users"),
        ({"fabric": {"ports": [{"name": "x", "count": 1, "role": "gpu"}]}}, "fabric.ports[0].role"),
        ({"fabric": {"ports": [{"name": "x"}]}}, "fabric.ports[0].name"),
        (
            {"fabric": {"ports": [{"name": "x", "count": 1, "devices": ["mlx5 0"]}]}},
            "fabric.ports[0].devices",
        ),
        ({"fabric": rails_twice}, "fabric.ports[0].role"),
        ({"thresholds": {"rdma_link_downed_rise_fail": 0}}, "thresholds.rdma_link_downed_rise_fail"),
        ({"thresholds": {"rdma_error_rise_fail": 101}}, "thresholds.rdma_error_rise_fail"),
        (
            {"baseline": {"rdma": [{"name": "a:1", "rate_gbps": 1, "distance": "FAR"}]}},
            "baseline.rdma[0].distance",
        ),
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
        ("NCCL_NET_GDR_LEVEL=NEAR\n", Status.WARN, "is not one of LOC, PIX, PXB, PHB, SYS"),
        ("NCCL_NET_GDR_LEVEL=LOC\n", Status.WARN, "LOC: NCCL never uses GPUDirect RDMA"),
        ("NCCL_NET_GDR_LEVEL=5\n", Status.PASS, "NCCL_NET_GDR_LEVEL=5"),
        ("NCCL_IB_DISABLE=1\n", Status.WARN, "will not use the active RDMA ports"),
        ("OMP_NUM_THREADS=8\n", Status.PASS, "no NCCL device variable set"),
    ],
)
def test_nccl_variables_in_their_documented_forms(ib, tmp_path, clock, env, status, words):
    results, _ = run(ib, tmp_path, 1000.0, clock, env=env)
    r = results["fabric.E009"]
    assert r.status is status and words in r.message, r.message
    assert str(tmp_path / "env") in r.message


def test_a_slower_nic_of_another_model_is_no_peer(ib, tmp_path, clock):
    dev = "sys/class/infiniband/mlx5_8"
    T.put(ib, f"{dev}/board_id", "MT_0000000359\n")  # a front-end NIC of another model
    T.put(ib, f"{dev}/fw_ver", "22.36.1010\n")
    T.rdma_port(ib, dev, 1, "InfiniBand", "200 Gb/sec (4X HDR)")
    results, _ = run(ib, tmp_path, 1000.0, clock)
    assert not_ok(results) == set(), {i: results[i].message for i in not_ok(results)}
    assert "9 active ports" in results["fabric.E002"].message


def test_the_fleet_pages_fabric_section_lists_nvlink_faults_too(tmp_path, clock):
    from hostcheck.fleet import render as fleet_render
    from hostcheck.fleet import reports as fleet

    doc = _report(T.build(tmp_path / "ok"), tmp_path, clock).to_dict()
    assert fleet_render.render_fabric_markdown([fleet.summarise("gpu-09", doc)]) == ""
    (row,) = [c for c in doc["checks"] if c["id"] == "nvlink.E001"]
    row.update(status="fail", message="GPU 3 (GPU-3): 1 of 18 NVLinks down (link 7)")
    md = fleet_render.render_fabric_markdown([fleet.summarise("gpu-09", doc)])
    assert "gpu-09" in md and "`nvlink.E001` fail: GPU 3 (GPU-3): 1 of 18 NVLinks down (link 7)" in md
