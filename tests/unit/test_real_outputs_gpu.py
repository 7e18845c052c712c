"""Real captures replayed through hostcheck's real code paths: every nvidia-smi, kernel-log, rasdaemon, DCGM and
Slurm capture of ../shared/real-outputs (SOURCES.md names each one's public source), read in place by a fake tool
on PATH that answers as the real one did (tests/unit/fixtures/replay_tools.py), and the conclusion SOURCES.md's
last column gives for it asserted. The InfiniBand captures are replayed by the fabric tests."""

from __future__ import annotations

import os
import time
from pathlib import Path

import hostcheck_scenarios as S
import pytest
import replay_tools as R
from real_outputs import REAL_OUTPUTS, conclusions, fake_tool, real_output

from hostcheck import slurm
from hostcheck.checks import all_checks
from hostcheck.config import REASON_MAX, SlurmSettings
from hostcheck.core import build_report, evaluate
from hostcheck.gather import Options, Snapshot
from hostcheck.gather.base import run_cmd
from hostcheck.gather.dcgm import gather_dcgm
from hostcheck.gather.facts import Facts
from hostcheck.gather.hardware import gather_hardware
from hostcheck.gather.nvml import gather_nvml
from hostcheck.gather.system import NO_DRIVER, SystemSnapshot, read_xids
from hostcheck.job.dcgm import DcgmSampler
from hostcheck.registry import Status

GPU_CHECKS = [c for c in all_checks() if c.id.startswith(("gpu.", "nvlink."))]
SYSTEM_CHECKS = [c for c in all_checks() if c.id in ("system.E006", "system.E007")]
DCGM_CHECKS = [
    c for c in all_checks() if c.id in ("gpu.E030", "gpu.E031", "gpu.E032", "gpu.E033", "gpu.E034")
]
BAD = (Status.FAIL, Status.ERROR)


@pytest.fixture
def bindir(tmp_path, monkeypatch):
    """A folder first on PATH, for the fake tools."""
    d = tmp_path / "bin"
    d.mkdir()
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ.get('PATH', '')}")
    return d


def _no_pynvml():
    raise ImportError("no nvidia-ml-py: the nvidia-smi path is replayed")


def smi_checks(bindir: Path, name: str, rc: int = 0) -> dict:
    """The GPU checks on what the fake nvidia-smi answers from capture ``name`` (nvidia-ml-py absent: the
    nvidia-smi fallback, as on a node without it); the kernel module agrees with what nvidia-smi read."""
    R.fake_nvidia_smi(bindir, real_output(name), rc=rc)
    nvml = gather_nvml(loader=_no_pynvml)
    kmod = nvml.driver_version if isinstance(nvml.driver_version, str) else NO_DRIVER
    snap = Snapshot(options=Options(), facts=Facts(), system=SystemSnapshot(driver_version=kmod), nvml=nvml)
    results, _ = evaluate(snap, GPU_CHECKS)
    return {r.id: r for r in results}


def failing(results: dict) -> dict:
    return {i: r for i, r in results.items() if r.status in BAD}


# --------------------------------------------------------------------------------------------- nvidia-smi


@pytest.mark.parametrize(
    "name", ["smi-h100-idle.txt", "smi-h100-load.txt", "smi-h200-idle.txt", "smi-l40s-idle.txt"]
)
def test_a_healthy_gpu_read_through_nvidia_smi_fails_nothing(bindir, name):
    r = smi_checks(bindir, name)
    assert failing(r) == {}, failing(r)
    assert r["gpu.E002"].status is Status.PASS and r["gpu.E002"].value == 1
    if name == "smi-h100-load.txt":  # gpu_burn and two memhogs hold it: reported, not failed
        assert r["gpu.E012"].status is Status.WARN and "gpu_burn" in r["gpu.E012"].message
    if name == "smi-l40s-idle.txt":  # persistence off: a warning at most
        assert r["gpu.E010"].status is Status.WARN


def test_a_mig_h100_read_through_nvidia_smi_is_healthy_and_row_remapping_unreadable_not_a_fault(bindir):
    r = smi_checks(bindir, "smi-h100-mig-idle.txt")
    assert failing(r) == {}, failing(r)
    assert r["gpu.E005"].status is Status.SKIP and "MIG" in r["gpu.E005"].message, r["gpu.E005"]


def test_a_geforce_at_gen1_idle_is_power_saving_not_a_failure(bindir):
    r = smi_checks(bindir, "smi-rtx2080s-idle.txt")
    assert failing(r) == {}, failing(r)
    assert r["gpu.E007"].status is Status.WARN and "gen1 of gen3" in r["gpu.E007"].message


