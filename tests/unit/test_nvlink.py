"""NVLink per link (nvlink.E001-E004) from the fake NVML: the healthy 8 x H100 SXM board (18 links per GPU to four
NVSwitches) passes everything; each planted fault (a link down, a link slower or at another version, a GPU that
misses an NVSwitch, replay or CRC errors rising between two runs) is caught by its check and only by it."""

from __future__ import annotations

import dataclasses
import json
import time
import types

import pytest
from fixtures import hostcheck_scenarios as S

from hostcheck import gather as G
from hostcheck.checks import all_checks
from hostcheck.core import evaluate
from hostcheck.gather import Options
from hostcheck.gather.base import GPU_LOST, NOT_INSTALLED, NOT_SUPPORTED, Unavailable
from hostcheck.gather.hardware import gather_hardware
from hostcheck.gather.nvml import gather_nvml, nvlink_counters
from hostcheck.registry import Status

IDS = ("nvlink.E001", "nvlink.E002", "nvlink.E003", "nvlink.E004")
NOT_OK = (Status.WARN, Status.FAIL, Status.ERROR)
UUID = "GPU-00000000-0000-0000-0000-00000000000{}"


def judge(snap):
    results, verdict = evaluate(snap, [c for c in all_checks() if c.category != "workload"])
    return {r.id: r for r in results}, verdict


def not_ok(results):
    return {i for i, r in results.items() if r.status in NOT_OK}


def nvml(**over):
    """The healthy board with GPU ``index``'s answers changed (``index`` defaults to 3)."""
    i = over.pop("index", 3)
    return S.FakeNvml(gpus=S.gpus_with(i, **over))


def test_the_gatherer_reads_every_link_of_every_gpu():
    snap = gather_nvml(nvml=S.FakeNvml(), proc_name=str)
    g = snap.gpus[0]
    assert g.nvlink_active == 18 and len(g.nvlinks) == 18
    lk = g.nvlinks[13]
    assert (lk.link, lk.active, lk.version, lk.speed_mbps) == (13, True, 6, 26562)
    assert (lk.remote_bus_id, lk.remote_type) == ("0000:08:00.0", 2)  # bytes from old bindings, sysfs style
    assert lk.counters() == {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0}
    keys = nvlink_counters(snap.gpus)
    assert len(keys) == 8 * 18 * 4 and keys[f"{UUID.format(0)}.13.crc_flit"] == 0


def test_a_pcie_gpu_has_no_links_and_each_unsupported_call_is_kept_as_a_reason():
    snap = gather_nvml(nvml=S.FakeNvml(gpus=[S.h100_gpu(0, nvlinks=None)]), proc_name=str)
    assert snap.gpus[0].nvlinks == () and snap.gpus[0].nvlink_active == 0
    fake = S.FakeNvml(fail={"nvmlDeviceGetNvLinkErrorCounter": S.NOT_SUPPORTED})
    lk = gather_nvml(nvml=fake, proc_name=str).gpus[0].nvlinks[0]
    assert lk.replay.kind == NOT_SUPPORTED and lk.counters() == {} and lk.version == 6


def test_an_nvidia_ml_py_without_scoped_field_ids_gives_no_speed_but_the_rest():
    class Old(S.FakeNvml):
        def nvmlDeviceGetFieldValues(self, h, fields):
            for f in fields:
                int(f)  # what an old binding does with a (field, scope) pair: TypeError
            return []

    lk = gather_nvml(nvml=Old(), proc_name=str).gpus[0].nvlinks[0]
    assert lk.speed_mbps.kind == NOT_SUPPORTED and lk.version == 6


def test_a_gpu_lost_on_an_nvlink_call_is_a_lost_gpu():
    snap = gather_nvml(nvml=S.FakeNvml(fail={"nvmlDeviceGetNvLinkVersion@2": S.GPU_IS_LOST}), proc_name=str)
    assert snap.gpus[2].lost is not None and snap.gpus[2].lost.kind == GPU_LOST
    assert snap.gpus[1].lost is None


def test_the_healthy_board_passes_every_nvlink_check_naming_gpu_uuid_and_links():
    r, verdict = judge(S.make_snapshot())
    assert verdict.score == 100 and {r[i].status for i in IDS} == {Status.PASS}
    assert f"GPU 0 ({UUID.format(0)}): 18 of 18 NVLinks up" in r["nvlink.E001"].details
    assert f"GPU 7 ({UUID.format(7)}): reaches all 4 NVSwitches" in r["nvlink.E003"].details
    assert any("18 links at 26562 MB/s, NVML version 6 (NVLink 4.0)" in d for d in r["nvlink.E002"].details)


