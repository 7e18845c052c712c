"""The one launcher (hostcheck.child.launch): timeouts, group kill, token sweep, crashes, bad output. No torch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hostcheck.child import launch as runner
from hostcheck.child.launch import MARKER, parse_records, run_child, run_children
from hostcheck.gather.suite import section as read_section


def script(tmp_path, name: str, body: str) -> list[str]:
    p = tmp_path / f"{name}.py"
    p.write_text(f"import json, os, signal, subprocess, sys, time\nM = {MARKER!r}\n" + textwrap.dedent(body))
    return [sys.executable, str(p)]


def test_records_parsed_in_order_and_noise_ignored(tmp_path):
    argv = script(
        tmp_path,
        "ok",
        """
        print("some library chatter")
        print(M + json.dumps({"probe": "a", "ok": True}))
        print(M + json.dumps({"probe": "b", "ok": True, "data": {"x": 1}}), flush=True)
        """,
    )
    r = run_child(argv, timeout=20, name="ok")
    assert r.ok, r.error
    assert [x["probe"] for x in r.records] == ["a", "b"]
    assert r.data == {"probe": "b", "ok": True, "data": {"x": 1}}
    assert r.rc == 0 and not r.timed_out


def test_hung_child_is_killed_at_its_timeout_and_keeps_what_it_printed(tmp_path):
    argv = script(
        tmp_path,
        "hang",
        """
        print(M + json.dumps({"probe": "matmul", "ok": True}), flush=True)
        print(M + json.dumps({"probe": "amp", "event": "start"}), flush=True)
        time.sleep(120)
        """,
    )
    t0 = time.monotonic()
    r = run_child(argv, timeout=1.0, name="hang")
    wall = time.monotonic() - t0
    assert 0.95 <= wall < 3.0, wall
    assert r.timed_out and not r.ok
    assert "timed out after 1 s" in r.error
    assert [x["probe"] for x in r.records] == ["matmul", "amp"]
    assert read_section(r, "matmul") == ({}, None)
    data, why = read_section(r, "amp")
    assert data is None and "timed out" in why and "during amp" in why
    data, why = read_section(r, "dataloader")
    assert data is None and "before dataloader" in why


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):  # killed; waiting for init to reap it
            return True
        time.sleep(0.05)
    return False


def test_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    argv = script(
        tmp_path,
        "forker",
        f"""
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(pidfile)!r}, "w").write(str(g.pid))
        time.sleep(120)
        """,
    )
    r = run_child(argv, timeout=1.0)
    assert r.timed_out
    assert _gone_within(int(pidfile.read_text()), 3), (
        "the grandchild (think: a DataLoader worker) outlived it"
    )


@pytest.mark.parametrize("hang", [True, False])
def test_a_grandchild_in_a_session_of_its_own_is_killed_too(tmp_path, hang):
    # torchrun starts each worker with start_new_session=True: the group kill cannot reach it.
    pidfile = tmp_path / "worker.pid"
    argv = script(
        tmp_path,
        "launcher",
        f"""
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        open({str(pidfile)!r}, "w").write(str(g.pid))
        time.sleep(120 if {hang!r} else 0)
        print("HOSTCHECK_WORKLOAD_JSON:{{}}")
        """,
    )
    r = run_child(argv, timeout=1.5)
    assert r.timed_out is hang
    assert _gone_within(int(pidfile.read_text()), 3), "a worker in its own session outlived the run"


def test_a_child_that_survives_sigkill_is_left_behind_not_waited_for(tmp_path, monkeypatch):
    # Stand-in for a process stuck in the kernel (D state, wedged driver): make the kill a no-op.
    monkeypatch.setattr(runner, "kill_group", lambda p: None)
    monkeypatch.setattr(runner, "kill_by_token", lambda token, since: [])
    monkeypatch.setattr(runner, "KILL_WAIT_S", 0.2)
    pidfile = tmp_path / "pid"
    argv = script(
        tmp_path, "stuck", f"open({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n"
    )
    t0 = time.monotonic()
    try:
        r = run_child(argv, timeout=1.5)
        assert time.monotonic() - t0 < 5
        assert r.timed_out and "did not die on SIGKILL" in r.error
    finally:
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def test_the_token_sweep_reads_only_our_processes_born_during_the_run(tmp_path):
    """A process stuck in the kernel blocks any reader of its environment; the sweep must not touch one that
    predates the run or is another user's. Their environ here is a FIFO: opening it would block."""
    import threading

    token = "t0k3n"
    proc = tmp_path / "proc"
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        since = runner.start_ticks(worker.pid)
        assert since is not None
        mine = proc / str(worker.pid)
        mine.mkdir(parents=True)
        (mine / "stat").write_bytes(Path(f"/proc/{worker.pid}/stat").read_bytes())
        (mine / "environ").write_bytes(f"A=1\0{runner.TOKEN_VAR}={token}\0".encode())
        for pid, started, uid in ((999_999_991, since - 1, os.geteuid()), (999_999_992, since, 65534)):
            d = proc / str(pid)
            d.mkdir()
            (d / "stat").write_text(f"{pid} (stuck) D {' '.join(['0'] * 18)} {started} 0 0\n")
            os.mkfifo(d / "environ")
            if uid != os.geteuid():
                if os.geteuid() != 0:
                    continue
                os.chown(d, uid, uid)
        got: list = []
        t = threading.Thread(
            target=lambda: got.append(runner.kill_by_token(token, since, str(proc))), daemon=True
        )
        t.start()
        t.join(10)
        assert not t.is_alive(), "the sweep opened the environment of a process it must leave alone"
        assert got == [[worker.pid]]
        assert worker.wait(5) == -signal.SIGKILL
    finally:
        worker.kill()
        worker.wait()


