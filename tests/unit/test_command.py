"""The command line (hostcheck.command and its default command, check): exit codes, selection, output formats
(parsed, not string-matched), signals, the subcommands' wiring."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import hostcheck_scenarios as S
import pytest

from hostcheck import SCHEMA_VERSION, command
from hostcheck.checks import all_checks
from hostcheck.registry import Check, Outcome, Result, Status, passed, run_check, run_checks, select
from hostcheck.score import score, verdict

SCHEMA = os.path.join(
    os.path.dirname(__file__), "..", "..", "hostcheck", "data", "hostcheck-report.schema.json"
)


@pytest.fixture
def use_scenario(monkeypatch):
    """Make the CLI judge a fixture snapshot instead of gathering from this machine."""

    def apply(name_or_snapshot):
        snap = S.SCENARIOS[name_or_snapshot][0]() if isinstance(name_or_snapshot, str) else name_or_snapshot
        seen = {}

        def fake_gather(options, needs):
            seen["options"], seen["needs"] = options, needs
            return snap

        monkeypatch.setattr("hostcheck.gather.gather", fake_gather)
        return seen

    return apply


def run_json(capsys, *argv):
    # Scenario snapshots hold no workload run: judge the core (--quick) unless a test selects otherwise.
    quick = [] if any("workload" in a or a in ("--list", "--quick") for a in argv) else ["--quick"]
    rc = command.main(["--json", *quick, *argv])
    return rc, json.loads(capsys.readouterr().out)


def test_healthy_exit_0_and_json_schema(use_scenario, capsys):
    use_scenario("healthy_8x_h100")
    rc, doc = run_json(capsys)
    assert rc == 0
    assert doc["schema_version"] == SCHEMA_VERSION
    assert set(doc) >= {"schema_version", "tool", "host", "time", "versions", "checks", "score", "exit_code"}
    assert doc["score"]["value"] == 100 and doc["score"]["ready"] is True
    assert doc["versions"]["driver"] == "580.159.04" and doc["versions"]["torch"] == "2.11.0+cu130"
    assert len(doc["host"]["gpus"]) == 8
    check = doc["checks"][0]
    assert set(check) == {
        "id",
        "title",
        "category",
        "weight",
        "status",
        "message",
        "value",
        "unit",
        "expected",
        "hint",
        "details",
        "duration_s",
        "brief",
    }
    assert {c["id"] for c in doc["checks"]} == {c.id for c in all_checks() if c.category != "workload"}


@pytest.mark.parametrize("name", ["pcie_x8", "no_nvml", "tiny_shm", "driver_too_old"])
def test_unhealthy_exit_1(use_scenario, capsys, name):
    use_scenario(name)
    rc, doc = run_json(capsys)
    assert rc == 1 and doc["exit_code"] == 1 and not doc["score"]["ready"]
    assert set(doc["score"]["blocking"]) == S.SCENARIOS[name][1]
    assert doc["score"]["top_fixes"]


def test_fail_level_and_min_score(use_scenario, capsys):
    snap = S.make_snapshot(nvml=S.FakeNvml(gpus=S.gpus_with(0, persistence=0)))  # one warning
    use_scenario(snap)
    assert command.main(["--quick"]) == 0
    assert command.main(["--quick", "--fail-level", "warn"]) == 1
    assert command.main(["--quick", "--min-score", "100"]) == 1
    use_scenario("pcie_x8")
    assert command.main(["--quick", "--fail-level", "none"]) == 0
    capsys.readouterr()


def test_only_and_skip_limit_checks_and_gatherers(use_scenario, capsys):
    seen = use_scenario("pcie_x8")
    rc, doc = run_json(capsys, "--only", "tuning,gpu.E001")
    assert rc == 0
    ids = {c["id"] for c in doc["checks"]}
    assert "gpu.E001" in ids and all(i.startswith("tuning.") or i == "gpu.E001" for i in ids)
    assert "nvml" in seen["needs"]
    rc, doc = run_json(capsys, "--skip", "gpu.E007")
    assert rc == 0 and "gpu.E007" not in {c["id"] for c in doc["checks"]}
    rc, doc = run_json(capsys, "--only", "system")
    # datapath: system.E005's dataset storage; hardware: system.E006-E010 (EDAC, MCE, D state, AER).
    assert seen["needs"] <= {"system", "torch", "facts", "datapath", "hardware"}


@pytest.mark.parametrize(
    "argv",
    [
        ["--only", "gpu.E999"],
        ["--bogus"],
        ["--fail-level", "loud"],
        ["--expect-gpus", "-1"],
        ["--min-score", "101"],
        ["--python", "/nonexistent/python"],
        ["--prometheus", "/nonexistent-dir/x.prom"],
    ],
)
def test_usage_and_environment_errors_exit_2(argv, use_scenario, capsys):
    use_scenario("healthy_8x_h100")
    assert command.main(argv) == 2
    assert "hostcheck: error" in capsys.readouterr().err


def test_internal_error_exits_2_without_traceback(monkeypatch, capsys):
    def boom(options, needs):
        raise RuntimeError("kaput")

    monkeypatch.setattr("hostcheck.gather.gather", boom)
    assert command.main([]) == 2
    err = capsys.readouterr().err
    assert "internal error" in err and "Traceback" not in err


def test_list(capsys):
    assert command.main(["--list", "--profile", "full"]) == 0
    out = capsys.readouterr().out
    assert all(c.id in out for c in all_checks())
    assert command.main(["--list"]) == 0  # the default profile: every check but those of the GPU workload
    out = capsys.readouterr().out
    assert all((c.id in out) is (not c.workload) for c in all_checks())


def test_options_reach_the_gatherers(use_scenario, capsys, tmp_path):
    seen = use_scenario("healthy_8x_h100")
    command.main(["--expect-gpus", "8", "--facts-dir", str(tmp_path), "--torch-timeout", "5"])
    o = seen["options"]
    assert (o.expect_gpus, o.facts_dir, o.torch_timeout_s) == (8, str(tmp_path), 5)
    capsys.readouterr()


def test_relative_python_path_is_made_absolute(use_scenario, capsys, monkeypatch, tmp_path):
    # The probes run in /, so a relative --python would not be found there ("No such file or directory").
    monkeypatch.chdir(tmp_path)
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to(sys.executable)
    seen = use_scenario("healthy_8x_h100")
    command.main(["--quick", "--python", "venv/bin/python"])
    assert seen["options"].python == str(tmp_path / "venv" / "bin" / "python")
    command.main(["--quick", "--python", "python3"])  # a bare name is looked up on PATH
    assert seen["options"].python == shutil.which("python3")
    capsys.readouterr()


def test_prometheus_and_junit_files(use_scenario, capsys, tmp_path):
    use_scenario("pcie_x8")
    prom, junit = tmp_path / "hostcheck.prom", tmp_path / "junit.xml"
    assert command.main(["--quick", "--prometheus", str(prom), "--junit", str(junit)]) == 1
    capsys.readouterr()
    samples = {}
    for line in prom.read_text().splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            samples[name_labels] = float(value)
    status = {k: v for k, v in samples.items() if k.startswith("hostcheck_check_status{")}
    core = [c for c in all_checks() if c.category != "workload"]
    assert len(status) == len(core)
    assert any('check="gpu.E007"' in k and v == 2 for k, v in status.items())
    assert 0 < samples["hostcheck_score"] < 100
    assert samples['hostcheck_ready{fail_level="fail"}'] == 0
    root = ET.parse(junit).getroot()
    assert int(root.get("failures")) == 1 and int(root.get("tests")) == len(core)
    failed = [tc.get("name") for tc in root.iter("testcase") if tc.find("failure") is not None]
    assert failed[0].startswith("gpu.E007")


def test_text_report_has_no_colour_when_not_a_tty(use_scenario, capsys):
    use_scenario("pcie_x8")
    command.main([])
    out = capsys.readouterr().out
    assert "\033[" not in out
    command.main(["--color", "always"])
    assert "\033[" in capsys.readouterr().out


def test_score_formula():
    def r(status, weight):
        return Result("x.E1", "t", "gpu", weight, status, "")

    assert score([r(Status.PASS, 10), r(Status.WARN, 2), r(Status.FAIL, 8), r(Status.SKIP, 100)]) == 55
    assert score([r(Status.ERROR, 1), r(Status.PASS, 3)]) == 75
    assert score([r(Status.SKIP, 1)]) is None
    v = verdict([r(Status.PASS, 1), r(Status.ERROR, 1)])
    assert not v.ready and v.blocking == ("x.E1",)


def test_check_timeout_and_crash_become_error_results():
    def slow(_s):
        time.sleep(2)
        return passed("late")

    def crash(_s):
        raise KeyError("boom")

    r = run_check(Check("gpu.E900", "slow", "gpu", 1, slow, timeout_s=0.1), None)
    assert r.status == Status.ERROR and "timed out" in r.message
    r = run_check(Check("gpu.E901", "crash", "gpu", 1, crash), None)
    assert r.status == Status.ERROR and "KeyError" in r.message
    r = run_check(Check("gpu.E902", "bad", "gpu", 1, lambda s: "nope"), None)
    assert r.status == Status.ERROR


def test_a_run_judges_its_checks_in_one_thread_and_a_hung_check_costs_only_itself():
    """run_checks starts one thread for the whole run (a thread per check cost a passive run most of its time on
    a busy machine); a check stuck past its timeout keeps that thread, and the checks after it run in a new one."""
    release = threading.Event()
    threads = []

    def ok(_s):
        threads.append(threading.current_thread())
        return passed("fine")

    def hung(_s):
        threads.append(threading.current_thread())
        release.wait(10)
        return passed("too late")

    checks = [Check(f"gpu.E9{i:02}", "ok", "gpu", 1, ok) for i in range(5)]
    checks.insert(2, Check("gpu.E990", "hung", "gpu", 1, hung, timeout_s=0.2))
    results = run_checks(checks, None)
    release.set()
    assert [r.status for r in results] == [Status.PASS] * 2 + [Status.ERROR] + [Status.PASS] * 3
    assert "timed out after 0.2 s" in results[2].message
    assert len(set(threads[:3])) == 1 and len(set(threads[3:])) == 1 and threads[3] is not threads[0]
    assert threads[0] is not threading.main_thread()
    for t in set(threads):  # the idle thread ended with the run; the hung one ends once its call returns
        t.join(2)
        assert not t.is_alive()


def test_quick_leaves_out_workload_checks():
    fake = [
        Check("gpu.E001", "a", "gpu", 1, lambda s: Outcome(Status.PASS, "")),
        Check("workload.E001", "w", "workload", 1, lambda s: Outcome(Status.PASS, ""), workload=True),
    ]
    assert [c.id for c in select(fake, quick=True)] == ["gpu.E001"]
    assert [c.id for c in select(fake, only=["workload"])] == ["workload.E001"]


def test_every_check_has_stable_unique_id_and_weight():
    checks = all_checks()
    assert len({c.id for c in checks}) == len(checks)
    for c in checks:
        assert c.id.split(".")[0] == c.category and c.weight > 0 and c.needs


def test_list_json(capsys):
    assert command.main(["--list", "--json", "--only", "gpu"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == SCHEMA_VERSION
    assert {c["category"] for c in doc["checks"]} == {"gpu"}


@pytest.mark.parametrize("name", ["healthy_8x_h100", "no_nvml", "no_gpu", "arch_not_in_torch"])
def test_json_matches_the_documented_schema(use_scenario, capsys, name):
    jsonschema = pytest.importorskip("jsonschema")
    schema_path = SCHEMA
    with open(schema_path, encoding="utf-8") as f:
        schema = json.load(f)
    use_scenario(name)
    _rc, doc = run_json(capsys)
    jsonschema.validate(doc, schema)


def test_committed_json_samples_match_the_schema():
    jsonschema = pytest.importorskip("jsonschema")
    docs = os.path.join(os.path.dirname(__file__), "..", "..", "docs")
    with open(SCHEMA, encoding="utf-8") as f:
        schema = json.load(f)
    samples = [
        n for n in os.listdir(os.path.join(docs, "samples")) if n.endswith(".json") and "schema" not in n
    ]
    assert samples
    for name in samples:
        with open(os.path.join(docs, "samples", name), encoding="utf-8") as f:
            jsonschema.validate(json.load(f), schema)


def test_help_and_version_return_0(capsys):
    assert command.main(["--help"]) == 0
    assert command.main(["--version"]) == 0
    assert "hostcheck" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["--nnodes", "3"],
        ["--rdzv-endpoint", "node1:29400"],
        ["--nnodes", "three", "--rdzv-endpoint", "node1:29400"],
        ["--nnodes", "3", "--rdzv-endpoint", "node1"],
        ["--quick", "--burn", "30"],
        ["--burn", "-1"],
        ["--nproc-per-node", "0"],
    ],
)
def test_bad_workload_options_are_usage_errors(argv, capsys):
    assert command.main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_workload_options_reach_the_gatherers(use_scenario, capsys):
    seen = use_scenario("healthy_8x_h100")
    argv = [
        "--json",
        "--profile",
        "full",
        "--only",
        "workload",
        "--nnodes",
        "2:4",
        "--rdzv-endpoint",
        "n1:29400",
    ]
    command.main([*argv, "--burn", "5"])
    capsys.readouterr()
    o = seen["options"]
    assert (o.nnodes, o.rdzv_endpoint, o.burn) == ("2:4", "n1:29400", 5.0)
    assert "workload" in seen["needs"]


@pytest.mark.parametrize("flag", ["--timeout", "--torch-timeout", "--workload-timeout", "--burn"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-5", "1e400", "1e9", "soon"])
def test_numeric_options_must_be_finite_and_in_range(flag, value, use_scenario, capsys):
    gathered = use_scenario("healthy_8x_h100")
    assert command.main(["--quick" if flag != "--burn" else "--json", f"{flag}={value}"]) == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and "Traceback" not in err
    assert "options" not in gathered, "the run started before the option was checked"


def test_zero_is_a_time_limit_only_for_burn(use_scenario, capsys):
    use_scenario("healthy_8x_h100")
    assert command.main(["--quick", "--timeout", "0"]) == 2
    capsys.readouterr()


def _fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda p: p / "a-folder", "is a folder"),
        (lambda p: p / "no-such-dir" / "x.prom", "its folder does not exist"),
        (lambda p: p / "link.prom", "symbolic link"),
        (lambda p: "", "empty path"),
    ],
)
def test_report_paths_that_cannot_take_a_report_are_refused_before_the_run(
    make, needle, use_scenario, tmp_path, capsys
):
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "target").write_text("keep me")
    (tmp_path / "link.prom").symlink_to(tmp_path / "target")
    gathered = use_scenario("healthy_8x_h100")
    assert command.main(["--quick", "--junit", str(make(tmp_path))]) == 2
    assert needle in capsys.readouterr().err
    assert "options" not in gathered
    assert (tmp_path / "target").read_text() == "keep me" and (tmp_path / "link.prom").is_symlink()


def test_one_path_for_two_reports_is_refused(use_scenario, tmp_path, capsys):
    use_scenario("healthy_8x_h100")
    out = tmp_path / "out"
    assert command.main(["--quick", "--prometheus", str(out), "--junit", str(tmp_path / "." / "out")]) == 2
    assert "name the same file" in capsys.readouterr().err and not out.exists()


def test_a_character_device_is_written_in_place_never_replaced(use_scenario, capsys):
    """`--junit /dev/full` as root once turned /dev/full into a regular file."""
    import stat

    use_scenario("healthy_8x_h100")
    assert command.main(["--quick", "--junit", "/dev/full"]) == 2  # ENOSPC: the report could not be written
    assert "writing a report file" in capsys.readouterr().err
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)
    assert command.main(["--quick", "--prometheus", "/dev/null"]) == 0
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)
    capsys.readouterr()


def test_a_fifo_gets_the_report_when_read_and_an_error_when_nobody_reads(use_scenario, tmp_path, capsys):
    import fcntl
    import stat

    use_scenario("healthy_8x_h100")
    fifo = _fifo(tmp_path)
    # Nobody reading: an error at once, not a hang.
    assert command.main(["--quick", "--prometheus", str(fifo)]) == 2
    assert "writing a report file" in capsys.readouterr().err
    # A reader (a collector) holds it open: the report goes through the FIFO, which stays a FIFO.
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)  # room for the whole report: the writer never waits
        assert command.main(["--quick", "--prometheus", str(fifo)]) == 0
        data = b""
        while chunk := os.read(fd, 1 << 20):
            data += chunk
    finally:
        os.close(fd)
    assert b"hostcheck_score" in data and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    capsys.readouterr()


# The same hung step in each command: check's torch probe, bench's probe of the training Python.
HUNG_RUNS = {
    "check": lambda tmp, py: ["--only", "torch.E001", "--python", py, "--facts-dir", tmp],
    "bench": lambda tmp, py: ["bench", "--python", py, "--facts-dir", tmp, "--workdir", f"{tmp}/w", "-q"],
}


@pytest.mark.parametrize("run", sorted(HUNG_RUNS))
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_a_signal_ends_the_run_and_every_child_with_it(tmp_path, sig, code, run):
    """A hung probe with a grandchild in a session of its own: both SIGKILLed before the run exits."""
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\n"
        f"echo $$ > {tmp_path}/probe.pid\n"
        f"setsid sleep 300 & echo $! > {tmp_path}/grandchild.pid\n"
        "exec sleep 300\n"
    )
    fake.chmod(0o755)
    p = subprocess.Popen(
        [sys.executable, "-m", "hostcheck", *HUNG_RUNS[run](str(tmp_path), str(fake))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        pidfiles = [tmp_path / "probe.pid", tmp_path / "grandchild.pid"]
        while not all(f.exists() and f.read_text().strip() for f in pidfiles):
            assert time.monotonic() < deadline and p.poll() is None, p.communicate()
            time.sleep(0.05)
        pids = [int(f.read_text()) for f in pidfiles]
        p.send_signal(sig)
        out, err = p.communicate(timeout=10)
    finally:
        p.kill()
    assert p.returncode == code, err
    assert f"interrupted by {signal.Signals(sig).name}" in err and "Traceback" not in err and out == ""
    for pid in pids:  # SIGKILLed before hostcheck exited; a loaded machine may take a moment to end them
        assert _gone_within(pid, 10), f"pid {pid} outlived the run"


@pytest.mark.parametrize("run", sorted(HUNG_RUNS))
def test_a_signal_between_a_childs_fork_and_its_registration_still_ends_the_child(tmp_path, monkeypatch, run):
    """SIGTERM while the main thread is between the fork of a child and its registration (bench starts its probe
    from the main thread; on a loaded machine the parent may wait there while the child already runs): raised
    there, Signalled lost the child (Popen never returned it, kill_all did not know it) and it outlived the run.
    The signal is held until the child is registered, then raised. The signal is planted in that window: it
    comes from the read of the child's start time, the last step before the registration. What the run started
    (the probe, and its grandchild in a session of its own if it got that far) carries a marker of this test."""
    from hostcheck.child import launch

    marker = f"HOSTCHECK_TEST_MARK={uuid.uuid4().hex}".encode()
    monkeypatch.setenv(*marker.decode().split("="))
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nsetsid sleep 300 &\nexec sleep 300\n")
    fake.chmod(0o755)
    real, children = launch.start_ticks, []

    def signalled_start_ticks(pid: int, *args):
        if not children:
            children.append(pid)
            signal.raise_signal(signal.SIGTERM)
        return real(pid, *args)

    monkeypatch.setattr(launch, "start_ticks", signalled_start_ticks)
    handler = signal.getsignal(signal.SIGTERM)
    try:
        assert command.main(HUNG_RUNS[run](str(tmp_path), str(fake))) == 143
        deadline = time.monotonic() + 10  # SIGKILLed before the run ended; a loaded machine may take a moment
        while (left := _carriers(marker)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert children and not left, f"outlived the run: {left}"
    finally:
        for pid in _carriers(marker):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        launch.reopen()
    assert signal.getsignal(signal.SIGTERM) is handler


def _carriers(needle: bytes) -> list[int]:
    """This user's live processes whose environment holds ``needle`` (NAME=VALUE)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != os.geteuid():
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0") and _alive(int(name)):
                    found.append(int(name))
        except OSError:
            continue
    return found


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        ["check", "--help"],
        ["bench", "--help"],
        ["fleet", "--help"],
        ["fleet", "-h"],
    ],
)
def test_help_that_cannot_be_written_is_not_a_success(argv):
    with open("/dev/full", "w") as full:
        p = subprocess.run(
            [sys.executable, "-m", "hostcheck", *argv], stdout=full, stderr=subprocess.PIPE, text=True
        )
    assert p.returncode == 2 and "writing to standard output" in p.stderr and "Traceback" not in p.stderr


