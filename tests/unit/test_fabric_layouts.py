"""The fabric checks on the node layouts users own, built from public port maps of real systems
(tests/unit/fixtures/fabrictree.py cites each: NVIDIA's DGX H100/H200 and B200 user guides, Azure HPC health checks'
ND H100 v5 configuration, NVIDIA's Enterprise Reference Architecture for a RoCE fabric, a PCIe-only node), and on
the real captures of ../shared/real-outputs read in place. A healthy node never fails, with no configuration, with
a per-class [fabric] and with its own baseline; each planted fault (a rail NIC missing, a rail at half rate, a NIC
across the socket) fails or warns naming the device, and fails where [fabric] or the baseline expects otherwise.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import fabrictree as T
import hostcheck_scenarios as S
import pytest
import tomllib
from real_outputs import conclusions, real_output

from hostcheck import gather as G
from hostcheck.baseline.record import section
from hostcheck.baseline.toml import emit
from hostcheck.checks import all_checks
from hostcheck.config import Config, parse
from hostcheck.core import build_report, evaluate
from hostcheck.gather import Options
from hostcheck.gather.gdr_write import parse_bw
from hostcheck.gather.inventory import gather_inventory
from hostcheck.gather.rdma import gather_rdma
from hostcheck.gather.rdma_topology import pair_gpus
from hostcheck.registry import Status
from hostcheck.slurm import drain_reason

FABRIC = [c for c in all_checks() if c.category == "fabric"]
NOT_OK = (Status.WARN, Status.FAIL, Status.ERROR)
#: Microsoft's ND H100 v5 guidance for NCCL (the topology file the VM's own PCI tree cannot give).
AZURE_ENV = (
    "NCCL_IB_PCI_RELAXED_ORDERING=1\nNCCL_SOCKET_IFNAME=eth0\nCUDA_DEVICE_ORDER=PCI_BUS_ID\n"
    "NCCL_NET_GDR_LEVEL=5\nNCCL_TOPO_FILE=/opt/microsoft/ndv5-topo.xml\n"
)
#: docs/fabric.md's examples: a DGX H100 (InfiniBand rails, the in-band Ethernet ports of slots 1 and 2) and a
#: RoCE node (400 GbE SuperNIC rails, two north-south ports).
DGX_H100 = {
    "fabric": {
        "expected_ports": 8,
        "rate_gbps": 400,
        "link_layer": "InfiniBand",
        "max_distance": "PXB",
        "ports": [
            {"name": "in-band", "devices": ["mlx5_2", "mlx5_8"], "count": 2, "link_layer": "Ethernet"},
        ],
    }
}
ROCE = {
    "fabric": {
        "max_distance": "PIX",
        "ports": [
            {"name": "rails", "role": "rail", "count": 8, "rate_gbps": 400, "link_layer": "Ethernet"},
            {"name": "north-south", "role": "other", "count": 2, "rate_gbps": 400, "link_layer": "Ethernet"},
        ],
    }
}
CONFIGS = {
    "h100_ib": {"fabric": {"expected_ports": 8, "rate_gbps": 400, "link_layer": "InfiniBand"}},
    "h100_roce": {"fabric": {"expected_ports": 8, "rate_gbps": 200, "link_layer": "Ethernet"}},
    "dgx_h100": DGX_H100,
    "dgx_h200": DGX_H100,
    "dgx_b200": {"fabric": {"expected_ports": 8, "rate_gbps": 400, "link_layer": "InfiniBand"}},
    "azure_nd_h100_v5": {
        "fabric": {
            "expected_ports": 8,
            "rate_gbps": 400,
            "link_layer": "InfiniBand",
            "ports": [
                {"name": "accelerated networking", "devices": ["mlx5_an*"], "count": 1, "rate_gbps": 40}
            ],
        }
    },
    "roce_spectrum_x": ROCE,
}
ENVS = {"azure_nd_h100_v5": AZURE_ENV}


@pytest.fixture
def clock(monkeypatch):
    now = {"t": 1_000_000.0}
    monkeypatch.setattr(G.time, "time", lambda: now["t"])
    return now


def judge(
    root: Path, tmp: Path, clock: dict, config: Config | None = None, env: str = "", runs: int = 2, plant=None
):
    """``runs`` real gathers five minutes apart (the counters' state kept between them), ``plant`` before the
    last; the last one's fabric results, and the snapshot they were judged on."""
    (tmp / "env").write_text(env)
    for n in range(runs):
        if plant is not None and n == runs - 1:
            plant(root)
        clock["t"] += 300
        opts = Options(
            host_root=str(root),
            state_file=str(tmp / "state.json"),
            env_file=str(tmp / "env"),
            facts_dir=str(tmp),
            config=config or Config(),
        )
        snap = dataclasses.replace(S.make_snapshot(options=opts), rdma=G.gather(opts, {"rdma"}).rdma)
        results, verdict = evaluate(snap, FABRIC)
    return {r.id: r for r in results}, verdict, snap


def not_ok(results) -> dict[str, str]:
    return {i: r.message for i, r in results.items() if r.status in NOT_OK}


def baseline_of(root: Path) -> Config:
    """``hostcheck baseline`` on the healthy node, as the configuration reads it back."""
    body, _ = section(gather_inventory(str(root), None), "node-01", "2026-11-26T12:00:00Z")
    return parse(tomllib.loads(emit(body)), "hostcheck.toml")


LAYOUTS = sorted(k for k in T.LAYOUTS if k != "pcie_only")


@pytest.mark.parametrize("kind", LAYOUTS)
def test_a_healthy_node_of_every_layout_never_fails_and_warns_for_nothing(kind, tmp_path, clock):
    node = T.layout(tmp_path / "host", kind)
    results, _verdict, snap = judge(tmp_path / "host", tmp_path, clock, env=ENVS.get(kind, ""))
    assert not_ok(results) == {}, not_ok(results)
    # The rails are found by topology, whatever their names: each GPU with the NIC its port map gives it.
    pairs = {p.gpu: p.nic for p in pair_gpus(snap.rdma) if not p.shared}
    assert pairs == node.rails
    assert results["fabric.E001"].status is Status.PASS and "8 on GPU rails" in results["fabric.E001"].message


@pytest.mark.parametrize("kind", LAYOUTS)
def test_a_healthy_node_passes_against_its_per_class_configuration(kind, tmp_path, clock):
    T.layout(tmp_path / "host", kind)
    results, _, _ = judge(tmp_path / "host", tmp_path, clock, parse(CONFIGS[kind]), ENVS.get(kind, ""))
    assert not_ok(results) == {}, not_ok(results)
    for i in ("fabric.E001", "fabric.E002"):
        assert results[i].status is Status.PASS, results[i].message


@pytest.mark.parametrize("kind", LAYOUTS)
def test_a_healthy_node_passes_against_its_own_baseline(kind, tmp_path, clock):
    T.layout(tmp_path / "host", kind)
    cfg = baseline_of(tmp_path / "host")
    rows = {row[0]: row for row in cfg.baseline.rdma}
    assert all(row[2] in ("InfiniBand", "Ethernet") for row in rows.values())  # the link layer recorded
    results, _, _ = judge(tmp_path / "host", tmp_path, clock, cfg)
    assert not_ok(results) == {}, not_ok(results)
    # A VM's distances (PHB) are judged against the baseline's, not skipped for the topology file.
    assert results["fabric.E006"].status is Status.PASS


def test_the_dgx_h100_baseline_records_each_ports_device_layer_rate_and_gpu(tmp_path):
    node = T.layout(tmp_path / "host", "dgx_h100")
    rows = {row[0]: row for row in baseline_of(tmp_path / "host").baseline.rdma}
    gpu6 = sorted(node.gpus)[6]
    assert rows["mlx5_10:1"] == ("mlx5_10:1", 400.0, "InfiniBand", gpu6, "PIX")
    assert rows["mlx5_2:1"] == ("mlx5_2:1", 200.0, "Ethernet", "", "")
    assert rows["mlx5_1:1"] == ("mlx5_1:1", 0.0, "InfiniBand", "", "")  # down when recorded: presence only


def test_an_old_baseline_with_only_names_and_rates_is_still_read(tmp_path, clock):
    T.layout(tmp_path / "host", "h100_ib")
    old = {"baseline": {"rdma": [{"name": f"mlx5_{i}:1", "rate_gbps": 400} for i in range(8)]}}
    cfg = parse(old)
    assert cfg.baseline.rdma[0] == ("mlx5_0:1", 400.0, "", "", "")
    T.put(tmp_path / "host", "sys/class/infiniband/mlx5_2/ports/1/rate", "200 Gb/sec (4X HDR)\n")
    results, _, _ = judge(tmp_path / "host", tmp_path, clock, cfg)
    assert not_ok(results) == {"fabric.E002": "mlx5_2 port 1: at 200 Gb/s, expected 400 (the baseline)"}


def test_a_node_without_configuration_never_fails_a_port_for_its_rate_or_link_layer_alone(tmp_path, clock):
    """A DGX H100 whose in-band ports came up at 100 GbE instead of 200, and one rail on Ethernet: warnings."""
    root = tmp_path / "host"
    T.layout(root, "dgx_h100")
    T.put(root, "sys/class/infiniband/mlx5_2/ports/1/rate", "100 Gb/sec (4X EDR)\n")
    T.put(root, "sys/class/infiniband/mlx5_5/ports/1/link_layer", "Ethernet\n")
    results, verdict, _ = judge(root, tmp_path, clock)
    assert {i for i, r in results.items() if r.status is Status.FAIL} == set() and verdict.ready
    assert "mlx5_5 port 1: link layer Ethernet, the other rails InfiniBand" in results["fabric.E001"].message


# --- planted faults on a twelve-device node: each named, failing where an expectation says so ------------------

GPU6 = "GPU 6 (0000:d1:00.0)"


def _gone(root: Path) -> None:
    T.remove_nic(root, "mlx5_10")


def _half(root: Path) -> None:
    T.put(root, "sys/class/infiniband/mlx5_4/ports/1/rate", "200 Gb/sec (4X HDR)\n")


def _across(root: Path) -> None:
    T.move_nic(root, "mlx5_10", bus=0xE0, numa=0)  # GPU 6 is on NUMA node 1


#: fault -> expectation ("none", "config", "baseline") -> (the check, its status, words of its message, of its brief)
PLANTED = {
    "rail_missing": (
        _gone,
        {
            "none": (
                "fabric.E001",
                Status.WARN,
                f"{GPU6} has no NIC of its own within PXB",
                "GPU 6: no rail",
            ),
            "config": (
                "fabric.E001",
                Status.FAIL,
                f"7 of 8 'rails' ports: {GPU6} has no NIC of its own within PXB",
                "GPU 6 rail missing, 7/8 rails",
            ),
            "baseline": (
                "fabric.E001",
                Status.FAIL,
                f"mlx5_10:1 missing (in the baseline, the rail of {GPU6})",
                "mlx5_10:1 missing (GPU 6 rail)",
            ),
        },
    ),
    "rail_at_half_rate": (
        _half,
        {
            "none": (
                "fabric.E002",
                Status.WARN,
                "mlx5_4 port 1: at 200 Gb/s, its peers at 400",
                "mlx5_4:1 at 200",
            ),
            "config": (
                "fabric.E002",
                Status.FAIL,
                "mlx5_4 port 1: at 200 Gb/s, expected 400",
                "mlx5_4:1 at 200 Gb/s of 400",
            ),
            "baseline": (
                "fabric.E002",
                Status.FAIL,
                "expected 400 (the baseline)",
                "mlx5_4:1 at 200 Gb/s of 400",
            ),
        },
    ),
    "nic_across_the_socket": (
        _across,
        {
            "none": (
                "fabric.E006",
                Status.WARN,
                f"{GPU6} and mlx5_10 (0000:ce:00.0): SYS, across the SMP interconnect between NUMA nodes "
                "(QPI/UPI) (the GPU on NUMA node 1, the NIC on 0)",
                "GPU 6-mlx5_10 SYS",
            ),
            "config": (
                "fabric.E006",
                Status.FAIL,
                "[fabric] max_distance expects PXB or nearer",
                "GPU 6-mlx5_10 SYS (want PXB)",
            ),
            "baseline": (
                "fabric.E006",
                Status.FAIL,
                "the baseline expects PIX or nearer",
                "GPU 6-mlx5_10 SYS (want PIX)",
            ),
        },
    ),
}


@pytest.mark.parametrize("expectation", ["none", "config", "baseline"])
@pytest.mark.parametrize("fault", sorted(PLANTED))
def test_a_planted_fault_is_named_and_fails_where_an_expectation_says_so(fault, expectation, tmp_path, clock):
    root = tmp_path / "host"
    T.layout(root, "dgx_h100")
    cfg = {"none": None, "config": parse(DGX_H100), "baseline": baseline_of(root)}[expectation]
    plant, by = PLANTED[fault]
    check_id, status, words, brief = by[expectation]
    results, verdict, snap = judge(root, tmp_path, clock, cfg, plant=plant)
    bad = {i: r.status for i, r in results.items() if r.status in NOT_OK}
    assert bad == {check_id: status}, not_ok(results)
    r = results[check_id]
    assert words in r.message and r.brief.startswith(brief), (r.message, r.brief)
    if fault == "rail_missing":  # what to do for a missing device, never "move the NIC"
        assert all(w in r.hint for w in ("lspci", "mlxfwmanager", "mlx5_core")) and "move" not in r.hint
    report = build_report(snap, list(results.values()), verdict, started=0.0, when="2026-11-26T00:00:00Z")
    if status is Status.FAIL:
        reason = drain_reason(report, "hostcheck")
        assert reason.startswith(f"hostcheck: {check_id} ") and len(reason) <= 80, reason
        assert re.search(r"mlx5_\d+|GPU \d", reason) and reason.endswith(r.brief), reason


def test_ten_or_more_devices_pair_by_topology_not_by_name(tmp_path, clock):
    """DGX H100: mlx5_10 and mlx5_11 sort before mlx5_2, yet they are GPU 6's and GPU 7's rails (OSFP2P1, OSFP1P1)."""
    node = T.layout(tmp_path / "host", "dgx_h100")
    results, _, _ = judge(tmp_path / "host", tmp_path, clock)
    gpus = sorted(node.gpus)
    assert f"GPU 6 ({gpus[6]}): mlx5_10 PIX" in results["fabric.E006"].details
    assert f"GPU 1 ({gpus[1]}): mlx5_3 PIX" in results["fabric.E006"].details


def test_a_vm_without_a_topology_file_is_warned_that_its_nics_look_far(tmp_path, clock):
    """Azure ND H100 v5 without NCCL_TOPO_FILE: every GPU's NIC is PHB in the VM's PCI tree, which NCCL would see."""
    T.layout(tmp_path / "host", "azure_nd_h100_v5")
    results, _, _ = judge(tmp_path / "host", tmp_path, clock)
    assert not_ok(results).keys() == {"fabric.E006"}
    assert "PHB, through the CPU's PCIe host bridge" in results["fabric.E006"].message
    with_file, _, _ = judge(tmp_path / "host", tmp_path, clock, env=AZURE_ENV)
    assert (
        with_file["fabric.E006"].status is Status.SKIP and "ndv5-topo.xml" in with_file["fabric.E006"].message
    )


def test_a_pcie_only_node_skips_every_fabric_check(tmp_path, clock):
    T.layout(tmp_path / "host", "pcie_only")
    results, verdict, _ = judge(tmp_path / "host", tmp_path, clock, parse(CONFIGS["dgx_b200"]))
    assert {r.status for r in results.values()} == {Status.SKIP} and verdict.ready
    assert "no RDMA device on this node" in results["fabric.E001"].message


# --- real captures, read in place ---------------------------------------------------------------------------


def test_a_real_h100_sysfs_capture_front_end_nic_and_saturated_counter(tmp_path, clock):
    """leptonai/gpud's H100 capture: 8 x 400 Gb/s NDR plus mlx5_bond_0 at 200 Gb/s Ethernet with other firmware
    (a front-end NIC: no fault), and mlx5_1's link_downed at 255, the 8-bit counter saturated (no fault from one
    snapshot; it cannot rise, so it is said and not judged)."""
    said = conclusions()["ib-h100-8xndr"]
    assert "no fault from one snapshot" in said and "rates match their peers" in said
    root = real_output("ib-h100-8xndr")
    first, _, _ = judge(root, tmp_path, clock, runs=1)
    assert not_ok(first) == {} and first["fabric.E004"].status is Status.SKIP
    results, _, _ = judge(root, tmp_path, clock, runs=1)
    assert not_ok(results) == {}
    assert (
        results["fabric.E001"].status is Status.PASS and "9 of 9 RDMA ports" in results["fabric.E001"].message
    )
    assert results["fabric.E002"].status is Status.PASS
    assert any("mlx5_1 port 1: link_downed saturated at 255" in d for d in results["fabric.E004"].details)
    assert results["fabric.E005"].status is Status.PASS  # the bond's firmware is another model's


def test_a_real_iwarp_capture_with_counters_that_read_na(tmp_path, clock):
    """prometheus/node_exporter's fixture: mlx4_0 two 40 Gb/s QDR ports, i40iw0 whose counters read 'N/A (no
    PMA)': ports up, and the unreadable counters said, never a crash, never a pass for that port."""
    assert "no crash on `N/A` counters" in conclusions()["ib-iwarp-qdr"]
    root = real_output("ib-iwarp-qdr")
    judge(root, tmp_path, clock, runs=1)
    results, _, _ = judge(root, tmp_path, clock, runs=1)
    assert not_ok(results) == {} and results["fabric.E001"].status is Status.PASS
    e003 = results["fabric.E003"]
    assert e003.status is Status.PASS and "1 port without readable counters, not judged" in e003.message
    assert "i40iw0 port 1: no counter read (" in " ".join(e003.details) and "N/A (no PMA)" in " ".join(
        e003.details
    )


#: ibstat's words -> the kernel's sysfs enums (include/rdma/ib_verbs.h ib_port_state, and the phys_state names).
STATES = {"Down": "1: DOWN", "Initializing": "2: INIT", "Armed": "3: ARMED", "Active": "4: ACTIVE"}
PHYS = {"Sleep": "1: Sleep", "Polling": "2: Polling", "Disabled": "3: Disabled", "LinkUp": "5: LinkUp"}


def ibstat_tree(capture: Path, root: Path) -> Path:
    """An ibstat capture laid out as the sysfs files ibstat reads (SOURCES.md's mapping), parsed at test time."""
    fields: dict[str, str] = {}
    dev = ""
    for line in capture.read_text().splitlines():
        m = re.match(r"CA '([^']+)'", line.strip())
        if m:
            dev = m.group(1)
        key, sep, value = line.strip().partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    d = root / "sys/class/infiniband" / dev
    T.put(root, f"sys/class/infiniband/{dev}/fw_ver", fields["Firmware version"] + "\n")
    T.put(root, f"sys/class/infiniband/{dev}/hca_type", fields["CA type"] + "\n")
    rate = f"{fields['Rate']} Gb/sec"
    T.rdma_port(
        root,
        str(d.relative_to(root)),
        1,
        fields["Link layer"],
        rate,
        STATES[fields["State"]],
        PHYS[fields["Physical state"]],
    )
    return root


@pytest.mark.parametrize(
    "name, device",
    [("ibstat-mlx5_10-down-polling.txt", "mlx5_10"), ("ibstat-mlx5_7-down-linkup.txt", "mlx5_7")],
)
def test_ibstat_captures_of_a_port_down_name_the_device(name, device, tmp_path, clock):
    said = conclusions()[name]
    assert "port fault" in said and device in said
    root = ibstat_tree(real_output(name), tmp_path / "host")
    results, _, _ = judge(root, tmp_path, clock, runs=1)
    r = results["fabric.E001"]
    # No topology in the capture: not known to be a rail, so a warning that names it...
    assert (
        r.status is Status.WARN and f"{device} port 1" in r.message and r.brief.startswith(f"{device}:1 DOWN")
    )
    # ...and a failure where the site says every mlx5 port must be up.
    cfg = parse({"fabric": {"ports": [{"name": "hca", "devices": ["mlx5_*"], "count": 1}]}})
    results, _, _ = judge(root, tmp_path, clock, cfg, runs=1)
    assert results["fabric.E001"].status is Status.FAIL and device in results["fabric.E001"].brief


def test_ib_write_bw_report_gbits_bw_average_through_the_probes_parser():
    """perftest's --report_gbits output (SOURCES.md: a linux-rdma/perftest report): an 8-byte post-list test at
    0.48 Gb/s."""
    said = conclusions()["ibwb-8B-gbits.txt"]
    assert "0.48" in said
    text = real_output("ibwb-8B-gbits.txt").read_text()
    assert parse_bw(text, message_bytes=8) == 0.48 and parse_bw(text) is None  # the 8 MiB line is not there


def test_the_rdma_snapshot_of_the_real_capture_names_its_devices():
    snap = gather_rdma(str(real_output("ib-h100-8xndr")))
    names = [d.name for d in snap.devices]
    assert names[:3] == ["mlx5_0", "mlx5_1", "mlx5_4"] and names[-1] == "mlx5_bond_0"
    bond = next(d for d in snap.devices if d.name == "mlx5_bond_0")
    assert bond.ports[0].link_layer == "Ethernet" and bond.ports[0].rate_gbps == 200.0