def test_a_driver_library_mismatch_fails_naming_it(bindir):
    r = smi_checks(
        bindir, "smi-driver-mismatch.txt", rc=18
    )  # nvidia-smi exits 18 (NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    assert r["gpu.E001"].status is Status.FAIL and "mismatch" in r["gpu.E001"].message


def test_a_gpu_without_a_device_handle_is_lost_and_named_not_a_permission_problem(bindir):
    r = smi_checks(bindir, "smi-device-handle-unknown.txt", rc=255)
    e2 = r["gpu.E002"]
    assert e2.status is Status.FAIL and "0000:0b:00.0" in e2.message and "lost" in e2.message, e2
    assert "reseat" in e2.hint and "nvidia-smi -r" in e2.hint
    for res in r.values():  # nothing says "run as root", and no temperature or cooling verdict
        assert "root" not in (res.hint or "") and "root" not in res.message, res
    assert r["gpu.E009"].status is Status.SKIP and not r["gpu.E009"].hint
    assert set(failing(r)) == {"gpu.E002"}


def test_a_gpu_that_requires_a_reset_says_so_not_no_gpu_found(bindir):
    r = smi_checks(bindir, "smi-csv-gpu-requires-reset.txt")
    e2 = r["gpu.E002"]
    assert e2.status is Status.FAIL and "GPU 0" in e2.message and "requires a reset" in e2.message, e2
    assert "no GPU found" not in e2.message and "nvidia-smi -r -i 0" in e2.hint
    assert r["gpu.E009"].status is Status.SKIP and not r["gpu.E009"].hint  # no cooling hint for a lost GPU
    assert "fans" not in " ".join(res.hint or "" for res in r.values())


# --------------------------------------------------------------------------------------------- kernel log


def xid_checks(bindir: Path, name: str) -> tuple[dict, Snapshot]:
    """gpu.E011 on the XIDs the real reader finds in what the fake ``journalctl -k`` prints (the capture), on
    the healthy 8 x H100 node's NVML."""
    fake_tool(bindir, "journalctl", stdout=real_output(name))
    events, source = read_xids(run_cmd)
    snap = S.make_snapshot(system=S.h100_system(xid_events=events, xid_source=source))
    results, _ = evaluate(snap, [c for c in GPU_CHECKS if c.id == "gpu.E011"])
    return {r.id: r for r in results}, snap


def drain_reason(snap: Snapshot) -> str:
    results, v = evaluate(snap, [c for c in all_checks() if not c.workload])
    return slurm.drain_reason(build_report(snap, results, v, 0.0, "2026-01-01T00:00:00Z"), "hostcheck")


@pytest.mark.parametrize(
    ("name", "bus", "xid"),
    [
        ("klog-xid79-fallen-off.txt", "0000:a1:00", 79),
        ("klog-xid119-gsp-timeout.txt", "0000:9b:00", 119),
        # No Xid line, only the driver's "has fallen off the bus": an Xid 79 all the same (NVSentinel, gpud).
        ("klog-fallen-off-no-xid.txt", "0000:b3:00", 79),
    ],
)
def test_a_gpu_fault_in_the_kernel_log_fails_naming_the_xid_and_the_gpu(bindir, name, bus, xid):
    r, snap = xid_checks(bindir, name)
    e11 = r["gpu.E011"]
    assert e11.status is Status.FAIL and f"Xid {xid} (" in e11.message and bus in e11.message, e11
    assert e11.brief == f"Xid {xid} on GPU {bus}"
    reason = drain_reason(snap)
    assert len(reason) <= REASON_MAX and f"gpu.E011 Xid {xid} on GPU {bus}" in reason, reason


def test_a_contained_error_is_flagged_on_its_gpu_and_application_xids_are_not_failed(bindir):
    r, _ = xid_checks(bindir, "klog-xid94-contained.txt")
    e11 = r["gpu.E011"]
    assert e11.status is Status.WARN and "Xid 94 (Contained memory error) on GPU 0000:00:08" in e11.message
    assert "ignored: Xid 31" in e11.message and "Xid 43" in e11.message


def test_application_xids_13_and_109_are_not_failed(bindir):
    r, _ = xid_checks(bindir, "klog-xid13-109-app.txt")
    assert r["gpu.E011"].status is Status.WARN and "0000:cb:00" in r["gpu.E011"].message