def test_closed_stdout_and_a_full_disk_are_usage_errors_without_a_traceback():
    argv = [sys.executable, "-m", "hostcheck", "--only", "system.E001"]
    closed = subprocess.run(
        [*argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, pass_fds=()
    )
    assert closed.returncode in (0, 1)  # /dev/null is a fine reader
    p = subprocess.run(["/bin/sh", "-c", '"$@" >&-', "sh", *argv], stderr=subprocess.PIPE, text=True)
    assert p.returncode == 2 and "standard output is closed" in p.stderr and "Traceback" not in p.stderr
    with open("/dev/full", "w") as full:
        p = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True)
    assert p.returncode == 2 and "writing the report" in p.stderr and "Traceback" not in p.stderr


def test_an_unusable_temporary_folder_is_a_usage_error_before_the_run(
    use_scenario, monkeypatch, tmp_path, capsys
):
    import tempfile

    gathered = use_scenario("healthy_8x_h100")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))
    assert command.main(["--quick"]) == 2
    assert "cannot create a temporary file" in capsys.readouterr().err and "options" not in gathered


@pytest.mark.parametrize("sel", ["SYSTEM", "System", "Gpu.e001", "GPU.E001", "system.e001"])
def test_selectors_are_case_insensitive_for_ids_and_categories_alike(sel, use_scenario, capsys):
    use_scenario("healthy_8x_h100")
    rc, doc = run_json(capsys, "--only", sel)
    assert rc == 0 and doc["checks"]


