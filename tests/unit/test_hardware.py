"""Host hardware (system.E006-E010) and consistency inside a node (gpu.E015-E019), from fixtures.

The host side reads a copy of tests/unit/fixtures/hosttree/h100 (a node's /sys and /proc, transcribed from the
kernel's documents) with one fault planted at a time, twice where a counter must rise between two runs; the GPU
side is the fake NVML. Each fault is caught by exactly its check, and the healthy node passes all of them.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import hostcheck_scenarios as S
import pytest

from hostcheck.checks import all_checks
from hostcheck.config import Config, HardwareSettings, parse
from hostcheck.core import evaluate
from hostcheck.gather import Options
from hostcheck.gather.base import CmdResult, Unavailable
from hostcheck.gather.hardware import (
    gather_hardware,
    parse_aer,
    parse_kernel_log,
    parse_ras_summary,
    parse_stat,
)
from hostcheck.gather.state import RESET, RISING, load_state
from hostcheck.registry import Status

TREE = Path(__file__).parent / "fixtures" / "hosttree" / "h100"
HOST_IDS = {"system.E006", "system.E007", "system.E008", "system.E009", "system.E010"}
GPU_IDS = {"gpu.E015", "gpu.E016", "gpu.E017", "gpu.E018", "gpu.E019"}
NOT_OK = (Status.WARN, Status.FAIL, Status.ERROR)

#: ras-mc-ctl --summary on a clean node, as rasdaemon's util/ras-mc-ctl.in prints it.
RAS_CLEAN = "No Memory errors.\n\nNo PCIe AER errors.\n\nNo Extlog errors.\n\nNo MCE errors.\n"
#: ... and with MCE records ("MCE records summary:" then "\t<count> <error_msg> errors").
RAS_MCE = "No Memory errors.\n\nNo PCIe AER errors.\n\nMCE records summary:\n\t2 Corrected error, no action required errors\n"
#: arch/x86/kernel/cpu/mce/core.c prints HW_ERR ("[Hardware Error]: ") before every report.
MCE_LINE = "2026-11-26T08:01:02+0000 node kernel: mce: [Hardware Error]: Machine check events logged\n"
#: kernel/hung_task.c.
HUNG_LINE = (
    "2026-11-26T08:02:00+0000 node kernel: INFO: task kworker/u8:2:4242 blocked for more than 122 seconds.\n"
)


def runner(log: str = "", ras: str | None = RAS_CLEAN):
    def run(argv, timeout):
        if argv[0] == "journalctl":
            return CmdResult(0, log, "")
        if argv[0] == "ras-mc-ctl":
            return CmdResult(0, ras, "") if ras is not None else Unavailable("not_installed", "not found")
        return Unavailable("not_installed", f"{argv[0]} not found")

    return run


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "host"
    shutil.copytree(TREE, root)
    return root


def put(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def aer(root: Path, address: str, which: str, total: int) -> None:
    key = {"correctable": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL", "fatal": "TOTAL_ERR_FATAL"}[
        which
    ]
    put(root, f"sys/bus/pci/devices/{address}/aer_dev_{which}", f"DLP {total}\n{key} {total}\n")


def d_task(root: Path, pid: int, switches: int, state: str = "D", start: int = 777000) -> None:
    fields = [str(pid), "(nfsd worker)", state] + ["0"] * 18 + [str(start)] + ["0"] * 20
    put(root, f"proc/{pid}/stat", " ".join(fields) + "\n")
    put(root, f"proc/{pid}/task/{pid}/stat", " ".join(fields) + "\n")
    status = f"Name:\tnfsd\nvoluntary_ctxt_switches:\t{switches}\nnonvoluntary_ctxt_switches:\t1\n"
    put(root, f"proc/{pid}/status", status)
    put(root, f"proc/{pid}/task/{pid}/status", status)


def gather(root: Path, state: Path, now: float, **kw):
    kw.setdefault("runner", runner())
    return gather_hardware(str(root), str(state), now=now, **kw)


def judge(hardware=None, nvml=None, config: Config | None = None):
    snap = S.make_snapshot(nvml=nvml, hardware=hardware, options=Options(config=config or Config()))
    results, _ = evaluate(snap, [c for c in all_checks() if c.category != "workload"])
    return {r.id: r for r in results}


def not_ok(results) -> set[str]:
    return {i for i, r in results.items() if r.status in NOT_OK}


def two_runs(tree: Path, tmp_path: Path, plant, gap: float = 300.0, **kw):
    """A run on the healthy tree, ``plant(tree)``, and a run ``gap`` seconds later: the second's results."""
    state = tmp_path / "state" / "state.json"
    gather(tree, state, 1000.0, **kw)
    plant(tree)
    return judge(gather(tree, state, 1000.0 + gap, **kw))