def test_start_ticks_of_a_process_that_is_gone_is_none():
    assert runner.start_ticks(999_999_999) is None
    assert runner.start_ticks(os.getpid()) == runner.start_ticks(os.getpid()) > 0


def test_crashing_child_gives_an_error_with_the_stderr_tail(tmp_path):
    argv = script(
        tmp_path,
        "crash",
        """
        print(M + json.dumps({"probe": "env", "ok": True}), flush=True)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
        """,
    )
    r = run_child(argv, timeout=20)
    assert not r.ok and r.rc == 1 and not r.timed_out
    assert r.error.startswith("crashed (exit 1)")
    assert "illegal memory access" in r.error
    assert "Traceback" in r.stderr_tail
    assert len(r.records) == 1  # what it printed before the crash is kept


def test_a_closing_rule_is_not_taken_for_the_error(tmp_path):
    # torchrun ends its failure report with a line of '='; the error should quote what precedes it.
    argv = script(
        tmp_path,
        "rule",
        'sys.stderr.write("ChildFailedError: rank 0 failed\\n" + "=" * 60 + "\\n")\nsys.exit(1)\n',
    )
    r = run_child(argv, timeout=20)
    assert r.error == "crashed (exit 1): ChildFailedError: rank 0 failed"


def test_child_killed_by_a_signal_is_named(tmp_path):
    argv = script(tmp_path, "segv", "os.kill(os.getpid(), signal.SIGSEGV)\n")
    r = run_child(argv, timeout=20)
    assert not r.ok and "SIGSEGV" in r.error


def test_bad_json_is_an_error(tmp_path):
    argv = script(tmp_path, "bad", "print(M + '{not json')\n")
    r = run_child(argv, timeout=20)
    assert not r.ok and "bad JSON" in r.error
    argv = script(tmp_path, "list", "print(M + '[1, 2]')\n")
    assert "not an object" in run_child(argv, timeout=20).error


def test_silent_success_is_an_error(tmp_path):
    r = run_child(script(tmp_path, "silent", "pass\n"), timeout=20)
    assert not r.ok and "printed no result" in r.error


def test_missing_interpreter_is_an_error_not_an_exception(tmp_path):
    r = run_child([str(tmp_path / "no-such-python"), "x"], timeout=5)
    assert not r.ok and "could not start" in r.error