def _comparable(doc):
    """A report without what differs between two runs of the same judgement (times, durations)."""
    if isinstance(doc, dict):
        return {k: _comparable(v) for k, v in doc.items() if k not in ("time", "duration_s")}
    if isinstance(doc, list):
        return [_comparable(v) for v in doc]
    return doc


@pytest.mark.parametrize("options", [["--quick"], ["--quick", "--only", "gpu", "--fail-level", "warn"]])
def test_check_json_is_hostcheck_json(options, use_scenario, capsys):
    use_scenario("pcie_x8")
    assert command.main(["check", "--json", *options]) == 1
    named = json.loads(capsys.readouterr().out)
    assert command.main(["--json", *options]) == 1
    default = json.loads(capsys.readouterr().out)
    assert _comparable(named) == _comparable(default) and named["checks"]


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--json"],
        ["--quick", "--only", "gpu", "--skip", "gpu.E012", "--min-score", "90", "-v"],
        ["--list", "--json", "--python", sys.executable, "--timeout", "5", "--debug"],
        ["--nnodes", "2", "--rdzv-endpoint", "n1:29400", "--burn", "5", "--color", "never"],
    ],
)
def test_every_check_option_means_the_same_with_and_without_the_command_name(argv):
    default, named = command.parse(argv), command.parse(["check", *argv])
    assert default.command == named.command == "check" and default.debug == named.debug
    assert vars(default.args) == vars(named.args)
    assert (default.prog, named.prog) == ("hostcheck", "hostcheck check")