def test_xid_45_after_nvlink_errors_is_flagged_naming_every_gpu(bindir):
    r, _ = xid_checks(bindir, "klog-xid45-after-149.txt")
    e11 = r["gpu.E011"]
    assert e11.status is Status.WARN and e11.value == 7
    for bus in ("0000:dc:00", "0000:ed:00", "0000:ba:00", "0000:97:00"):
        assert bus in e11.message, e11.message


def hardware_checks(bindir: Path, tmp_path: Path, log: str | None, ras: str | None) -> dict:
    """system.E006/E007 on what the real hardware gatherer reads: the fake ``journalctl -k`` prints the kernel-log
    capture, ``ras-mc-ctl --summary`` the rasdaemon capture (EDAC's sysfs is absent: an empty host root)."""
    if log:
        fake_tool(bindir, "journalctl", stdout=real_output(log))
    else:
        fake_tool(bindir, "journalctl")
        fake_tool(bindir, "dmesg")
    if ras:
        fake_tool(bindir, "ras-mc-ctl", stdout=real_output(ras))
    root = tmp_path / "root"
    root.mkdir()
    hw = gather_hardware(root=str(root), state_file=str(tmp_path / "state.json"), runner=run_cmd)
    results, _ = evaluate(Snapshot(options=Options(host_root=str(root)), hardware=hw), SYSTEM_CHECKS)
    return {r.id: r for r in results}


def test_corrected_machine_checks_are_flagged_although_rasdaemon_says_none(bindir, tmp_path):
    r = hardware_checks(bindir, tmp_path, "klog-mce-corrected.txt", "ras-summary-no-mce.txt")
    assert r["system.E007"].status is Status.WARN and "9 machine-check lines" in r["system.E007"].message


def test_an_edac_uncorrected_error_in_the_kernel_log_fails_the_memory_check(bindir, tmp_path):
    r = hardware_checks(bindir, tmp_path, "klog-edac-ue-apei.txt", None)
    e6 = r["system.E006"]
    assert e6.status is Status.FAIL and "EDAC MC3: 1 UE memory read error" in e6.message, e6
    assert e6.brief == "EDAC MC3 uncorrected memory error"
    assert r["system.E007"].status is Status.WARN  # the APEI report's "Machine check events logged"


def test_a_corrected_error_rasdaemon_recorded_is_flagged(bindir, tmp_path):
    r = hardware_checks(bindir, tmp_path, None, "ras-summary-corrected.txt")
    assert r["system.E007"].status is Status.WARN and "1 Corrected error" in r["system.E007"].message


# ------------------------------------------------------------------------------------------------- DCGM


def dcgm_checks(bindir: Path, diag: str | None, health: str | None = None, rc: int = 0) -> dict:
    """gpu.E030-E034 on what the real DCGM gatherer reads from a fake dcgmi answering from the captures."""
    tool = R.fake_dispatch(
        bindir,
        "dcgmi",
        {
            "diag": (real_output(diag) if diag else None, rc if diag else 1),
            "health": (real_output(health) if health else None, 0 if health else 1),
        },
    )
    snap = Snapshot(options=Options(), dcgm=gather_dcgm(level=3 if diag else 0, dcgmi=str(tool)))
    results, _ = evaluate(snap, DCGM_CHECKS)
    return {r.id: r for r in results}


def test_a_dcgm_2_level_3_run_all_passing_passes_every_category(bindir):
    r = dcgm_checks(bindir, "dcgm-diag-r3-t4-pass.json")
    for cid in ("gpu.E030", "gpu.E031", "gpu.E032", "gpu.E033"):
        assert r[cid].status is Status.PASS, r[cid]


def test_dcgm_3_1_output_with_nulls_parses_and_its_software_results_are_no_hardware_results(bindir):
    r = dcgm_checks(bindir, "dcgm-diag-3.1.0-nulls.txt")
    e30 = r["gpu.E030"]
    assert e30.status is Status.PASS and any(
        d.startswith("Custom/software on GPU 7: pass") for d in e30.details
    )
    # The software plugin's eight results (printed under "Custom") are not counted as hardware tests.
    assert r["gpu.E032"].status is Status.SKIP and "ran no hardware test" in r["gpu.E032"].message


def test_an_sm_stress_failure_fails_the_stress_check_naming_each_gpu(bindir):
    r = dcgm_checks(bindir, "dcgm-diag-1.7-sm-stress-fail.json", rc=226)
    e33 = r["gpu.E033"]
    assert e33.status is Status.FAIL and e33.value == 3, e33
    for gpu in ("sm_stress on GPU 0", "sm_stress on GPU 2", "sm_stress on GPU 3"):
        assert gpu in e33.message
    assert "sm_stress on GPU 1" not in e33.message and "DCGM error 50" in e33.message


