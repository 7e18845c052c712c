"""``hostcheck job``'s command line without torch: exit codes passed through, usage errors, the window, signals
forwarded, nothing left behind, and the hook's sitecustomize inert without torch and chained to the user's own."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARK = "HOSTCHECK_JOB_TEST_MARK"


def job(*argv: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "hostcheck", "job", *argv],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def carrying(mark: str) -> list[int]:
    needle = f"{MARK}={mark}".encode()
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        out.append(int(d))
            except OSError:
                pass
    return out


@pytest.mark.parametrize(
    ("command", "code"),
    [
        (["sh", "-c", "exit 3"], 3),
        (["sh", "-c", "exit 0"], 0),
        (["sh", "-c", "exit 2"], 2),  # a job may exit 2 too: the JSON's job.rc tells it from a usage error
        (["sh", "-c", "kill -TERM $$"], 128 + signal.SIGTERM),
        (["no-such-command-hostcheck-test"], 127),
        (["/etc/hostname"], 126),
    ],
)
def test_the_command_exit_code_is_passed_through(command, code, tmp_path):
    out = tmp_path / "r.json"
    p = job("-q", "--json", str(out), "--", *command)
    assert p.returncode == code, p.stderr
    doc = json.loads(out.read_text())
    assert doc["exit_code"] == code
    assert doc["verdict"]["kind"] == "no-training-loop"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "give the command to run after --"),
        (["--"], "give the command to run after --"),
        (["--seconds", "0", "--", "true"], "--seconds"),
        (["--json", "/no/such/dir/r.json", "--", "true"], "--json /no/such/dir/r.json"),
        (["--keep-records", "/no/such/dir", "--", "true"], "--keep-records"),
    ],
)
def test_usage_errors_are_exit_2_before_anything_starts(argv, needle):
    p = job(*argv)
    assert p.returncode == 2 and needle in p.stderr and "Traceback" not in p.stderr
    assert p.stderr.startswith("hostcheck job: error:")


def test_options_after_the_command_are_the_command_s(tmp_path):
    p = job("-q", "--", sys.executable, "-c", "import sys; print(sys.argv[1:])", "--seconds", "5")
    assert p.returncode == 0 and p.stdout.strip() == "['--seconds', '5']"


def test_the_window_ends_the_command_and_exits_0(tmp_path):
    out = tmp_path / "r.json"
    mark = uuid.uuid4().hex
    t0 = time.monotonic()
    p = job(
        "--seconds", "1.5", "--grace", "2", "-q", "--json", str(out), "--", "sh", "-c", "sleep 60 & sleep 60",
        env={MARK: mark},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert time.monotonic() - t0 < 20
    doc = json.loads(out.read_text())
    assert doc["job"]["ended_by"] == "window" and doc["job"]["rc"] is not None
    assert carrying(mark) == []


def test_the_report_names_the_window_given_and_the_time_the_command_took_to_stop():
    """--seconds 1.5 on a command that takes a second to exit after SIGINT: the report says 1.5 s and the second
    after it (it said "stopped after the 3 s window" for a window of 1.5 s)."""
    script = 'trap "sleep 1; exit 0" INT; while :; do sleep 0.1; done'
    p = job("--seconds", "1.5", "--grace", "5", "--", "sh", "-c", script)
    assert p.returncode == 0, p.stderr
    (ran,) = [ln for ln in p.stderr.splitlines() if ln.strip().startswith("ran ")]
    m = re.search(
        r"stopped at the end of its 1\.5 s window \(--seconds\), (\d+\.\d) s to exit after SIGINT", ran
    )
    assert m and 0.8 <= float(m.group(1)) < 5, ran


def test_sigint_is_forwarded_the_report_printed_and_nothing_left(tmp_path):
    """Ctrl-C: the command's group gets SIGINT, whatever left the group (a grandchild in a session of its own,
    as torchrun starts its workers) is swept, the report is still printed, and hostcheck exits 130."""
    mark = uuid.uuid4().hex
    script = (
        "import subprocess, sys, time;"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True);"
        "time.sleep(60)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), MARK: mark}
    p = subprocess.Popen(
        [sys.executable, "-m", "hostcheck", "job", "--grace", "2", "--", sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    while len(carrying(mark)) < 3 and time.monotonic() < deadline:  # hostcheck, the job, its grandchild
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    _out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert "ended by SIGINT sent to hostcheck" in err and "interrupted by SIGINT" in err
    time.sleep(0.2)
    assert carrying(mark) == []


def test_without_torch_the_hook_loads_and_records_nothing(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    code = (
        "import json, sys; print(json.dumps(['hostcheck_job_hook' in sys.modules, 'torch' in sys.modules]))"
    )
    p = job("-q", "--keep-records", str(records), "--", sys.executable, "-c", code)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [True, False]
    assert list(records.iterdir()) == []


def test_a_sitecustomize_of_the_user_still_runs_and_its_errors_read_the_same(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import sys\nsys.user_site_ran = True\n")
    code = (
        "import json, sys, sitecustomize;"
        "print(json.dumps([getattr(sys, 'user_site_ran', False), 'hostcheck_job_hook' in sys.modules,"
        " sitecustomize.__file__]))"
    )
    p = job("-q", "--", sys.executable, "-c", code, env={"PYTHONPATH": str(user)})
    assert p.returncode == 0, p.stderr
    ran, hooked, where = json.loads(p.stdout)
    assert ran and hooked and where == str(user / "sitecustomize.py")
    # A broken one: site.py's own words, with and without the hook.
    (user / "sitecustomize.py").write_text("raise ValueError('broken on purpose')\n")
    plain = subprocess.run(
        [sys.executable, "-c", "print('ran')"],
        env={**os.environ, "PYTHONPATH": str(user)},
        capture_output=True,
        text=True,
    )
    p = job("-q", "--", sys.executable, "-c", "print('ran')", env={"PYTHONPATH": str(user)})
    assert p.stdout == plain.stdout == "ran\n"
    assert (
        "Error in sitecustomize; set PYTHONVERBOSE for traceback:\nValueError: broken on purpose"
        in plain.stderr
    )
    assert plain.stderr in p.stderr


def test_the_hook_and_its_folder_name_the_same_variable():
    from hostcheck.inside import job_hook
    from hostcheck.job import observe

    assert job_hook.DIR_VAR == observe.DIR_VAR
    assert (Path(observe.JOBSITE) / "sitecustomize.py").is_file()
    env = observe.job_env({"PYTHONPATH": "/a:/b"}, "/run")
    assert env["PYTHONPATH"] == observe.JOBSITE + os.pathsep + "/a:/b" and env[observe.DIR_VAR] == "/run"
    assert observe.job_env({}, "/run")["PYTHONPATH"] == observe.JOBSITE


# --- hostile records and rough edges (the hostile-input issue) ---------------------------------------------

RECORD = "f=$HOSTCHECK_JOB_DIR/hook-1-1.jsonl; "


@pytest.mark.parametrize(
    ("script", "named"),
    [
        ("mkfifo $f", "hook-1-1.jsonl: is a FIFO"),
        ("ln -s /dev/zero $f", "hook-1-1.jsonl: is a symbolic link"),
        ('echo \'{"k": "proc", "pid": "abc"}\' > $f', 'pid is "abc"'),
        ('echo \'{"k": "proc", "pid": 1, "argv": 5}\' > $f', "argv is 5"),
        ('printf \'%s\\n\' \'{"k": "proc", "pid": 1}\' \'{"k": "b", "t": [NaN, 1, 2, 3]}\' > $f', "NaN"),
    ],
)
def test_hostile_records_are_named_and_the_job_s_exit_code_comes_back(script, named, tmp_path):
    out = tmp_path / "r.json"
    p = job("--seconds", "20", "--json", str(out), "--", "sh", "-c", RECORD + script + "; exit 3", timeout=40)
    assert p.returncode == 3, p.stderr
    assert "Traceback" not in p.stderr and "internal error" not in p.stderr
    doc = json.loads(out.read_text())
    assert any(named in d for d in doc["records_dropped"]), doc["records_dropped"]
    assert named in p.stderr
    # absent: a job that writes nothing there drops nothing
    p = job("--json", str(out), "--", "sh", "-c", "exit 3")
    assert p.returncode == 3 and json.loads(out.read_text())["records_dropped"] == []


@pytest.mark.parametrize("stderr", ["closed", "devfull"])
def test_a_closed_or_full_stderr_never_replaces_the_job_s_exit_code(stderr, tmp_path):
    script = RECORD + 'echo \'{"k": "proc", "pid": "abc"}\' > $f; exit 3'
    argv = [sys.executable, "-m", "hostcheck", "job", "--", "sh", "-c", script]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if stderr == "closed":
        p = subprocess.run(
            argv, env=env, stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(2), timeout=60
        )
    else:
        with open("/dev/full", "w") as full:
            p = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=full, timeout=60)
    assert p.returncode == 3


def test_keep_records_leaves_the_folder_s_mode_alone(tmp_path):
    keep = tmp_path / "records"
    keep.mkdir()
    keep.chmod(0o755)
    p = job("-q", "--keep-records", str(keep), "--", "sh", "-c", "exit 0")
    assert p.returncode == 0, p.stderr
    assert keep.stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize(("value", "code"), [("0.001", 2), ("0.05", 2), ("0.1", 0), ("61", 2)])
def test_the_sampling_interval_has_bounds(value, code):
    p = job("-q", "--interval", value, "--", "true")
    assert p.returncode == code, p.stderr
    if code == 2:
        assert "--interval: from 0.1 to 60 seconds" in p.stderr


def test_a_command_that_never_started_is_not_told_to_run_longer():
    p = job("--", "no-such-command-hostcheck-test")
    assert p.returncode == 127
    assert "longer --seconds" not in p.stderr and "did not start" in p.stderr
    # absent: a command that ran without a loop is still told about the window
    p = job("--", "true")
    assert p.returncode == 0 and "longer --seconds" in p.stderr