def test_the_parsed_options_of_a_command_are_its_own(tmp_path):
    inv = command.parse(["--debug", "fleet", str(tmp_path), "--expect", "a", "b"])
    assert inv.command == "fleet" and inv.debug and inv.prog == "hostcheck fleet"
    assert set(vars(inv.args)) == {
        "command",
        "debug",
        "report_dir",
        "out",
        "min_score",
        "expect",
        "config",
        "sweep",
    }
    assert inv.args.expect == ["a", "b"]


@pytest.mark.parametrize("argv", [["--help"], ["check", "--help"], ["bench", "--help"], ["fleet", "--help"]])
def test_help_of_every_command_exits_0(argv, capsys):
    assert command.main(argv) == 0
    out = capsys.readouterr().out
    name = argv[0] if len(argv) > 1 else ""
    assert out.startswith(f"usage: hostcheck {name}".rstrip() + " ")


def test_the_top_level_help_lists_every_command(capsys):
    assert command.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in command.SUBCOMMANDS:
        assert f"    {name} " in out and command.load(name).SUMMARY.split()[0] in out
    assert "--json" in out and "--only" in out  # check's options: the default command


@pytest.mark.parametrize(
    ("argv", "first_line"),
    [
        (["frobnicate"], "hostcheck: error: argument COMMAND: invalid choice: 'frobnicate'"),
        (["--frobnicate"], "hostcheck: error: unrecognized arguments: --frobnicate"),
        (["check", "--frobnicate"], "hostcheck check: error: unrecognized arguments: --frobnicate"),
        (["bench", "--frobnicate"], "hostcheck bench: error: unrecognized arguments: --frobnicate"),
        (["fleet", "--frobnicate"], "hostcheck fleet: error:"),
        (["fleet"], "hostcheck fleet: error: the following arguments are required: report_dir"),
        (["--quick", "bench"], "hostcheck: error: --quick given before 'bench'"),
        (["--json", "check"], "hostcheck: error: --json given before 'check'"),
        (["--only", "gpu", "fleet", "."], "hostcheck: error: --only given before 'fleet'"),
    ],
)
def test_an_unknown_command_or_option_is_one_line_and_exit_2(argv, first_line):
    p = subprocess.run([sys.executable, "-m", "hostcheck", *argv], capture_output=True, text=True)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith(first_line) and p.stderr.count("\n") == 1, p.stderr
    assert "Traceback" not in p.stderr


