"""--slurm-drain: parsing scontrol's answer, deciding (pure) and the scontrol calls, through a fake runner that
answers as Slurm 22.05's scontrol does; the one-line summary that becomes the drain reason."""

from __future__ import annotations

import hostcheck_scenarios as S
import pytest

from hostcheck import slurm
from hostcheck.checks import all_checks
from hostcheck.cli import build_report, evaluate
from hostcheck.config import REASON_MAX, SlurmSettings
from hostcheck.gather.base import CmdResult, Unavailable
from hostcheck.render.summary import headline

LINE = (
    "NodeName={n} Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.10 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=10.89.0.2 NodeHostName={n} "
    "Version=22.05.8 OS=Linux 6.1.0-28-cloud-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.119-1 (2024-11-22) "
    "RealMemory=1000 AllocMem=0 FreeMem=2000 Sockets=2 Boards=1 State={state} ThreadsPerCore=1 TmpDisk=0 "
    "Weight=1 Owner=N/A MCS_label=N/A Partitions=debug BootTime=2026-11-24T10:00:00 "
    "SlurmdStartTime=2026-11-24T10:00:01 LastBusyTime=2026-11-24T10:00:05 CfgTRES=cpu=2,mem=1000M,billing=2 "
    "AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 "
    "ExtSensorsTemp=n/s{reason}"
)


def show(state: str, reason: str = "", n: str = "n1") -> str:
    return LINE.format(
        n=n, state=state, reason=f" Reason={reason} [root@2026-11-24T10:05:00]" if reason else ""
    )


def report(snapshot):
    results, v = evaluate(snapshot, [c for c in all_checks() if not c.workload])
    return build_report(snapshot, results, v, 0.0, "2026-11-24T10:00:00Z")


@pytest.fixture(scope="module")
def healthy():
    return report(S.make_snapshot())


@pytest.fixture(scope="module")
def sick():
    return report(S.SCENARIOS["row_remap_pending"][0]())


class Scontrol:
    """Answers `scontrol -o show node` with ``state``; records every call; ``fail`` makes updates fail."""

    def __init__(self, state: str, reason: str = "", fail: bool = False) -> None:
        self.state, self.reason, self.fail, self.calls = state, reason, fail, []

    def __call__(self, argv, timeout):
        self.calls.append(list(argv))
        if argv[1:3] == ["-o", "show"]:
            return CmdResult(0, show(self.state, self.reason, argv[-1]) + "\n", "")
        if self.fail:
            return CmdResult(1, "", "slurm_update error: Invalid user id\n")
        return CmdResult(0, "", "")

    @property
    def updates(self):
        return [c for c in self.calls if c[1] == "update"]


SETTINGS = SlurmSettings(drain=True, node="n1")


def test_parse_node_reads_state_flags_and_reason_without_the_stamp():
    st = slurm.parse_node(show("IDLE+DRAIN", "hostcheck: gpu.E005 GPU 5: row remap pending"), "n1")
    assert st.flags == ("IDLE", "DRAIN") and st.drained
    assert st.reason == "hostcheck: gpu.E005 GPU 5: row remap pending"
    assert slurm.parse_node(show("IDLE"), "n1").reason == ""
    assert slurm.parse_node(show("DOWN*+DRAIN", "Not responding"), "n1").flags == ("DOWN", "DRAIN")
    assert slurm.parse_node("", "n1") is None
    # Another node's line is not ours (node names that share a prefix).
    assert slurm.parse_node(show("IDLE", n="n10"), "n1") is None


def test_a_sick_node_is_drained_with_the_worst_finding_as_reason(sick):
    sc = Scontrol("IDLE")
    action = slurm.apply(sick, SETTINGS, sc)
    assert action.kind == "drain"
    (upd,) = sc.updates
    assert upd[:4] == ["scontrol", "update", "nodename=n1", "state=drain"]
    reason = upd[4].removeprefix("reason=")
    assert reason.startswith("hostcheck: gpu.E005 ") and len(reason) <= REASON_MAX
    assert reason.isascii() and "\n" not in reason


def test_a_node_drained_by_hostcheck_is_resumed_once_healthy(healthy):
    sc = Scontrol("IDLE+DRAIN", "hostcheck: tuning.E001 /dev/shm 64.0 MiB")
    assert slurm.apply(healthy, SETTINGS, sc).kind == "resume"
    assert sc.updates == [["scontrol", "update", "nodename=n1", "state=resume"]]


@pytest.mark.parametrize(
    "state,reason",
    [
        ("IDLE+DRAIN", "admin: disk swap"),
        ("MIXED+DRAIN", "hostcheckX: not quite our prefix"),
        ("DOWN", "Not responding"),
        ("IDLE+DRAIN", "NHC: check_fs_mount: /scratch not mounted"),
    ],
)
def test_someone_elses_drain_is_never_touched(healthy, sick, state, reason):
    for rep in (healthy, sick):
        sc = Scontrol(state, reason)
        action = slurm.apply(rep, SETTINGS, sc)
        assert action.kind == "leave", action
        assert sc.updates == []


def test_healthy_and_undrained_or_already_drained_with_the_same_reason_does_nothing(healthy, sick):
    sc = Scontrol("IDLE")
    assert slurm.apply(healthy, SETTINGS, sc).kind == "none" and sc.updates == []
    same = slurm.drain_reason(sick, "hostcheck")
    sc = Scontrol("ALLOCATED+DRAIN", same)
    assert slurm.apply(sick, SETTINGS, sc).kind == "none" and sc.updates == []
    # Our own drain with an older reason: the reason follows the current finding.
    sc = Scontrol("IDLE+DRAIN", "hostcheck: tuning.E001 /dev/shm 64.0 MiB")
    assert slurm.apply(sick, SETTINGS, sc).kind == "drain" and len(sc.updates) == 1


def test_scontrol_failures_are_errors_not_silence(sick):
    assert slurm.apply(sick, SETTINGS, Scontrol("IDLE", fail=True)).kind == "error"
    missing = slurm.apply(sick, SETTINGS, lambda argv, t: Unavailable("not_installed", "scontrol not found"))
    assert missing.kind == "error" and "scontrol not found" in missing.message
    garbled = slurm.apply(sick, SETTINGS, lambda argv, t: CmdResult(0, "Node n1 not found\n", ""))
    assert garbled.kind == "error"


def test_node_name_comes_from_settings_then_slurmd_then_the_host():
    assert slurm.node_name(SlurmSettings(node="gpu07"), {"SLURMD_NODENAME": "x"}) == "gpu07"
    assert slurm.node_name(SlurmSettings(), {"SLURMD_NODENAME": "gpu08"}) == "gpu08"
    assert slurm.node_name(SlurmSettings(), {}) and "." not in slurm.node_name(SlurmSettings(), {})


def test_headline_fits_80_printable_characters_and_counts_the_rest(healthy):
    snap = S.make_snapshot(
        nvml=S.FakeNvml(gpus=[S.h100_gpu(i, remap=(0, 2, 1, 0), temp=95) for i in range(8)]),
        tuning=S.h100_tuning(shm_bytes=64 << 20),
    )
    line = headline(report(snap))
    assert len(line) <= 80 and line.isprintable() and line.isascii()
    assert line.endswith("more)") and line.split()[0].count(".E") == 1
    assert headline(healthy).startswith("ready, score ")