def test_a_crashed_rank_gets_its_hung_peer_killed_after_the_grace(tmp_path):
    crash = script(tmp_path, "rank0", "sys.exit(3)\n")
    hang = script(tmp_path, "rank1", "time.sleep(120)\n")
    t0 = time.monotonic()
    runs = run_children([crash, hang], timeout=60, name="ddp", grace_after_failure=0.5)
    assert time.monotonic() - t0 < 10
    assert runs[0].error.startswith("crashed (exit 3)")
    assert runs[1].timed_out and "after a peer process failed" in runs[1].error
    assert [r.name for r in runs] == ["ddp[0]", "ddp[1]"]


def test_parse_records_keeps_good_lines_around_a_bad_one():
    out = "\n".join([MARKER + '{"a": 1}', MARKER + "{oops", "noise", MARKER + '{"b": 2}'])
    recs, bad = parse_records(out)
    assert recs == [{"a": 1}, {"b": 2}] and "bad JSON" in bad


def test_child_env_sets_pci_order_and_unbuffered_output(monkeypatch):
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    env = runner.child_env({"OMP_NUM_THREADS": "4"})
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["PYTHONUNBUFFERED"] == "1"
    assert env["OMP_NUM_THREADS"] == "4"
    assert runner.child_env({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


# --- the reaper: what is left when hostcheck is SIGKILLed ---------------------------------------------------


def _alive(pid: int) -> bool:
    """Running (a zombie, killed and waiting for its parent, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _sleeper(env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "300"], start_new_session=True, env=env)


def test_the_reaper_kills_registered_groups_and_token_carriers_at_end_of_input():
    token = "t" + os.urandom(8).hex()
    child = _sleeper()  # a child, leading its group
    stray = _sleeper({**os.environ, runner.TOKEN_VAR: token})  # left the group: found by the token
    ended = _sleeper()  # a launch that ended cleanly: no longer the reaper's
    try:
        lines = [
            f"+ {token} {child.pid} {runner.start_ticks(child.pid)}\n",
            f"+ done {ended.pid} {runner.start_ticks(ended.pid)}\n",
            "- done\n",
            "garbage that is ignored\n",
        ]
        from hostcheck.child import reaper

        assert reaper.main(iter(line.encode() for line in lines)) == 0
        child.wait(5), stray.wait(5)
        assert child.returncode == stray.returncode == -signal.SIGKILL
        assert _alive(ended.pid)
    finally:
        for p in (child, stray, ended):
            p.kill()
            p.wait()


def test_the_reaper_kills_what_carries_an_announced_token_from_its_start_on():
    """``t TOKEN TICKS`` (sent before a launch forks): a carrier of the token started at or after TICKS is killed
    though no ``+`` line named it; one started before TICKS is left alone (not this run's)."""
    token = "t" + os.urandom(8).hex()
    early = _sleeper({**os.environ, runner.TOKEN_VAR: token})
    time.sleep(0.05)
    since = runner.start_ticks(early.pid) + 1
    while runner.start_ticks(os.getpid()) is not None and _ticks_now() < since:
        time.sleep(0.01)
    late = _sleeper({**os.environ, runner.TOKEN_VAR: token})
    try:
        from hostcheck.child import reaper

        assert reaper.main(iter([f"t {token} {since}\n".encode()])) == 0
        late.wait(5)
        assert late.returncode == -signal.SIGKILL and _alive(early.pid)
    finally:
        for p in (early, late):
            p.kill()
            p.wait()


def _ticks_now() -> int:
    """Clock ticks since boot now, as /proc/PID/stat counts a start."""
    with open("/proc/uptime") as f:
        return int(float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK"))


def test_the_reaper_leaves_a_reused_pid_alone():
    other = _sleeper()
    try:
        from hostcheck.child import reaper

        reaper.kill_group(
            other.pid, runner.start_ticks(other.pid) - 1
        )  # the registered child started earlier
        assert _alive(other.pid)
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("killed", ["running", "before-the-child-is-registered"])
def test_children_end_when_their_hostcheck_is_sigkilled(tmp_path, killed):
    """A process that launches a child (and the child a grandchild in a session of its own), then dies by
    SIGKILL without cleaning up: its reaper kills both. Also when the SIGKILL lands between the fork and the
    line that registers the child with the reaper (on a loaded machine the child can run for a while first):
    that line is dropped here, and the launch's token, told before the fork, still finds both."""
    mark = os.urandom(8).hex()
    hung = tmp_path / "hung"
    hung.write_text("#!/bin/sh\nsetsid sleep 300 &\nexec sleep 300\n")
    hung.chmod(0o755)
    drop = killed != "running"
    code = f"""
import sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from hostcheck.child import launch
if {drop!r}:
    say = launch._REAPER.say
    launch._REAPER.say = lambda line: None if line.startswith("+ ") else say(line)
launch.run_child([{str(hung)!r}], timeout=300)
"""
    owner = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "REAPER_TEST": mark})

    def carriers() -> list[int]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if f"REAPER_TEST={mark}".encode() in env and cmd.startswith(b"sleep") and _alive(int(pid)):
                found.append(int(pid))
        return found

    try:
        deadline = time.monotonic() + 30
        while len(carriers()) < 2:
            assert time.monotonic() < deadline and owner.poll() is None, "the child never started"
            time.sleep(0.05)
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 5
        while carriers() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert carriers() == []
    finally:
        owner.kill()
        for pid in carriers():
            os.kill(pid, signal.SIGKILL)


def test_the_reaper_removes_a_registered_folder_unless_told_it_is_gone(tmp_path):
    from hostcheck.child import reaper

    kept, left = tmp_path / "kept", tmp_path / "left behind"
    for d in (kept, left):
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "record.jsonl").write_text("{}\n")
    (left / "link").symlink_to(kept)  # followed by nobody: what it points to stays
    lines = [f"d {os.fsencode(d).hex()}\n".encode() for d in (kept, left)] + [
        f"u {os.fsencode(kept).hex()}\n".encode()
    ]
    assert reaper.main(iter([*lines, b"d not-hex\n", b"d " + b"relative".hex().encode() + b"\n"])) == 0
    assert not left.exists() and (kept / "sub" / "record.jsonl").is_file()


def test_kill_all_waits_for_a_child_whose_start_was_under_way(monkeypatch):
    """SIGTERM while a worker thread has forked a child but not yet registered it: kill_all returns only once
    that thread has found the launcher closed and ended its child (the process may exit right after)."""
    import threading

    real_popen, forked, started = subprocess.Popen, threading.Event(), []

    def slow_popen(argv, **kwargs):
        p = real_popen(argv, **kwargs)
        if argv[0] != "sleep":  # the reaper
            return p
        started.append(p)
        forked.set()
        time.sleep(0.5)  # the thread is not scheduled for a while
        return p

    monkeypatch.setattr(runner.subprocess, "Popen", slow_popen)
    t = threading.Thread(target=lambda: runner.Launch().start(["sleep", "300"]), daemon=True)
    try:
        t.start()
        assert forked.wait(10)
        runner.kill_all()
        (p,) = started
        assert p.returncode is not None or not _alive(p.pid), "kill_all returned with the child still running"
    finally:
        runner.reopen()
        for p in started:
            p.kill()
            p.wait()


def test_the_private_pythonpath_folder_holds_only_hostcheck_and_goes_at_the_commands_end():
    """inside_argv's default root: a private folder made once per process (only a link to our package), removed
    by release_private_root (command.main's end), so a run leaves nothing in TMPDIR; the next child makes a new one."""
    from hostcheck.child import launch as L

    root = L.pythonpath_root()
    assert os.listdir(root) == ["hostcheck"] and L.pythonpath_root() == root  # once per process
    assert L.inside_argv("/py", "probe")[3] == root and L.inside_argv("/py", "probe", root="/r")[3] == "/r"
    folder = os.path.dirname(root)
    L.release_private_root()
    assert not os.path.exists(folder)
    L.release_private_root()  # nothing left: a no-op
    again = L.pythonpath_root()
    assert os.path.dirname(again) != folder and os.listdir(again) == ["hostcheck"]
    L.release_private_root()
    assert not os.path.exists(again)