# --- the healthy tree --------------------------------------------------------------------------------------


def test_the_healthy_tree_is_read_and_passes_every_host_check(tree, tmp_path):
    state = tmp_path / "state.json"
    first = gather(tree, state, 1000.0)
    assert [m.name for m in first.edac] == ["mc0", "mc1"] and first.edac[1].ce == 3
    # The two GPUs and two NICs; the NVSwitch and the BMC's VGA are not read.
    assert {(d.address, d.kind) for d in first.aer} == {
        ("0000:18:00.0", "GPU"),
        ("0000:2a:00.0", "GPU"),
        ("0000:1a:00.0", "NIC"),
        ("0000:2c:00.0", "NIC"),
    }
    assert first.blocked == () and first.mce_lines == () and first.ras_mce == {}
    r1 = judge(first)
    assert not_ok(r1) == set()
    assert "first run" in r1["system.E010"].message
    assert any("baseline" in d for d in r1["system.E006"].details)
    second = judge(gather(tree, state, 1300.0))
    assert not_ok(second) == set()
    assert "300 s ago" in second["system.E010"].message
    assert all(second[i].status is Status.PASS for i in HOST_IDS)


def test_the_healthy_scenario_passes_the_new_checks(healthy):
    results, _ = evaluate(healthy, [c for c in all_checks() if c.id in HOST_IDS | GPU_IDS])
    assert {r.id: r.status for r in results} == dict.fromkeys(HOST_IDS | GPU_IDS, Status.PASS)


# --- EDAC ----------------------------------------------------------------------------------------------


def test_corrected_errors_rising_past_the_threshold_warn(tree, tmp_path):
    r = two_runs(tree, tmp_path, lambda t: put(t, "sys/devices/system/edac/mc/mc1/ce_count", "13\n"))
    assert not_ok(r) == {"system.E006"} and r["system.E006"].status is Status.WARN
    assert "mc1" in r["system.E006"].message and "10 corrected" in r["system.E006"].message
    assert r["system.E006"].hint


def test_corrected_errors_rising_below_the_threshold_pass(tree, tmp_path):
    r = two_runs(tree, tmp_path, lambda t: put(t, "sys/devices/system/edac/mc/mc1/ce_count", "5\n"))
    assert not_ok(r) == set() and any("+2" in d for d in r["system.E006"].details)


def test_an_uncorrected_error_fails_even_on_a_first_run(tree, tmp_path):
    put(tree, "sys/devices/system/edac/mc/mc0/ue_count", "1\n")
    r = judge(gather(tree, tmp_path / "state.json", 1000.0))
    assert not_ok(r) == {"system.E006"} and r["system.E006"].status is Status.FAIL
    assert "mc0: 1 uncorrected" in r["system.E006"].message


def test_a_counter_that_went_down_resets_the_baseline_and_says_so(tree, tmp_path):
    state = tmp_path / "state.json"
    put(tree, "sys/devices/system/edac/mc/mc1/ce_count", "40\n")
    gather(tree, state, 1000.0)
    put(tree, "sys/devices/system/edac/mc/mc1/ce_count", "0\n")  # rebooted
    snap = gather(tree, state, 2000.0)
    assert snap.state.trend("edac", "mc1.ce", 0).kind == RESET
    r = judge(snap)
    assert not_ok(r) == set() and any("reset" in d for d in r["system.E006"].details)
    put(tree, "sys/devices/system/edac/mc/mc1/ce_count", "30\n")  # judged from the new baseline
    r = judge(gather(tree, state, 3000.0))
    assert r["system.E006"].status is Status.WARN and "30 corrected" in r["system.E006"].message


def test_no_edac_driver_skips(tree, tmp_path):
    shutil.rmtree(tree / "sys/devices/system/edac")
    r = judge(gather(tree, tmp_path / "state.json", 1000.0))
    assert r["system.E006"].status is Status.SKIP and "no EDAC driver" in r["system.E006"].message