def test_one_link_down_fails_e001_only_and_names_gpu_uuid_and_link():
    r, verdict = judge(S.make_snapshot(nvml=nvml(nvlink_down=(7,))))
    assert not_ok(r) == {"nvlink.E001"} and not verdict.ready
    msg = r["nvlink.E001"].message
    assert f"GPU 3 ({UUID.format(3)}): 17 of 18 NVLinks up; link 7 down" == msg
    assert "nvidia-smi nvlink --status -i 3" in r["nvlink.E001"].hint


def test_a_link_at_a_lower_version_warns_in_e002_only():
    r, verdict = judge(S.make_snapshot(nvml=nvml(index=2, nvlink_versions={9: 5})))
    assert not_ok(r) == {"nvlink.E002"} and r["nvlink.E002"].status is Status.WARN and verdict.ready
    assert verdict.score == 99  # one warning among many checks never rounds up to 100
    assert (
        "GPU 2 (" in r["nvlink.E002"].message
        and "link 9 at NVML version 5 (NVLink 3.1)" in r["nvlink.E002"].message
    )


def test_a_link_below_the_skus_speed_fails_e002_only():
    r, _ = judge(S.make_snapshot(nvml=nvml(index=4, nvlink_speed={3: 13281})))
    assert not_ok(r) == {"nvlink.E002"} and r["nvlink.E002"].status is Status.FAIL
    assert "link 3 at 13281 MB/s (expected 26562 MB/s" in r["nvlink.E002"].message


def test_a_gpu_that_misses_an_nvswitch_fails_e003_only():
    # Links 9-12 reach the second switch instead of the third: every link is up, the topology is not complete.
    def remote(link):
        return S.hgx_switch_of(6 if 9 <= link <= 12 else link)

    class Miswired(S.FakeNvml):
        def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
            return 2

    fake = Miswired(gpus=S.gpus_with(6, nvlink_remote=remote))
    r, _ = judge(S.make_snapshot(nvml=fake))
    assert not_ok(r) == {"nvlink.E003"} and r["nvlink.E003"].status is Status.FAIL
    assert "GPU 6 (" in r["nvlink.E003"].message and "3 of the 4 NVSwitches" in r["nvlink.E003"].message
    assert "0000:07:00.0" in r["nvlink.E003"].message


def test_replay_errors_rising_fail_e004_only_and_a_first_run_is_a_baseline():
    r, _ = judge(S.SCENARIOS["nvlink_replay_rising"][0]())
    assert not_ok(r) == {"nvlink.E004"}
    assert f"GPU 5 ({UUID.format(5)}): link 2 +3 replay errors since the last run" == r["nvlink.E004"].message
    hw = S.h100_hardware()
    first = dataclasses.replace(hw, state=dataclasses.replace(hw.state, previous={}, previous_at=None))
    snap = S.make_snapshot(hardware=first, nvml=nvml(index=5, nvlink_errors={(2, "replay"): 3}))
    r, _ = judge(snap)
    assert r["nvlink.E004"].status is Status.PASS and any("baseline" in d for d in r["nvlink.E004"].details)


def no_command(argv, timeout):
    return Unavailable(NOT_INSTALLED, f"{argv[0]} not found")


def two_runs(monkeypatch, tmp_path, first, second, gap=300.0):
    """hostcheck's own gathering twice with one state file: ``first`` then, ``gap`` s later, ``second``."""
    state = tmp_path / "state.json"

    def run(fake, now):
        monkeypatch.setattr(G, "gather_nvml", lambda: gather_nvml(nvml=fake, proc_name=str))
        monkeypatch.setattr(
            G, "gather_hardware", lambda *a, **k: gather_hardware(*a, **{**k, "runner": no_command})
        )
        # gather() takes one time for the run and saves the state with it.
        monkeypatch.setattr(G, "time", types.SimpleNamespace(time=lambda: now, monotonic=time.monotonic))
        snap = G.gather(Options(state_file=str(state), host_root=str(tmp_path)), {"nvml", "hardware"})
        results, _ = evaluate(snap, [c for c in all_checks() if c.id == "nvlink.E004"])
        return results[0]

    run(first, 1000.0)
    kept = json.loads(state.read_text())["counters"]["nvlink"]
    assert kept[f"{UUID.format(1)}.4.crc_flit"] == 0 and len(kept) == 8 * 18 * 4
    return run(second, 1000.0 + gap)


