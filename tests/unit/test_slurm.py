"""--slurm-drain: parsing scontrol's answer, deciding (pure) and the scontrol calls, through a fake runner that
answers as Slurm 22.05's scontrol does (or as 23.02's, with --json); the state table's data file; the one-line
summary that becomes the drain reason."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import hostcheck_scenarios as S
import pytest

from hostcheck import slurm
from hostcheck.check.render.summary import headline
from hostcheck.checks import all_checks
from hostcheck.config import REASON_MAX, SlurmSettings
from hostcheck.core import build_report, evaluate
from hostcheck.gather.base import CmdResult, Unavailable

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
    """Answers `scontrol -o show node` with ``state``; records every call; ``fail`` makes updates fail.
    ``json``: answers `scontrol --json show node` as 23.02 does; without it, refuses --json as 22.05 does."""

    def __init__(self, state: str, reason: str = "", fail: bool = False, json: bool = False) -> None:
        self.state, self.reason, self.fail, self.json, self.calls = state, reason, fail, json, []

    def __call__(self, argv, timeout):
        self.calls.append(list(argv))
        if argv[1:3] == ["--json", "show"]:
            if not self.json:
                return CmdResult(1, "", "scontrol: unrecognized option '--json'\nTry \"scontrol --help\"\n")
            node = {"name": argv[-1], "state": self.state.split("+"), "reason": self.reason, "cpus": 2}
            return CmdResult(0, json.dumps({"meta": {}, "nodes": [node], "errors": []}), "")
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


def test_a_findings_brief_is_the_drain_reason_and_its_long_message_stays_in_the_report():
    from dataclasses import replace

    from hostcheck.registry import Result, Status
    from hostcheck.report import Report
    from hostcheck.score import verdict

    long = "; ".join(
        f"mlx5_{i} port 1 at 200 Gb/s, its peers at 400 (symbol errors and more words)" for i in range(40)
    )
    base = Result("fabric.E002", "RDMA port rate", "fabric", 5, Status.FAIL, long)
    for brief, want in (
        (None, "fabric.E002 mlx5_0 port 1 at 200 Gb/s"),
        ("mlx5_0 port 1 at 200 Gb/s of 400", None),
    ):
        r = replace(base, brief=brief)
        rep = Report((r,), verdict([r]))
        line = slurm.drain_reason(rep, "hostcheck")
        assert len(line) <= REASON_MAX and line.isprintable(), line
        if brief:
            assert line == "hostcheck: fabric.E002 mlx5_0 port 1 at 200 Gb/s of 400"
            assert (
                rep.to_dict()["checks"][0]["message"] == long and rep.to_dict()["checks"][0]["brief"] == brief
            )
        else:  # no brief: the message's start, cut to the limit
            assert line.startswith("hostcheck: " + want) and line.endswith("...")


# --- states that are not hostcheck's ----------------------------------------------------------------------


@pytest.mark.parametrize("json_mode", [False, True], ids=["22.05-oneliner", "23.02-json"])
def test_an_admins_fail_is_neither_drained_over_nor_resumed(healthy, sick, json_mode):
    """IDLE+FAIL (scontrol update state=fail): a drain would replace the admin's reason and clear FAIL, and a
    resume would put a node with a failing power supply back into service."""
    for rep in (healthy, sick):
        sc = Scontrol("IDLE+FAIL", "PSU failing", json=json_mode)
        action = slurm.apply(rep, SETTINGS, sc)
        assert action.kind == "leave", action
        assert sc.updates == []
        assert "IDLE+FAIL (PSU failing)" in action.message and "FAIL is not hostcheck's" in action.message


@pytest.mark.parametrize(
    "state,reason",
    [
        ("IDLE+MAINTENANCE+RESERVED", ""),
        ("MIXED+MAINTENANCE+RESERVED", ""),
        ("IDLE+REBOOT_REQUESTED", "kernel update"),
        ("DOWN+REBOOT_ISSUED", "reboot issued"),
        ("IDLE+REBOOT_CANCELED", ""),
        ("IDLE+POWERING_UP", ""),
        ("IDLE+POWERING_DOWN", ""),
        ("IDLE+POWERED_DOWN", ""),
        ("IDLE+POWER_DOWN", ""),
        ("IDLE+CLOUD+POWERED_DOWN", ""),
        ("IDLE+PLANNED", ""),
        ("FUTURE", ""),
        ("IDLE+DYNAMIC_FUTURE", ""),
        ("UNKNOWN", ""),
        ("IDLE+NOT_RESPONDING", ""),
        ("IDLE+INVALID_REG", "Low RealMemory"),
        ("MIXED+FAIL", "PSU failing"),
        ("IDLE+PERFCTRS", ""),
        # A state Slurm may add one day: unknown to the table, so not hostcheck's.
        ("IDLE+SOMETHING_NEW", ""),
        # Drained by hostcheck, then a reboot was asked for: a resume would cancel the reboot.
        ("IDLE+DRAIN+REBOOT_REQUESTED", "hostcheck: tuning.E001 /dev/shm 64.0 MiB"),
        ("IDLE+DRAIN+MAINTENANCE+RESERVED", "hostcheck: tuning.E001 /dev/shm 64.0 MiB"),
    ],
)
def test_states_that_are_someone_elses_are_left_alone(healthy, sick, state, reason):
    for rep in (healthy, sick):
        for json_mode in (False, True):
            sc = Scontrol(state, reason, json=json_mode)
            action = slurm.apply(rep, SETTINGS, sc)
            assert action.kind == "leave", (state, action)
            assert sc.updates == []
            assert "left as it is" in action.message and state in action.message


@pytest.mark.parametrize(
    "state", ["IDLE", "MIXED", "ALLOCATED", "ALLOCATED+COMPLETING", "IDLE+RESERVED", "IDLE+CLOUD"]
)
def test_a_node_in_service_is_drained_when_sick_and_left_running_when_healthy(healthy, sick, state):
    sc = Scontrol(state, json=True)
    assert slurm.apply(sick, SETTINGS, sc).kind == "drain" and len(sc.updates) == 1
    sc = Scontrol(state)
    assert slurm.apply(healthy, SETTINGS, sc).kind == "none" and sc.updates == []


def test_a_reason_is_kept_whole_whatever_it_holds():
    weird = "PSU failing Foo=bar State=IDLE Comment=x [see ticket] a@b"
    st = slurm.parse_node(show("IDLE+FAIL", weird), "n1")
    assert st.reason == weird and st.flags == ("IDLE", "FAIL")
    # Comment= and Extra= follow the reason's stamp.
    line = (
        show("IDLE+DRAIN", "hostcheck: gpu.E005 x Extra=1") + " Comment=hello [x@2026-01-01T00:00:00] Extra=z"
    )
    assert slurm.parse_node(line, "n1").reason == "hostcheck: gpu.E005 x Extra=1"
    # Another SLURM_TIME_FORMAT: the stamp is still found.
    other = show("IDLE+FAIL", "PSU [a b] x").replace("2026-11-24T10:05:00", "24 Nov 10:05")
    assert slurm.parse_node(other, "n1").reason == "PSU [a b] x"
    # Without its stamp (no time recorded), the reason runs to the optional fields.
    no_stamp = LINE.format(n="n1", state="DOWN", reason=" Reason=Not responding Comment=rack 7")
    assert slurm.parse_node(no_stamp, "n1").reason == "Not responding"
    for rep_state in ("IDLE+FAIL",):
        sc = Scontrol(rep_state, weird, json=True)
        assert slurm.read_node(SETTINGS, "n1", sc).reason == weird


def test_json_is_read_where_slurm_has_it_and_the_oneliner_otherwise():
    sc = Scontrol("IDLE+DRAIN", "hostcheck: gpu.E005 x", json=True)
    st = slurm.read_node(SETTINGS, "n1", sc)
    assert st.flags == ("IDLE", "DRAIN") and st.reason == "hostcheck: gpu.E005 x"
    assert [c[1] for c in sc.calls] == ["--json"]
    sc = Scontrol("IDLE+DRAIN", "hostcheck: gpu.E005 x")
    assert slurm.read_node(SETTINGS, "n1", sc) == st
    assert [c[1] for c in sc.calls] == ["--json", "-o"]
    # JSON that does not hold this node, or holds nonsense, falls back to the one-liner.
    for answer in (
        "{}",
        '{"nodes": [{"name": "n1", "state": 5}]}',
        "[1]",
        '{"nodes": [{"name": "n10"}]}',
        "{",
    ):
        calls = []

        def runner(argv, timeout, answer=answer, calls=calls):
            calls.append(argv[1])
            if argv[1] == "--json":
                return CmdResult(0, answer, "")
            return CmdResult(0, show("IDLE") + "\n", "")

        assert slurm.read_node(SETTINGS, "n1", runner).flags == ("IDLE",)
        assert calls == ["--json", "-o"]


def test_every_state_slurm_prints_is_in_the_table():
    """scontrol 22.05.8's base states and flags (src/common/slurm_protocol_defs.c: node_states,
    node_state_flags) and 23.02's --json words (data_parser v0.0.39 NODE_STATES) each have a row."""
    printed = {
        "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE", "UNKNOWN",
        "CLOUD", "COMPLETING", "DRAIN", "DYNAMIC_FUTURE", "DYNAMIC_NORM", "INVALID_REG", "FAIL", "MAINTENANCE",
        "POWER_DOWN", "POWER_UP", "PERFCTRS", "POWERED_DOWN", "REBOOT_REQUESTED", "REBOOT_ISSUED", "RESERVED",
        "RESUME", "NOT_RESPONDING", "PLANNED", "POWERING_UP", "POWERING_DOWN",
        "UNDRAIN", "REBOOT_CANCELED", "POWER_DRAIN",
    }  # fmt: skip
    assert printed <= set(slurm.STATES)
    serve = {n for n, s in slurm.STATES.items() if s.action == slurm.SERVE}
    assert serve == {"IDLE", "ALLOCATED", "MIXED", "COMPLETING", "RESERVED", "CLOUD", "DYNAMIC_NORM"}
    assert {n for n, s in slurm.STATES.items() if s.action == slurm.DRAIN} == {"DRAIN"}