# --- PCIe AER ------------------------------------------------------------------------------------------


def test_uncorrectable_aer_errors_rising_fail_and_name_the_device(tree, tmp_path):
    r = two_runs(tree, tmp_path, lambda t: aer(t, "0000:2a:00.0", "nonfatal", 1))
    assert not_ok(r) == {"system.E009"} and r["system.E009"].status is Status.FAIL
    assert "GPU 0000:2a:00.0: 1 new nonfatal" in r["system.E009"].message


def test_fatal_aer_errors_on_a_nic_fail(tree, tmp_path):
    r = two_runs(tree, tmp_path, lambda t: aer(t, "0000:2c:00.0", "fatal", 2))
    assert not_ok(r) == {"system.E009"} and "NIC 0000:2c:00.0" in r["system.E009"].message


def test_correctable_aer_errors_warn_only_past_their_threshold(tree, tmp_path):
    r = two_runs(tree, tmp_path, lambda t: aer(t, "0000:1a:00.0", "correctable", 14))
    assert not_ok(r) == {"system.E009"} and r["system.E009"].status is Status.WARN
    r = two_runs(tree, tmp_path / "b", lambda t: aer(t, "0000:1a:00.0", "correctable", 15))
    assert not_ok(r) == set()  # +1 since the run before: under 10


def test_uncorrectable_errors_on_a_first_run_warn_never_fail(tree, tmp_path):
    aer(tree, "0000:18:00.0", "nonfatal", 3)
    r = judge(gather(tree, tmp_path / "state.json", 1000.0))
    assert r["system.E009"].status is Status.WARN and "no history yet" in r["system.E009"].message


def test_a_device_without_aer_counters_is_said(tree, tmp_path):
    for d in ("0000:18:00.0", "0000:2a:00.0", "0000:1a:00.0", "0000:2c:00.0"):
        for f in ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal"):
            (tree / "sys/bus/pci/devices" / d / f).unlink()
    r = judge(gather(tree, tmp_path / "state.json", 1000.0))
    assert r["system.E009"].status is Status.SKIP and "no AER counters" in r["system.E009"].message


def test_aer_parsing_reads_the_total_line():
    text = (TREE / "sys/bus/pci/devices/0000:1a:00.0/aer_dev_correctable").read_text()
    assert parse_aer(text, "correctable") == 2
    assert parse_aer("RxErr 1\n", "correctable") is None
    assert parse_aer("TOTAL_ERR_FATAL 99999999999999999999999\n", "fatal") is None


# --- D state -------------------------------------------------------------------------------------------


def test_a_task_blocked_in_d_state_across_two_runs_warns(tree, tmp_path):
    state = tmp_path / "state.json"
    d_task(tree, 4242, switches=17)
    first = judge(gather(tree, state, 1000.0))
    assert (
        first["system.E008"].status is Status.PASS
        and "judged at the next run" in first["system.E008"].message
    )
    r = judge(gather(tree, state, 1200.0))
    assert not_ok(r) == {"system.E008"} and r["system.E008"].status is Status.WARN
    assert "nfsd worker (pid 4242, tid 4242) blocked for at least 200 s" in r["system.E008"].message


def test_a_d_state_task_that_ran_in_between_or_too_recently_passes(tree, tmp_path):
    state = tmp_path / "state.json"
    d_task(tree, 4242, switches=17)
    gather(tree, state, 1000.0)
    d_task(tree, 4242, switches=18)  # it was scheduled: in D again, not stuck
    assert judge(gather(tree, state, 1200.0))["system.E008"].status is Status.PASS
    assert judge(gather(tree, state, 1260.0))["system.E008"].status is Status.PASS  # 60 s: under 120
    d_task(tree, 4242, switches=18, start=999)  # the pid was reused by another task
    assert judge(gather(tree, state, 1500.0))["system.E008"].status is Status.PASS


def test_the_hung_task_detectors_report_warns(tree, tmp_path):
    r = judge(gather(tree, tmp_path / "state.json", 1000.0, runner=runner(log=HUNG_LINE)))
    assert not_ok(r) == {"system.E008"} and "hung-task report" in r["system.E008"].message


def test_stat_parsing_survives_parentheses_in_comm():
    line = (TREE / "proc/812/task/813/stat").read_text()
    assert parse_stat(line) == ("python3 (train)", "R", 90000)
    assert parse_stat("garbage") is None


