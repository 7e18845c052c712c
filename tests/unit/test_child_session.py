"""hostcheck.child.session's Server goes through the one launcher (hostcheck.child.launch): the run token in
its environment, tracked in the live registry, so kill_all() (SIGINT/SIGTERM) ends it, its group and what
left the group, and refuses new ones until reopen(). Tiny Python servers, no torch needed."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time

import pytest

from hostcheck.child import launch
from hostcheck.child.session import Server

#: Serves one JSON line per input line; before its hello it starts a sleeper in a session of its own (as
#: torchrun starts its workers: out of reach of a group kill) and says its pid.
SERVER = textwrap.dedent(
    """
    import json, subprocess, sys, time
    g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    print(json.dumps({"event": "hello", "ok": True, "grandchild": g.pid}), flush=True)
    for line in sys.stdin:
        print(json.dumps({"ok": True, "echo": json.loads(line)}), flush=True)
    """
)


@pytest.fixture(autouse=True)
def _reopened():
    """kill_all() closes the launcher for the whole process: every test leaves it open again."""
    launch.reopen()
    yield
    launch.reopen()


def _server(tmp_path, name: str = "s") -> Server:
    path = tmp_path / "server.py"
    path.write_text(SERVER)
    return Server([sys.executable, str(path)], launch.child_env(), name)


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):  # killed; waiting to be reaped
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _carried_within(token: str, pids: set[int], seconds: float = 5.0) -> bool:
    """Whether every pid carries the token within ``seconds`` (a process just started, on a loaded machine)."""
    deadline = time.monotonic() + seconds
    while not pids <= set(_carrying(token)):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _carrying(token: str) -> list[int]:
    """Live processes of ours whose environment holds the token."""
    needle = f"{launch.TOKEN_VAR}={token}".encode()
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{d}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env.split(b"\0") and state not in ("Z", "X"):
            found.append(int(d))
    return found


def test_a_server_carries_the_run_token_and_its_close_sweeps_it(tmp_path):
    s = _server(tmp_path)
    try:
        hello = s.hello(20)
        assert hello.ok, hello.error
        token = s.token
        assert _carried_within(token, {s.pid, hello.data["grandchild"]})
        echo = s.request({"x": 1}, 20)
        assert echo.ok and echo.data == {"ok": True, "echo": {"x": 1}}
    finally:
        s.close()
    assert s.ended == "exit 0"
    # Closed: what it left outside its group (the grandchild) swept by its token, and out of the registry.
    assert _gone_within(hello.data["grandchild"], 5.0) and _carrying(token) == []
    assert launch.kill_all() == 0


def test_kill_all_ends_a_server_its_group_and_what_left_it(tmp_path):
    s = _server(tmp_path)
    try:
        hello = s.hello(20)
        assert hello.ok, hello.error
        token, grandchild = s.token, hello.data["grandchild"]
        assert launch.kill_all() >= 2  # the server, and the grandchild found by its token
        assert _gone_within(s.pid, 5.0), "the server outlived kill_all()"
        assert _gone_within(grandchild, 5.0), "its grandchild in a session of its own outlived kill_all()"
        assert _carrying(token) == []
        run = s.request({"x": 1}, 5)
        assert not run.ok and "SIGKILL" in run.error
    finally:
        s.close()
    assert s.ended == "killed by signal SIGKILL"


def test_no_server_starts_after_kill_all_until_reopen(tmp_path):
    launch.kill_all()
    s = _server(tmp_path)
    assert s.proc is None and s.pid is None and s.ended == launch.NOT_STARTED
    run = s.hello(5)
    assert not run.ok and "not started: the run was interrupted" in run.error
    s.close()  # nothing to end
    assert launch.kill_all() == 0
    # One-shot children are refused the same way.
    assert launch.run_child([sys.executable, "-c", "pass"], 5).error == launch.NOT_STARTED
    launch.reopen()
    s = _server(tmp_path)
    try:
        assert s.hello(20).ok
    finally:
        s.close()
    assert s.ended == "exit 0"


def test_a_server_that_cannot_start_is_an_error_not_an_exception(tmp_path):
    s = Server([str(tmp_path / "no-such-python")], None, "missing")
    assert s.proc is None and s.ended.startswith("could not start")
    assert "could not start" in s.hello(5).error
    assert launch.kill_all() == 0  # nothing registered


def test_kill_all_reaches_one_shot_children_and_servers_alike(tmp_path):
    """One registry: a run_child in another thread and a server, both ended by one kill_all()."""
    import threading

    pidfile = tmp_path / "child.pid"
    code = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    got = []
    t = threading.Thread(target=lambda: got.append(launch.run_child([sys.executable, "-c", code], 60)))
    t.start()
    s = _server(tmp_path)
    try:
        assert s.hello(20).ok
        deadline = time.monotonic() + 20
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.02)
        t0 = time.monotonic()
        launch.kill_all()
        t.join(10)
        assert not t.is_alive() and time.monotonic() - t0 < 5
        assert got[0].error == "crashed (killed by signal SIGKILL)", got[0]
        assert _gone_within(int(pidfile.read_text()), 5.0) and _gone_within(s.pid, 5.0)
    finally:
        s.close()
    assert json.dumps(s.info())
