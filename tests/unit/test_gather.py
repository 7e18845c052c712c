"""Gathering: pure parsers from recorded text, injected runners, the torch probe as a real child process."""

from __future__ import annotations

import os
import stat
import sys
from datetime import datetime, timezone

import pytest

from hostcheck.checks.torch import arch_covered
from hostcheck.gather.base import CmdResult, Unavailable, run_cmd
from hostcheck.gather.facts import gather_facts
from hostcheck.gather.nvml import gather_nvml, normalise_bus_id, nvml_unavailable
from hostcheck.gather.system import (
    parse_cpulist,
    parse_driver_version,
    parse_os_release,
    parse_xid_lines,
    read_kernel_log,
    read_xids,
    within_window,
)
from hostcheck.gather.torchinfo import choose_python, gather_torch, probe_snapshot
from hostcheck.gather.tuning import parse_env_file, parse_thp, services_state, shm_size

NOW = datetime(2026, 11, 23, 3, 0, tzinfo=timezone.utc)


def test_parse_xid_lines_window_and_fields():
    log = "\n".join(
        [
            "2026-11-23T02:30:01,123456+00:00 kernel: NVRM: Xid (PCI:0000:2a:00): 79, pid=1234, name=python, "
            "GPU has fallen off the bus.",
            "2026-11-22T20:00:00+00:00 kernel: NVRM: Xid (PCI:0000:18:00): 48, pid=1, DBE",  # older than 2 h
            "2026-11-23T02:59:00+0000 host kernel: NVRM: Xid (PCI:0000:DB:00): 13, pid=77, Graphics Exception",
            "2026-11-23T02:59:00+00:00 kernel: unrelated line",
        ]
    )
    ev = parse_xid_lines(log, now=NOW)
    assert [(e.pci, e.xid) for e in ev] == [("0000:2a:00", 79), ("0000:db:00", 13)]


def test_the_window_reads_every_timestamp_form_journalctl_and_dmesg_print():
    # journalctl -o short-iso: "2026-11-23T02:30:01+0000" (systemd's journalctl(1), short-iso); dmesg
    # --time-format iso: "2026-11-23T02:30:01,123456+00:00" (util-linux dmesg(1)).
    lines = [
        "2026-11-23T02:30:01,123456+00:00 in, microseconds and a colon zone",
        "2026-11-23T00:30:01+0000 older than 2 h: out",
        "2026-11-22T23:30:01-0200 in: 01:30 UTC is 1.5 h before",
        "2026-11-22T23:30:01-01:00 out: 00:30 UTC",
        "2026-11-23T08:29:59+05:30 in: 02:59:59 UTC",
        "2026-11-23T02:30:01 in: no zone is UTC",
        "2026-13-23T02:30:01+00:00 kept: no such month, so no time to judge by",
        "2026-11-23T02:30:01+99:00 kept: no such zone",
        "\u0662\u0660\u0662\u0666-11-22T02:30:01+00:00 kept: digits that are not ASCII are no time",
        "a line without a time: kept",
    ]
    kept = within_window("\n".join(lines), 2, now=NOW)
    assert kept == [lines[i] for i in (0, 2, 4, 5, 6, 7, 8, 9)]


def test_one_run_reads_the_kernel_log_once_for_the_xids_and_the_machine_checks(monkeypatch, tmp_path):
    import hostcheck.gather as G

    calls = []
    log = (
        "2026-11-23T02:30:01+00:00 kernel: NVRM: Xid (PCI:0000:2a:00): 79, pid=1, GPU has fallen off the bus.\n"
        "2026-11-23T02:31:00+00:00 kernel: mce: [Hardware Error]: Machine check events logged\n"
    )

    def runner(argv, timeout, *args, **kwargs):
        calls.append(argv[0])
        return CmdResult(0, log, "") if argv[0] == "journalctl" else Unavailable("not_installed", "no")

    monkeypatch.setattr(G, "run_cmd", runner)
    monkeypatch.setattr("hostcheck.gather.system.datetime", _Frozen)
    snap = G.gather(
        G.Options(host_root=str(tmp_path), state_file=str(tmp_path / "s.json")), {"system", "hardware"}
    )
    assert calls.count("journalctl") == 1
    assert [e.xid for e in snap.system.xid_events] == [79] and len(snap.hardware.mce_lines) == 1