# --- the state table's data file ----------------------------------------------------------------------------


def _broken(tmp_path, change):
    data = json.loads(slurm.DATA_PATH.read_text())
    change(data)
    path = tmp_path / "slurm_states.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda d: d.update(schema=2), "top level: an object with schema 1"),
        (lambda d: d.update(source=""), "top level: source"),
        (lambda d: d.update(states=[]), "states: a non-empty list"),
        (lambda d: d["states"][0].update(action="drain_it"), "states[0] (IDLE): action must be one of"),
        (lambda d: d["states"][1].update(kind="flagged"), "states[1] (ALLOCATED): kind"),
        (lambda d: d["states"][2].update(name="mixed"), "states[2]: name must be"),
        (lambda d: d["states"][3].update(source="sinfo(1)"), "states[3] (DOWN): source must be"),
        (lambda d: d["states"][3].pop("meaning"), "states[3] (DOWN): meaning"),
        (lambda d: d["states"][4].update(why="x"), "states[4]: unknown keys ['why']"),
        (lambda d: d["states"].__setitem__(1, dict(d["states"][0])), "states[1] (IDLE): duplicate name"),
        (lambda d: d["states"].__setitem__(0, "IDLE"), "states[0]: a row is an object"),
        (lambda d: [r.update(action="leave") for r in d["states"]], "states: no base state in service"),
    ],
)
def test_a_malformed_state_table_fails_loudly_naming_the_row(tmp_path, change, said):
    path = _broken(tmp_path, change)
    with pytest.raises(ValueError, match=re.escape(f"{path}: {said}")):
        slurm._load(path)