def test_crc_errors_rising_between_two_runs_warn_and_fail_at_dcgms_rate(monkeypatch, tmp_path):
    r = two_runs(monkeypatch, tmp_path, S.FakeNvml(), S.FakeNvml())
    assert r.status is Status.PASS and "no NVLink error counter rising" in r.message
    r = two_runs(monkeypatch, tmp_path, S.FakeNvml(), nvml(index=1, nvlink_errors={(4, "crc_flit"): 5}))
    assert (
        r.status is Status.WARN
        and r.message == f"GPU 1 ({UUID.format(1)}): link 4 +5 CRC flit errors since the last run"
    )
    # 60,000 in 300 s is 200/s: DCGM fails at 100/s.
    r = two_runs(monkeypatch, tmp_path, S.FakeNvml(), nvml(index=1, nvlink_errors={(4, "crc_data"): 60000}))
    assert r.status is Status.FAIL and "+60000 CRC data errors (200/s)" in r.message


def test_a_pcie_node_without_nvlink_skips_every_nvlink_check_with_the_reason():
    gpus = [S.h100_gpu(i, name="NVIDIA H100 PCIe", nvlinks=None) for i in range(8)]
    r, _ = judge(
        S.make_snapshot(nvml=S.FakeNvml(gpus=gpus), system=S.h100_system(fabric=S.hgx_fabric(nvswitches=())))
    )
    for i in IDS:
        assert r[i].status is Status.SKIP and "no NVLink (a PCIe card" in r[i].message, r[i]


@pytest.mark.parametrize(
    ("function", "check"),
    [
        ("nvmlDeviceGetNvLinkErrorCounter", "nvlink.E004"),
        ("nvmlDeviceGetNvLinkRemotePciInfo", "nvlink.E003"),
        ("nvmlDeviceGetNvLinkState", "nvlink.E001"),
    ],
)
def test_an_unsupported_nvlink_call_skips_its_check_and_fails_nothing(function, check):
    r, verdict = judge(S.make_snapshot(nvml=S.FakeNvml(fail={function: S.NOT_SUPPORTED})))
    assert r[check].status is Status.SKIP and verdict.ready and not_ok(r) == set()


def test_speed_not_supported_still_judges_the_version():
    r, _ = judge(S.make_snapshot(nvml=S.FakeNvml(fail={"nvmlDeviceGetFieldValues": S.NOT_SUPPORTED})))
    assert r["nvlink.E002"].status is Status.PASS and "speed not read" in r["nvlink.E002"].details[0]


MESH = ("00000000:18:00.0", "00000000:2a:00.0", "00000000:3a:00.0", "00000000:5d:00.0")


def mesh_gpu(i, **over):
    """Four GPUs without NVSwitch, each with 4 links to each of the three others (links 0-11)."""
    others = [b for j, b in enumerate(MESH) if j != i]
    base = dict(
        name="NVIDIA A100-SXM4-40GB",
        nvlinks=12,
        nvlink_count=12,
        nvlink_remote=lambda link: others[link // 4],
    )
    base.update(over)
    return S.h100_gpu(i, **base)


def test_a_board_without_nvswitch_passes_when_every_peer_links_back_and_warns_when_one_does_not():
    system = S.h100_system(fabric=S.hgx_fabric(nvswitches=()))
    r, _ = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=[mesh_gpu(i) for i in range(4)]), system=system))
    assert r["nvlink.E003"].status is Status.PASS and "GPU 0 (" in r["nvlink.E003"].details[0]
    assert "GPU 1 x4, GPU 2 x4, GPU 3 x4" in r["nvlink.E003"].details[0]
    # GPU 2 lists one link fewer to GPU 0 (the far end of a link that went down): a warning on both sides.
    gpus = [mesh_gpu(i) for i in range(4)]
    gpus[2] = mesh_gpu(2, nvlink_down=(0,))
    r, _ = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=gpus), system=system))
    assert r["nvlink.E003"].status is Status.WARN
    assert "4 link(s) to GPU 2, which has 3 back" in r["nvlink.E003"].message
    # No SKU line for this model: an inactive link warns (whether it is wired is not known).
    assert r["nvlink.E001"].status is Status.WARN and "link 0 down" in r["nvlink.E001"].message