def test_the_runs_one_reader_keeps_the_newest_lines_of_a_kernel_log_flood(monkeypatch, tmp_path):
    """journalctl printing past the output cap through the run's run_once: its end is kept (the newest lines,
    where the Xid is), as with run_cmd itself; once the start was kept and the Xid below 8 MiB of lines lost."""
    import hostcheck.gather as G

    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S+0000")
    xid = f"{now} host kernel: NVRM: Xid (PCI:0000:2a:00): 79, pid=1, GPU has fallen off the bus."
    tool = tmp_path / "journalctl"
    tool.write_text(f"#!/bin/sh\nyes '{now} host kernel: a line' | head -c 9000000\necho '{xid}'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    events, source = read_xids(G.run_once())
    assert [e.xid for e in events] == [79] and "cut: only its last 8 MiB read" in source, source


class _Frozen(datetime):
    @classmethod
    def now(cls, tz=None):
        return NOW


def test_read_xids_falls_back_to_dmesg_and_reports_unreadable():
    calls = []

    def runner(argv, timeout):
        calls.append(argv[0])
        if argv[0] == "journalctl":
            return CmdResult(1, "", "No journal files were found.")
        return CmdResult(1, "", "dmesg: read kernel buffer failed: Operation not permitted")

    events, _source = read_xids(runner)
    assert calls == ["journalctl", "dmesg"]
    assert isinstance(events, Unavailable) and "Operation not permitted" in events.reason


def test_parse_os_release_and_driver_version():
    osr = parse_os_release('PRETTY_NAME="Ubuntu 24.04.3 LTS"\nID=ubuntu\nVERSION_ID="24.04"\n')
    assert osr["ID"] == "ubuntu" and osr["VERSION_ID"] == "24.04"
    text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu Oct 30 2025\nGCC version: gcc 13"
    assert parse_driver_version(text) == "580.159.04"
    open_text = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build"
    assert parse_driver_version(open_text) == "580.95.05"


def test_parse_cpulist_and_thp():
    assert parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_thp("always [madvise] never\n") == "madvise"


def test_parse_env_file():
    text = "# gpunode\nLD_PRELOAD=/usr/lib/libtcmalloc.so.4\nexport OMP_NUM_THREADS=14\nMALLOC_CONF='a:1'\n\n;x\n"
    assert parse_env_file(text) == {
        "LD_PRELOAD": "/usr/lib/libtcmalloc.so.4",
        "OMP_NUM_THREADS": "14",
        "MALLOC_CONF": "a:1",
    }


def test_services_state_with_injected_runner():
    answers = {
        ("is-enabled", "packagekit"): CmdResult(0, "masked\n", ""),
        ("is-active", "packagekit"): CmdResult(3, "inactive\n", ""),
        ("is-enabled", "foo"): CmdResult(
            4, "", "Failed to get unit file state for foo.service: No such file"
        ),
        ("is-active", "foo"): CmdResult(3, "inactive\n", ""),
    }
    st = services_state(("packagekit", "foo"), runner=lambda argv, t: answers[(argv[1], argv[2])])
    assert [(s.name, s.enabled, s.active) for s in st] == [
        ("packagekit", "masked", "inactive"),
        ("foo", "not-found", "inactive"),
    ]


def test_run_cmd_missing_binary_is_a_value():
    r = run_cmd(["/nonexistent/hostcheck-nope"], 1)
    assert isinstance(r, Unavailable) and r.kind == "not_installed"


def test_run_cmd_kills_a_hung_tool_and_what_it_started(tmp_path):
    """A hung tool's children die with it at the deadline (subprocess.run's timeout killed the tool alone)."""
    import os
    import time

    pidfile = tmp_path / "child.pid"
    tool = tmp_path / "systemctl"
    tool.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pidfile}\nwait\n")
    tool.chmod(0o755)
    t0 = time.monotonic()
    r = run_cmd([str(tool)], 1)
    assert isinstance(r, Unavailable) and r.kind == "timeout" and time.monotonic() - t0 < 10
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        with open(f"/proc/{child}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                break
        time.sleep(0.05)
    else:
        assert not os.path.exists(f"/proc/{child}"), "the tool's child outlived the timeout"
    ok = run_cmd(["sh", "-c", "echo out; echo err >&2; exit 3"], 5)
    assert ok == CmdResult(3, "out\n", "err\n")


def test_shm_size_of_a_real_path(tmp_path):
    assert isinstance(shm_size(str(tmp_path)), int)
    assert isinstance(shm_size(str(tmp_path / "missing")), Unavailable)


def test_facts_valid_invalid_and_missing(tmp_path):
    (tmp_path / "gpunode_driver.fact").write_text('{"expected_gpu_count": 8}')
    (tmp_path / "gpunode_tuning.fact").write_text("not json")
    facts = gather_facts(str(tmp_path))
    assert facts.get("gpunode_driver", "expected_gpu_count") == 8
    assert "gpunode_tuning" in facts.errors and "gpunode_tuning" not in facts.roles
    assert "gpunode_pytorch" not in facts.roles and "gpunode_pytorch" not in facts.errors


def test_nvml_error_mapping_and_bus_id():
    class E(Exception):
        value = 15

    assert nvml_unavailable(E()).kind == "gpu_lost"
    assert nvml_unavailable(RuntimeError("x")).kind == "error"
    assert normalise_bus_id(b"00000000:2A:00.0") == "0000:2a:00.0"


def test_gather_nvml_without_pynvml():
    def loader():
        raise ImportError("No module named 'pynvml'")

    snap = gather_nvml(loader=loader, fallback=None)
    assert not snap.ok and snap.error.kind == "not_installed" and "nvidia-ml-py" in snap.error.reason


def test_gather_nvml_with_real_pynvml_on_this_machine_never_raises():
    pytest.importorskip("pynvml")
    snap = gather_nvml()  # no driver here: a value saying so; on a GPU node: real GPUs
    assert snap.ok or snap.error.reason


@pytest.mark.parametrize(
    ("cap", "archs", "kind"),
    [
        ((9, 0), ["sm_80", "sm_90"], "sass"),
        ((8, 9), ["sm_80", "sm_86"], "sass"),
        ((9, 0), ["sm_80", "compute_80"], "ptx"),
        ((9, 0), ["sm_80", "sm_86"], "none"),
        ((10, 0), ["sm_90a", "sm_90"], "none"),
        ((9, 0), ["sm_90a"], "sass"),
        ((12, 0), ["sm_100", "compute_120"], "ptx"),
    ],
)
def test_arch_covered(cap, archs, kind):
    assert arch_covered(cap, archs)[0] == kind


def test_probe_output_parsing_ignores_noise():
    from hostcheck.child.launch import ProbeRun, parse_records
    from hostcheck.gather.torchinfo import MARKER

    out = 'warning: something\nHOSTCHECK_PROBE_JSON:{"python": "3.12.3", "torch": {"installed": false}}\n'
    records, bad_line = parse_records(out, MARKER)
    snap = probe_snapshot(ProbeRun(name="torch probe", records=tuple(records), rc=0), "/py")
    assert bad_line is None and snap.error is None
    assert snap.data["python"] == "3.12.3" and not snap.torch_installed
    crashed = ProbeRun(
        name="torch probe", error="crashed (exit 1)", rc=1, stderr_tail="Traceback...\nSyntaxError: x"
    )
    bad = probe_snapshot(crashed, "/py")
    assert bad.error is not None and "(exit 1): SyntaxError" in bad.error.reason


def test_probe_runs_in_a_child_python_with_the_training_env():
    snap = gather_torch(
        sys.executable, "test", {"OMP_NUM_THREADS": "3", "MALLOC_CONF": "x:1"}, 30, with_torch=False
    )
    assert snap.error is None, snap.error
    assert snap.env["OMP_NUM_THREADS"] == "3" and snap.env["MALLOC_CONF"] == "x:1"
    assert snap.data["python"].count(".") == 2
    assert set(snap.data["rlimits"]) == {"memlock", "nofile"}
    assert "tcmalloc" in snap.maps


def test_probe_missing_python_and_timeout(tmp_path):
    missing = gather_torch(str(tmp_path / "nope" / "python"))
    assert missing.error is not None and missing.error.kind == "not_found"
    slow = tmp_path / "python"
    slow.write_text("#!/bin/sh\nexec sleep 5\n")
    slow.chmod(slow.stat().st_mode | stat.S_IEXEC)
    snap = gather_torch(str(slow), timeout_s=0.3)
    assert snap.error is not None and snap.error.kind == "timeout"


def test_choose_python(tmp_path):
    from hostcheck.gather.facts import Facts

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text("")
    facts = Facts(roles={"gpunode_pytorch": {"venv": str(venv)}})
    assert choose_python("/x/python", facts) == ("/x/python", "--python")
    assert choose_python(None, facts) == (str(py), "fact gpunode_pytorch.venv")
    path, source = choose_python(None, Facts(roles={}))
    assert os.path.isabs(path) and source


def test_read_xids_prefers_journal_and_falls_back_when_it_is_empty():
    xid = "2026-11-23T02:59:00+00:00 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1, fell off the bus\n"

    def runner(argv, timeout):
        if argv[0] == "journalctl":
            return CmdResult(0, "", "")  # journald running but keeps no kernel messages
        return CmdResult(0, xid, "")

    events, source = read_xids(runner)
    assert source.startswith("dmesg") and len(events) in (0, 1)  # dmesg's window is relative to now

    def journal(argv, timeout):
        return CmdResult(0, xid, "") if argv[0] == "journalctl" else CmdResult(1, "", "denied")

    events, source = read_xids(journal)
    assert source.startswith("journalctl")


def test_the_kernel_log_from_dmesg_is_cut_to_the_window_for_every_reader():
    """One reader for XIDs and machine checks: dmesg (since boot) is cut to the window as journald's answer is."""
    now = datetime.now(timezone.utc).replace(microsecond=0)
    old = "2020-01-01T00:00:00+00:00 kernel: mce: [Hardware Error]: Machine check events logged\n"
    new = f"{now.isoformat()} kernel: mce: [Hardware Error]: Machine check events logged\n"

    def runner(argv, timeout):
        return (
            CmdResult(1, "", "No journal files were found.")
            if argv[0] == "journalctl"
            else CmdResult(0, old + new, "")
        )

    text, source = read_kernel_log(runner, 2.0)
    assert source == "dmesg, last 2 h" and text.splitlines() == [new.strip()]
    # absent: a window that reaches back to the old line keeps both
    text, _ = read_kernel_log(runner, 24 * 365 * 10)
    assert len(text.splitlines()) == 2


# NVSwitches on the PCI bus and Fabric Manager (hostcheck.gather.fabric)
def _pci(root, dev, vendor, cls):
    d = root / dev
    d.mkdir()
    (d / "vendor").write_text(vendor + "\n")
    (d / "class").write_text(cls + "\n")


def test_find_nvswitches_reads_vendor_and_class(tmp_path):
    from hostcheck.gather.fabric import find_nvswitches

    _pci(tmp_path, "0000:05:00.0", "0x10de", "0x068000")  # NVSwitch
    _pci(tmp_path, "0000:18:00.0", "0x10de", "0x030200")  # H100
    _pci(tmp_path, "0000:00:1f.0", "0x8086", "0x068000")  # someone else's bridge
    assert find_nvswitches(str(tmp_path)) == ("0000:05:00.0",)
    assert find_nvswitches(str(tmp_path / "missing")).kind == "not_found"


def test_parse_fm_version():
    from hostcheck.gather.fabric import parse_fm_version

    assert parse_fm_version("Fabric Manager version is : 580.95.05\n") == "580.95.05"
    assert parse_fm_version("nv-fabricmanager 535.261.03") == "535.261.03"
    assert parse_fm_version("usage: ...") is None


def test_gather_fabric_asks_nothing_without_nvswitch(tmp_path):
    from hostcheck.gather.base import CmdResult
    from hostcheck.gather.fabric import gather_fabric

    calls = []

    def runner(argv, timeout):
        calls.append(list(argv))
        if argv[0] == "nv-fabricmanager":
            return CmdResult(0, "Fabric Manager version is : 580.159.04\n", "")
        return CmdResult(
            0 if argv[1] == "is-enabled" else 3, "enabled\n" if argv[1] == "is-enabled" else "", ""
        )

    _pci(tmp_path, "0000:05:00.0", "0x10de", "0x068000")
    st = gather_fabric(runner, str(tmp_path))
    assert st.nvswitches == ("0000:05:00.0",) and st.fm_version == "580.159.04"
    assert (st.fm_enabled, st.fm_active) == ("enabled", "unknown")
    assert len(calls) == 3
    empty = tmp_path / "empty"
    empty.mkdir()
    assert gather_fabric(runner, str(empty)).fm_version == "580.159.04"  # an injected runner: FM looked up

    def absent(argv, timeout):
        from hostcheck.gather.base import Unavailable

        return Unavailable("not_installed", f"{argv[0]} not found")

    st = gather_fabric(absent, str(tmp_path))
    assert st.fm_version is None and st.fm_active == "unknown"


def test_nvml_fabric_state_read_through_the_struct(scenarios, monkeypatch):
    from hostcheck.gather.nvml import gather_nvml

    nv = scenarios.FakeNvml(gpus=scenarios.gpus_with(1, fabric=(2, 0)))
    snap = gather_nvml(nvml=nv, proc_name=str)
    assert snap.gpus[0].fabric == (3, 0) and snap.gpus[1].fabric == (2, 0)
    monkeypatch.delattr(scenarios.FakeNvml, "c_nvmlGpuFabricInfo_t")  # an old nvidia-ml-py without the API
    snap = gather_nvml(nvml=scenarios.FakeNvml(), proc_name=str)
    assert snap.gpus[0].fabric.kind == "not_supported"


def test_a_probe_that_hangs_says_in_which_step(tmp_path):
    """A hanging PIL import was once reported as a hung CUDA init."""
    site = tmp_path / "site"
    (site / "PIL").mkdir(parents=True)
    (site / "PIL" / "__init__.py").write_text("import time\ntime.sleep(60)\n")
    snap = gather_torch(sys.executable, "test", {"PYTHONPATH": str(site)}, timeout_s=3, with_torch=False)
    assert snap.error is not None and snap.error.kind == "timeout"
    assert snap.error.reason.endswith("hung in the PIL import"), snap.error.reason
    assert "CUDA" not in snap.error.reason


GOOD_PROBE = {
    "python": "3.11.7",
    "executable": "/venv/bin/python",
    "env": {"OMP_NUM_THREADS": "8"},
    "rlimits": {"memlock": [-1, -1], "nofile": [65536, 65536]},
    "pillow": {"Pillow": "11.0.0", "pillow-simd": None, "PIL": "11.0.0", "features": {"webp": True}},
    "torch": {
        "installed": True,
        "version": "2.5.1",
        "cuda": "12.4",
        "cudnn": 90100,
        "capabilities": [[9, 0]],
    },
    "maps": {"jemalloc": [], "tcmalloc": [], "openmp": ["/lib/libgomp.so.1"]},
    "symbols": {"mallctl": False},
}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"torch": 5}, "record.torch is 5, want object"),
        ({"torch": {"installed": "yes"}}, 'record.torch.installed is "yes"'),
        ({"torch": {"installed": True, "version": 2.5}}, "record.torch.version is 2.5"),
        ({"torch": {"installed": True, "capabilities": [["9", 0]]}}, "capabilities[0][0]"),
        ({"env": {"OMP_NUM_THREADS": 8}}, "record.env.OMP_NUM_THREADS is 8"),
        ({"pillow": "x"}, 'record.pillow is "x"'),
        ({"maps": {"jemalloc": "/lib/x.so"}}, "record.maps.jemalloc"),
    ],
)
def test_a_probe_record_of_the_wrong_types_is_the_gatherer_s_error(change, named):
    from hostcheck.child.launch import ProbeRun

    snap = probe_snapshot(
        ProbeRun(name="torch probe", records=({**GOOD_PROBE, **change},)), "/venv/bin/python"
    )
    assert snap.error is not None and named in snap.error.reason and snap.data == {}, snap.error
    # absent: the record the probe prints is taken as it is
    good = probe_snapshot(ProbeRun(name="torch probe", records=(GOOD_PROBE,)), "/venv/bin/python")
    assert good.error is None and good.torch_installed