def test_debug_shows_the_traceback_of_an_internal_error_and_only_then(monkeypatch, capsys):
    def boom(options, needs):
        raise RuntimeError("kaput")

    monkeypatch.setattr("hostcheck.gather.gather", boom)
    for argv in (["--quick"], ["check", "--quick"]):
        assert command.main(argv) == 2
        err = capsys.readouterr().err
        assert "internal error: RuntimeError: kaput (re-run with --debug)" in err and "Traceback" not in err
    for argv in (["--quick", "--debug"], ["--debug", "check", "--quick"], ["check", "--quick", "--debug"]):
        assert command.main(argv) == 2
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err and 'raise RuntimeError("kaput")' in err, argv
        assert err.rstrip().endswith("internal error: RuntimeError: kaput (re-run with --debug)")


def test_no_memory_is_an_environment_error_with_the_address_space_limit_not_an_internal_error(
    monkeypatch, capsys
):
    """A run that cannot allocate (a small ulimit -v) ends with exit 2 and says so, with the limit: no hostcheck bug
    to report."""

    def no_memory(options, needs):
        raise MemoryError

    monkeypatch.setattr("hostcheck.gather.gather", no_memory)
    assert command.main(["--quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hostcheck: error: out of memory") and "internal error" not in err, err
    limited = (45 << 20, command.resource.RLIM_INFINITY)
    monkeypatch.setattr(command.resource, "getrlimit", lambda which: limited)
    assert command.main(["check", "--quick"]) == 2
    assert capsys.readouterr().err == (
        "hostcheck check: error: out of memory (the address-space limit, ulimit -v, is 45 MiB)\n"
    )


def test_no_memory_to_import_hostcheck_is_exit_2_with_the_reason(tmp_path):
    """Just above the interpreter's own needs (ulimit -v at hostcheck's import footprint) the import itself fails:
    one line and exit 2, not Python's traceback and exit 1. The import's failure is planted by a finder."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class NoMemory:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'hostcheck.exitcodes':  # imported by hostcheck.command itself\n"
        "            raise MemoryError\n"
        "sys.meta_path.insert(0, NoMemory())\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    p = subprocess.run(
        [sys.executable, "-m", "hostcheck", "--version"], capture_output=True, text=True, env=env
    )
    assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stderr)
    assert p.stderr == "hostcheck: error: out of memory while starting (an address-space limit, ulimit -v?)\n"


def test_an_error_python_cannot_raise_is_one_line_without_a_traceback(monkeypatch, capsys):
    """A thread that died before it ran (no memory for its first frame) is reported by the interpreter through
    sys.unraisablehook, with threading's own traceback: during a run, one line instead."""

    class Dying:
        def __del__(self):
            raise ValueError("in a finalizer")

    def gather_then_drop(options, needs):
        Dying()
        raise RuntimeError("stop here")

    hook = sys.unraisablehook
    monkeypatch.setattr("hostcheck.gather.gather", gather_then_drop)
    assert command.main(["--quick"]) == 2
    err = capsys.readouterr().err
    assert "hostcheck: error: ValueError (Exception ignored)\n" in err and "Traceback" not in err, err
    assert sys.unraisablehook is hook


def test_python_m_hostcheck_json_is_the_check_command():
    argv = [sys.executable, "-m", "hostcheck"]
    default = subprocess.run([*argv, "--json", "--only", "system.E001"], capture_output=True, text=True)
    named = subprocess.run(
        [*argv, "check", "--json", "--only", "system.E001"], capture_output=True, text=True
    )
    assert default.returncode == named.returncode and default.returncode in (0, 1), default.stderr
    assert _comparable(json.loads(default.stdout)) == _comparable(json.loads(named.stdout))


HOSTCHECK = os.path.join(os.path.dirname(__file__), "..", "..", "hostcheck")
#: Each command's module, and the module that wires them.
COMMAND_MODULES = {
    "hostcheck.check.cli": "check/cli.py",
    "hostcheck.bench.cli": "bench/cli.py",
    "hostcheck.fleet.cli": "fleet/cli.py",
    "hostcheck.command": "command.py",
}


def _imports(path: str) -> list[tuple[ast.AST, str, list[str], bool]]:
    """(node, module, names, at the top) for every import in a file."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    top = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node, a.name, [], id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node, node.module, [a.name for a in node.names], id(node) in top))
    return found


@pytest.mark.parametrize(
    ("one", "other"),
    [("hostcheck.check.cli", "hostcheck.bench.cli"), ("hostcheck.bench.cli", "hostcheck.check.cli")],
)
def test_check_and_bench_do_not_import_each_other(one, other):
    code = f"import sys, {one}; print({other!r} in sys.modules, 'hostcheck.command' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.split() == ["False", "False"], f"importing {one} imported {other} or hostcheck.command"
    for _node, module, names, _top in _imports(os.path.join(HOSTCHECK, COMMAND_MODULES[one])):
        assert module != other and not (module == other.rsplit(".", 1)[0] and "cli" in names), module


#: What a command module imports where it is used, for the passive profile's start (Slurm's HealthCheckProgram,
#: every few minutes): the renderer of the form asked for, and Slurm's module only with --slurm-drain.
WHERE_USED = {"hostcheck.check.cli": ("hostcheck.check.render.", "hostcheck.slurm")}


@pytest.mark.parametrize("module", sorted(COMMAND_MODULES))
def test_no_private_name_crosses_between_commands_and_imports_are_at_the_top(module):
    for node, imported, names, top in _imports(os.path.join(HOSTCHECK, COMMAND_MODULES[module])):
        if imported in COMMAND_MODULES:
            assert not [n for n in names if n.startswith("_")], f"{module} imports {names} from {imported}"
        if imported.startswith(WHERE_USED.get(module, ())):
            continue
        if imported.startswith("hostcheck") and not top:
            # The one exception: the old entry points call hostcheck.command, which imports their module.
            assert (imported, names) == ("hostcheck.command", ["main"]), f"{module}:{node.lineno} {imported}"


# A report printed, then daemon threads that wake while the interpreter finalizes, with no address space left:
# CPython ends them with pthread_exit, glibc cannot load libgcc_s for it and aborts ("libgcc_s.so.1 must be
# installed for pthread_exit to work", exit -6: once in CI under `ulimit -v`).
ABANDONED_THREADS = """
import resource, sys, threading, time
from hostcheck import command

def spin():
    while True:
        time.sleep(0.001)

def main():
    for _ in range(4):
        threading.Thread(target=spin, daemon=True).start()
    print("the report", end="")  # buffered: entry_point must flush it
    vm = int(next(ln for ln in open("/proc/self/status") if ln.startswith("VmSize")).split()[1]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm, resource.RLIM_INFINITY))
    return 3

command.main = main
command.entry_point()
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc")
def test_the_exit_code_and_the_report_stand_when_abandoned_threads_wake_at_exit():
    for _ in range(3):
        p = subprocess.run(
            [sys.executable, "-c", ABANDONED_THREADS],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(Path(command.__file__).parents[1])},
        )
        assert (p.returncode, p.stdout, p.stderr) == (3, "the report", "")


def test_a_thread_that_fails_outside_its_handler_says_one_line_and_main_restores_the_hook(capsys):
    hook = threading.excepthook
    assert command.main(["--version"]) == 0 and threading.excepthook is hook
    threading.excepthook = command._thread_failed
    try:
        t = threading.Thread(target=lambda: 1 / 0, name="worker")
        t.start()
        t.join()
    finally:
        threading.excepthook = hook
    err = capsys.readouterr().err
    assert err == "hostcheck: error: thread worker ended with ZeroDivisionError\n"