def test_per_link_series_carry_dcgm_exporters_gpu_labels_and_the_link():
    from prometheus_client.parser import text_string_to_metric_families

    from hostcheck.check.render.prometheus import render_prometheus
    from hostcheck.core import build_report

    snap = S.make_snapshot(nvml=nvml(nvlink_down=(7,), nvlink_errors={(2, "replay"): 4}))
    results, verdict = evaluate(snap, [c for c in all_checks() if c.category == "nvlink"])
    text = render_prometheus(build_report(snap, results, verdict, started=0.0, when="2026-11-26T00:00:00Z"))
    got = {
        (s.name, s.labels.get("gpu"), s.labels.get("link"), s.labels.get("counter")): (s.labels, s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name.startswith("hostcheck_gpu_nvlink_")
    }
    labels, value = got[("hostcheck_gpu_nvlink_up", "3", "7", None)]
    assert value == 0 and labels["UUID"] == UUID.format(3) and labels["device"] == "nvidia3"
    assert got[("hostcheck_gpu_nvlink_up", "3", "6", None)][1] == 1
    assert got[("hostcheck_gpu_nvlink_errors", "3", "2", "replay")][1] == 4
    assert got[("hostcheck_gpu_nvlink_speed_bytes_per_second", "0", "0", None)][1] == 26562e6
    assert ("hostcheck_gpu_nvlink_speed_bytes_per_second", "3", "7", None) not in got  # a down link: no speed
    assert len([k for k in got if k[0] == "hostcheck_gpu_nvlink_up"]) == 8 * 18


# ------------------------------------------------------- MIG, PCIe cards, bridged pairs, SKUs with estimates

PCIE_SYSTEM = {"fabric": S.hgx_fabric(nvswitches=())}


def test_mig_gpus_report_every_nvlink_down_and_are_not_judged():
    """NVML reports the NVLinks of a MIG-enabled GPU as down (DCGM's workaround for NVIDIA bug 200682374:
    dcgmlib/src/DcgmTopology.cpp UpdateNvLinkLinkStateFromNvml treats them as disabled, and
    modules/health/DcgmHealthWatch.cpp MonitorNVLinkStatus skips them): the fake answers every link
    NVML_FEATURE_DISABLED, as NVML does. Not a fault: nothing fails, and the report says why it was not judged."""
    gpus = [S.h100_gpu(i, mig=(1, 1), nvlink_down=tuple(range(18))) for i in range(8)]
    r, verdict = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=gpus)))
    for i in ("nvlink.E001", "nvlink.E002", "nvlink.E003"):
        assert r[i].status is Status.SKIP and "MIG mode is on" in r[i].message, r[i]
    assert "baseboard" not in (r["nvlink.E001"].hint or "") and verdict.ready, r["nvlink.E001"]
    # One GPU in MIG mode: the links of the others to it read down too; they are not judged either.
    gpus = [S.h100_gpu(i, nvlink_down=(0, 1)) for i in range(8)]
    gpus[0] = S.h100_gpu(0, mig=(1, 1), nvlink_down=tuple(range(18)))
    e001 = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=gpus)))[0]["nvlink.E001"]
    assert e001.status is Status.SKIP and any("MIG mode is on for GPU 0" in d for d in e001.details), e001
    # Without MIG the same link down is a fault, and still fails.
    assert judge(S.make_snapshot(nvml=nvml(nvlink_down=(0, 1))))[0]["nvlink.E001"].status is Status.FAIL