def test_a_malformed_state_table_fails_the_import(tmp_path):
    """The table is read at import: a broken file stops hostcheck there, never a silent empty table that would
    let hostcheck drain over every state."""
    pkg = tmp_path / "hostcheck"
    shutil.copytree(slurm.DATA_PATH.parents[1], pkg, ignore=shutil.ignore_patterns("__pycache__"))
    bad = json.loads(slurm.DATA_PATH.read_text())
    bad["states"][5]["action"] = "maybe"
    (pkg / "data" / "slurm_states.json").write_text(json.dumps(bad))
    out = subprocess.run(
        [sys.executable, "-c", "import hostcheck.slurm"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert "ValueError" in out.stderr and "states[5] (UNKNOWN): action must be one of" in out.stderr


# --- hostcheck sweep's drains: the node checks cannot see a link, so they never resume what the sweep drained -----

SWEEP_REASON = "hostcheck: sweep.S002 gpu07 slow with all 7 partners, 31% of peers"


def test_the_node_checks_leave_a_sweep_drain_alone_and_the_sweep_leaves_theirs(healthy, sick):
    # Planted: the sweep's drain; a healthy node check must not resume it, nor a sick one write over its reason.
    for rep in (healthy, sick):
        sc = Scontrol("IDLE+DRAIN", SWEEP_REASON)
        assert slurm.apply(rep, SETTINGS, sc).kind == "leave" and sc.updates == []
    # Absent: the node checks' own drain is theirs to resume, as before.
    sc = Scontrol("IDLE+DRAIN", "hostcheck: tuning.E001 /dev/shm 64.0 MiB")
    assert slurm.apply(healthy, SETTINGS, sc).kind == "resume"
    # The sweep drains a node in service, leaves the node checks' drain and an admin's, re-drains its own.
    assert (
        slurm.apply_verdict("n1", False, SWEEP_REASON, SETTINGS, Scontrol("MIXED"), sweep=True).kind
        == "drain"
    )
    for state, reason in (
        ("IDLE+DRAIN", "hostcheck: gpu.E005 GPU 5: row remap pending"),
        ("IDLE+DRAIN", "admin: cable"),
    ):
        sc = Scontrol(state, reason)
        assert slurm.apply_verdict("n1", False, SWEEP_REASON, SETTINGS, sc, sweep=True).kind == "leave"
        assert sc.updates == []
    sc = Scontrol("IDLE+DRAIN", "hostcheck: sweep.S003 link gpu07<->gpu09 2 GB/s")
    assert slurm.apply_verdict("n1", False, SWEEP_REASON, SETTINGS, sc, sweep=True).kind == "drain"
    (upd,) = sc.updates
    assert upd == ["scontrol", "update", "nodename=n1", "state=drain", f"reason={SWEEP_REASON}"]
    # An admin's state (FAIL, a maintenance reservation) is never the sweep's to change.
    for state in ("IDLE+FAIL", "IDLE+MAINT+RESERVED"):
        sc = Scontrol(state)
        assert slurm.apply_verdict("n1", False, SWEEP_REASON, SETTINGS, sc, sweep=True).kind == "leave"