def test_healthy_dcgm_health_watches_pass(bindir):
    r = dcgm_checks(bindir, None, "dcgm-health-healthy.json")
    assert r["gpu.E034"].status is Status.PASS


def test_dmon_graphics_activity_is_read_and_the_absent_sm_fields_left_empty(bindir):
    tool = fake_tool(bindir, "dcgmi", stdout=real_output("dcgm-dmon-gract-tenso-drama.txt"))
    sampler = DcgmSampler(0.1, dcgmi=str(tool))
    rows = []
    deadline = time.monotonic() + 20
    while sampler.error is None and time.monotonic() < deadline:
        rows += sampler.poll()
        time.sleep(0.05)
    sampler.close()
    assert len(rows) == 15 and {r.gpu for r in rows} == {0}
    assert max(r.gr_active_pct for r in rows) == pytest.approx(99.8)
    assert all(r.sm_active_pct is None and r.sm_occupancy_pct is None for r in rows)


# ------------------------------------------------------------------------------------------------ Slurm


@pytest.fixture(scope="module")
def sick_report():
    snap = S.SCENARIOS["row_remap_pending"][0]()
    results, v = evaluate(snap, [c for c in all_checks() if not c.workload])
    return build_report(snap, results, v, 0.0, "2026-01-01T00:00:00Z")


@pytest.fixture(scope="module")
def healthy_report():
    snap = S.make_snapshot()
    results, v = evaluate(snap, [c for c in all_checks() if not c.workload])
    return build_report(snap, results, v, 0.0, "2026-01-01T00:00:00Z")


@pytest.mark.parametrize(
    ("name", "node"),
    [
        ("slurm-cu201-20.11-drain.txt", "cu201"),
        ("slurm-oxygen04-17.11-drain.txt", "oxygen-04"),
        ("slurm-gpu010-25.11-drain.txt", "gpu010"),
        ("slurm-n23g0003-down-drain.txt", "n23g0003"),
        ("slurm-server5-25.05-drain-utf8.txt", "server5"),
    ],
)
def test_a_node_drained_by_someone_else_is_never_resumed_or_drained_again(
    bindir, name, node, sick_report, healthy_report
):
    tool, log = R.fake_scontrol(bindir, real_output(name))
    settings = SlurmSettings(drain=True, node=node, scontrol=str(tool))
    for report in (sick_report, healthy_report):
        action = slurm.apply(report, settings, run_cmd)
        assert action.kind == "leave" and node in action.message, action
    assert R.updates(log) == []


def test_slurm_json_nodes_someone_elses_left_alone_and_one_in_service_drained_only_when_sick(
    bindir, sick_report, healthy_report
):
    tool, log = R.fake_scontrol(bindir, real_output("slurm-json-24.11-nodes.json"))
    for node in ("node001", "node005"):
        settings = SlurmSettings(drain=True, node=node, scontrol=str(tool))
        for report in (sick_report, healthy_report):
            assert slurm.apply(report, settings, run_cmd).kind == "leave"
    assert R.updates(log) == []
    settings = SlurmSettings(drain=True, node="node003", scontrol=str(tool))
    assert slurm.apply(healthy_report, settings, run_cmd).kind == "none"
    assert R.updates(log) == []
    action = slurm.apply(sick_report, settings, run_cmd)
    assert action.kind == "drain" and action.reason.startswith("hostcheck: gpu.E005")
    update = R.updates(log)
    assert update == [["update", "nodename=node003", "state=drain", f"reason={action.reason}"]]
    assert len(action.reason) <= REASON_MAX


# ------------------------------------------------------------------------------------------ the coverage


def test_every_capture_but_the_infiniband_ones_is_replayed_by_a_test():
    """Each capture SOURCES.md lists is named by a replay test (the ib*, ibstat* and ibwb* ones by the fabric
    tests): a capture added to the corpus without a test that reads it fails here."""
    names = [n for n in conclusions() if not n.startswith("ib")]
    assert names and all((REAL_OUTPUTS / n).exists() for n in names)
    text = "".join(p.read_text(encoding="utf-8") for p in Path(__file__).parent.glob("test_*.py"))
    missing = [n for n in names if f'"{n}"' not in text]
    assert missing == [], f"captures no test replays: {missing}"