@pytest.mark.parametrize("name", ["NVIDIA A100 80GB PCIe", "NVIDIA H100 PCIe"])
def test_a_pcie_card_without_a_bridge_lists_its_links_down_and_is_healthy(name):
    """NVIDIA/NVSentinel#1481: an A100 80GB PCIe without an NVLink bridge (driver 570) answers the NVLink state
    call with success and every one of its 12 links disabled (DCGM's health watch then failed it: NVIDIA/DCGM#49).
    That is the card's healthy state: none expected, nothing fails; with a bridge the links are up and pass, and a
    bridge with links down warns."""
    bare = [S.h100_gpu(i, name=name, nvlinks=0, nvlink_count=12) for i in range(4)]
    r, _ = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=bare), system=S.h100_system(**PCIE_SYSTEM)))
    e001 = r["nvlink.E001"]
    assert e001.status is Status.SKIP and "without an NVLink bridge: none expected" in e001.message, e001
    assert not_ok({i: r[i] for i in IDS}) == set()
    bridged = [S.h100_gpu(i, name=name, nvlinks=12, nvlink_count=12) for i in range(4)]
    bridged[2] = S.h100_gpu(2, name=name, nvlinks=12, nvlink_count=12, nvlink_down=(8, 9, 10, 11))
    e001 = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=bridged), system=S.h100_system(**PCIE_SYSTEM)))[0]
    assert e001["nvlink.E001"].status is Status.WARN and "bridge seen" in e001["nvlink.E001"].message


def test_an_h100_nvl_has_about_12_links_up_to_its_pair_an_estimate_that_only_warns():
    """NVML lists 18 links on an H100 NVL (NVIDIA/DCGM#198: dcgmi nvlink --link-status on device 2321). NVIDIA's
    H100 page gives its bridges 600 GB/s, 12 links at 50 GB/s, but no document states the count: 12 up passes,
    fewer only warns, and a card with none up has no bridge fitted and is not judged."""

    def run(up):
        gpus = [S.h100_gpu(i, name="NVIDIA H100 NVL", nvlinks=up, nvlink_count=18) for i in range(2)]
        snap = S.make_snapshot(nvml=S.FakeNvml(gpus=gpus), system=S.h100_system(**PCIE_SYSTEM))
        return judge(snap)[0]["nvlink.E001"]

    e001 = run(12)
    assert e001.status is Status.PASS and "12 of 12 NVLinks up" in e001.details[0], e001
    e001 = run(11)
    assert e001.status is Status.WARN and "11 of 12 NVLinks up" in e001.message, e001
    assert "12 is an estimate for h100-nvl: warns, never fails" in e001.message
    e001 = run(0)
    assert e001.status is Status.SKIP and "without its NVLink bridge" in e001.message, e001
    assert "NVML lists 18 links, down" in e001.message


def test_an_h200_has_its_18_links_judged_and_its_estimated_speed_only_warns():
    """H200 SXM: 18 NVLink 4 links (NVIDIA's MLPerf Inference v4.1 system description of its H200-SXM-141GB node:
    "18x 4th Gen NVLink, 900GB/s") - a link down fails as on H100. Its per-link speed has no public figure: H100's 26562 MB/s is an estimate, so a slower link warns and
    says so."""
    h200 = "NVIDIA H200"
    down = judge(S.make_snapshot(nvml=nvml(name=h200, nvlink_down=(4,))))[0]["nvlink.E001"]
    assert down.status is Status.FAIL and "17 of 18 NVLinks up" in down.message, down
    slow = judge(
        S.make_snapshot(
            nvml=S.FakeNvml(gpus=[S.h100_gpu(i, name=h200, nvlink_speed=20000) for i in range(8)])
        )
    )
    e002 = slow[0]["nvlink.E002"]
    assert e002.status is Status.WARN and "an estimate for the SKU: warns, never fails" in e002.message, e002
    healthy = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=[S.h100_gpu(i, name=h200) for i in range(8)])))[0]
    assert {healthy[i].status for i in IDS} == {Status.PASS}


def test_an_unknown_sku_is_compared_with_its_peers_only():
    """'NVIDIA GH200 480GB' is no H200 and no SKU of the table: no line of its own. A GPU with fewer links up
    than its peers warns; links down everywhere are not judged (nothing says how many it should have)."""
    gh = "NVIDIA GH200 480GB"
    few = [S.h100_gpu(i, name=gh) for i in range(4)]
    few[1] = S.h100_gpu(1, name=gh, nvlink_down=(3,))
    e001 = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=few)))[0]["nvlink.E001"]
    assert e001.status is Status.WARN and "unknown SKU" in e001.message and "GPU 1" in e001.message, e001
    none_up = [S.h100_gpu(i, name=gh, nvlinks=0) for i in range(4)]
    e001 = judge(S.make_snapshot(nvml=S.FakeNvml(gpus=none_up), system=S.h100_system(**PCIE_SYSTEM)))[0]
    assert e001["nvlink.E001"].status is Status.SKIP and "unknown SKU" in e001["nvlink.E001"].message