# --- machine checks ------------------------------------------------------------------------------------


def test_a_machine_check_in_the_kernel_log_warns(tree, tmp_path):
    r = judge(gather(tree, tmp_path / "state.json", 1000.0, runner=runner(log=MCE_LINE)))
    assert not_ok(r) == {"system.E007"} and r["system.E007"].status is Status.WARN
    assert "1 machine-check line" in r["system.E007"].message


def test_rasdaemons_mce_records_warn(tree, tmp_path):
    r = judge(gather(tree, tmp_path / "state.json", 1000.0, runner=runner(ras=RAS_MCE)))
    assert not_ok(r) == {"system.E007"} and "rasdaemon" in r["system.E007"].message
    assert parse_ras_summary(RAS_MCE) == {"Corrected error, no action required": 2}
    assert parse_ras_summary(RAS_CLEAN) == {}


def test_without_rasdaemon_the_kernel_log_alone_is_judged(tree, tmp_path):
    r = judge(gather(tree, tmp_path / "state.json", 1000.0, runner=runner(ras=None)))
    assert r["system.E007"].status is Status.PASS and "rasdaemon" not in r["system.E007"].message


def test_kernel_log_parsing_keeps_mce_and_hung_lines_apart():
    mce, hung = parse_kernel_log(MCE_LINE + HUNG_LINE + "an unrelated line\n")
    assert len(mce) == 1 and len(hung) == 1


# --- the state file ------------------------------------------------------------------------------------


def test_garbage_state_is_no_history_a_warning_and_left_as_it_is(tree, tmp_path):
    state = tmp_path / "state.json"
    state.write_text("{not json")
    r = judge(gather(tree, state, 1000.0))
    assert not_ok(r) == {"system.E010"} and "not JSON" in r["system.E010"].message
    assert "left as it is" in r["system.E010"].message
    assert state.read_text() == "{not json"  # not hostcheck's file: never overwritten


def test_an_unwritable_state_folder_warns_and_never_crashes(tree, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = judge(gather(tree, blocker / "state.json", 1000.0))  # its folder is a file
    assert not_ok(r) == {"system.E010"} and "not kept" in r["system.E010"].message


def test_a_fifo_or_device_in_place_of_the_state_is_refused_without_blocking(tree, tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert "not a regular file" in load_state(str(fifo)).read_error.reason
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    assert "not a regular file" in load_state(str(link)).read_error.reason


def test_state_values_of_the_wrong_type_are_dropped(tmp_path):
    state = tmp_path / "state.json"
    state.write_text(
        '{"schema": 1, "taken_at": "x", "counters": {"edac": {"mc0.ce": -1, "mc1.ce": true, "a": 4}}}'
    )
    st = load_state(str(state))
    assert st.previous == {"edac": {"a": 4}} and st.previous_at is None
    assert st.trend("edac", "a", 6).kind == RISING and st.trend("edac", "a", 6).delta == 2


# --- consistency inside the node (fake NVML) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("over", "check", "words"),
    [
        ({"vbios": "96.00.74.00.0D"}, "gpu.E016", "GPU 3 at 96.00.74.00.0D"),
        ({"power_limit": 500000}, "gpu.E017", "GPU 3 at 500 W"),
        ({"app_clocks": (1410, 2619)}, "gpu.E018", "GPU 3: application clocks 1410/2619 MHz"),
        ({"mig": (1, 1)}, "gpu.E019", "MIG mode differs: on for GPU 3"),
        ({"mig": (0, 1)}, "gpu.E019", "GPU 3: MIG on pending"),
    ],
)
def test_one_gpu_apart_is_caught_by_exactly_its_check(over, check, words):
    r = judge(nvml=S.FakeNvml(gpus=S.gpus_with(3, **over)))
    assert not_ok(r) == {check} and r[check].status is Status.WARN and r[check].hint
    assert words in r[check].message, r[check].message


def test_mig_on_everywhere_passes_and_is_reported():
    r = judge(nvml=S.FakeNvml(gpus=[S.h100_gpu(i, mig=(1, 1), app_clocks=(1000, 1000)) for i in range(8)]))
    assert not_ok(r) == set()
    assert "MIG on: GPU 0, 1" in r["gpu.E019"].message and "per MIG instance" in r["gpu.E019"].message
    assert r["gpu.E018"].status is Status.SKIP  # never judged on what MIG changes


def test_mig_expected_off_and_on_by_config():
    all_on = S.FakeNvml(gpus=[S.h100_gpu(i, mig=(1, 1)) for i in range(8)])
    r = judge(nvml=all_on, config=Config(hardware=HardwareSettings(mig="off")))
    assert r["gpu.E019"].status is Status.WARN and "expected off" in r["gpu.E019"].message
    r = judge(config=Config(hardware=HardwareSettings(mig="on")))
    assert r["gpu.E019"].status is Status.WARN and "expected on" in r["gpu.E019"].message


def test_configured_application_clocks_are_the_target():
    cfg = parse({"hardware": {"app_clock_graphics_mhz": 1410, "app_clock_memory_mhz": 2619}})
    r = judge(config=cfg)
    assert r["gpu.E018"].status is Status.WARN and "configured 1410/2619" in r["gpu.E018"].message
    r = judge(nvml=S.FakeNvml(gpus=[S.h100_gpu(i, app_clocks=(1410, 2619)) for i in range(8)]), config=cfg)
    assert r["gpu.E018"].status is Status.PASS


def test_a_power_limit_set_apart_from_the_default_on_every_gpu_passes_and_is_said():
    r = judge(nvml=S.FakeNvml(gpus=[S.h100_gpu(i, power_limit=600000) for i in range(8)]))
    assert r["gpu.E017"].status is Status.PASS and "not the board's default" in r["gpu.E017"].message


def test_unsupported_consistency_fields_skip():
    fail = {f: S.NOT_SUPPORTED for f in ("nvmlDeviceGetVbiosVersion", "nvmlDeviceGetMigMode")}
    r = judge(nvml=S.FakeNvml(fail=fail))
    assert r["gpu.E016"].status is Status.SKIP and r["gpu.E019"].status is Status.PASS


# --- PCIe replays (NVML), rising since the last run ------------------------------------------------------


def test_pcie_replays_rising_faster_than_dcgms_limit_warn():
    # 300 s since the last run: 50 replays is 10/min, over DCGM's 8/min; 30 is 6/min.
    r = judge(nvml=S.FakeNvml(gpus=S.gpus_with(6, replays=50)))
    assert not_ok(r) == {"gpu.E015"} and "GPU 6: +50 PCIe replays" in r["gpu.E015"].message
    r = judge(nvml=S.FakeNvml(gpus=S.gpus_with(6, replays=30)))
    assert not_ok(r) == set() and any("+30" in d for d in r["gpu.E015"].details)


def test_pcie_replays_first_run_and_reset_never_warn():
    hw = S.h100_hardware()
    first = dataclasses.replace(hw, state=dataclasses.replace(hw.state, previous={}, previous_at=None))
    r = judge(hardware=first, nvml=S.FakeNvml(gpus=S.gpus_with(6, replays=5000)))
    assert r["gpu.E015"].status is Status.PASS and any("baseline" in d for d in r["gpu.E015"].details)
    prev = {**hw.state.previous, "pcie_replay": {"GPU-00000000-0000-0000-0000-000000000006": 9000}}
    reset = dataclasses.replace(hw, state=dataclasses.replace(hw.state, previous=prev))
    r = judge(hardware=reset, nvml=S.FakeNvml(gpus=S.gpus_with(6, replays=10)))
    assert r["gpu.E015"].status is Status.PASS and any("new baseline" in d for d in r["gpu.E015"].details)


def test_the_nvml_replay_counters_are_kept_for_the_next_run(tree, tmp_path):
    state = tmp_path / "state.json"
    gather(tree, state, 1000.0, replays={"GPU-x": 4})
    assert load_state(str(state)).previous["pcie_replay"] == {"GPU-x": 4}
    gather(tree, state, 1100.0)  # a run without NVML keeps the last replay counts
    assert load_state(str(state)).previous["pcie_replay"] == {"GPU-x": 4}


def test_fields_nvidia_smi_does_not_read_are_skipped_never_passed():
    """Without nvidia-ml-py the GPU figures come from nvidia-smi, which reads none of these: nothing is judged."""
    from hostcheck.gather.nvml import GpuInfo, NvmlSnapshot

    gpus = tuple(GpuInfo(index=i, name="NVIDIA H100 80GB HBM3", uuid=f"GPU-{i}") for i in range(2))
    snap = dataclasses.replace(
        S.make_snapshot(), nvml=NvmlSnapshot(gpus=gpus, device_count=2, source="nvidia-smi")
    )
    results, _ = evaluate(snap, [c for c in all_checks() if c.id in GPU_IDS])
    assert {r.id: r.status for r in results} == dict.fromkeys(GPU_IDS, Status.SKIP), results


def test_mig_unreadable_on_one_gpu_is_said_not_counted_as_off():
    r = judge(nvml=S.FakeNvml(fail={"nvmlDeviceGetMigMode@2": S.NO_PERMISSION}))
    assert r["gpu.E019"].status is Status.PASS and "GPU 2: not read" in r["gpu.E019"].message
    assert "every GPU" not in r["gpu.E019"].message


def test_the_command_line_reads_the_host_root_and_keeps_the_state(tree, tmp_path, capsys):
    import json

    from hostcheck import command

    state = tmp_path / "st" / "state.json"
    argv = ["check", "--quick", "--json", "--only", "system.E006,system.E010", "--facts-dir", str(tmp_path)]
    argv += ["--host-root", str(tree), "--state-file", str(state)]
    assert command.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {c["id"]: c["status"] for c in doc["checks"]} == {"system.E006": "pass", "system.E010": "pass"}
    assert load_state(str(state)).previous["edac"] == {"mc0.ce": 0, "mc0.ue": 0, "mc1.ce": 3, "mc1.ue": 0}
    put(tree, "sys/devices/system/edac/mc/mc1/ue_count", "1\n")
    assert command.main(argv) == 1
    doc = json.loads(capsys.readouterr().out)
    assert {c["id"]: c["status"] for c in doc["checks"]}["system.E006"] == "fail"


def test_a_task_stuck_across_frequent_runs_is_timed_from_when_it_was_first_seen(tree, tmp_path):
    """Runs a minute apart (prologs of short jobs): the blocked time adds up from the first run that saw it."""
    state = tmp_path / "state.json"
    d_task(tree, 4242, switches=17)
    for now in (1000.0, 1060.0):
        assert judge(gather(tree, state, now))["system.E008"].status is Status.PASS
    r = judge(gather(tree, state, 1130.0))
    assert r["system.E008"].status is Status.WARN and "at least 130 s" in r["system.E008"].message


def test_a_hardware_gatherer_that_did_not_finish_claims_no_baseline(monkeypatch, tmp_path):
    import time

    from hostcheck import gather as G

    monkeypatch.setattr(G, "gather_hardware", lambda *a, **k: time.sleep(5))
    snap = G.gather(Options(gather_timeout_s=0.2, state_file=str(tmp_path / "s.json")), {"hardware"})
    results, _ = evaluate(snap, [c for c in all_checks() if c.id in HOST_IDS])
    r = {x.id: x for x in results}
    assert r["system.E010"].status is Status.WARN and "did not finish" in r["system.E010"].message
    assert r["system.E006"].status is not Status.PASS


def test_per_gpu_series_for_replays_power_limit_and_mig(healthy):
    from hostcheck.check.render.prometheus import render_prometheus
    from hostcheck.core import build_report

    results, verdict = evaluate(healthy, [c for c in all_checks() if c.category == "gpu"])
    text = render_prometheus(
        build_report(healthy, results, verdict, started=0.0, when="2026-11-26T00:00:00Z")
    )
    lines = [line for line in text.splitlines() if line.startswith("hostcheck_gpu_") and 'gpu="3"' in line]
    got = {line.split("{", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines}
    assert got["hostcheck_gpu_power_limit_watts"] == 700.0
    assert got["hostcheck_gpu_pcie_replays"] == 0 and got["hostcheck_gpu_mig_mode_enabled"] == 0
    assert "# HELP hostcheck_gpu_pcie_replays " in text


def test_the_task_scan_is_bounded(tree, monkeypatch):
    from hostcheck.gather import hardware

    d_task(tree, 4242, switches=1)
    assert [t.pid for t in hardware.read_blocked(str(tree))] == [4242]
    monkeypatch.setattr(hardware, "MAX_TASKS", 2)  # /proc listed as text: 1, 4242, 812
    assert [t.pid for t in hardware.read_blocked(str(tree))] == [4242]
    monkeypatch.setattr(hardware, "MAX_TASKS", 1)
    assert hardware.read_blocked(str(tree)) == ()
