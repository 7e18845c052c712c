"""The one bounded way to run a tool (gather.base.Tool, run_cmd), the one strict number parser (parse_int,
parse_number), a gatherer's parts on their own (guarded), reads confined to the host root (outside_root), and the
one atomic writer's lock, owner and leftovers (outfile). Real processes and real files, no mocks."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from hostcheck import outfile
from hostcheck.gather import base
from hostcheck.gather.base import (
    CRASHED,
    ERROR,
    TIMEOUT,
    CmdResult,
    Tool,
    Unavailable,
    guarded,
    list_dir,
    outside_root,
    parse_int,
    parse_number,
    read_text,
    run_cmd,
    under,
)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


# --- one bounded runner ---------------------------------------------------------------------------------------


def test_a_tool_that_prints_a_gigabyte_is_stopped_at_the_cap_and_costs_no_more_memory(tmp_path):
    """1 GB on stdout: stopped once past the cap, its group killed, and the reading process grew by about the cap
    (the VmHWM of a child that runs run_cmd: its own high-water mark; ru_maxrss would carry this process's over
    fork and exec)."""
    code = (
        "from hostcheck.gather.base import run_cmd\n"
        "r = run_cmd(['sh', '-c', 'head -c 1000000000 /dev/zero'], 60)\n"
        "print(r.reason); print(next(ln.split()[1] for ln in open('/proc/self/status') if ln.startswith('VmHWM')))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(base.__file__).rsplit("/hostcheck/", 1)[0]}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    reason, rss_kib = out.stdout.splitlines()
    assert reason == f"sh printed more than {base.OUTPUT_CAP} bytes: stopped, its output not used"
    assert int(rss_kib) < 64 * 1024, f"peak RSS {int(rss_kib) >> 10} MiB for a 1 GB output"


def test_a_tool_that_prints_for_ever_is_stopped_and_its_group_with_it(tmp_path):
    pidfile = tmp_path / "pid"
    t0 = time.monotonic()
    r = run_cmd(["sh", "-c", f"sleep 300 & echo $! > {pidfile}; exec yes"], 30)
    assert isinstance(r, Unavailable) and r.kind == ERROR and "printed more than" in r.reason
    assert time.monotonic() - t0 < 20
    deadline = time.monotonic() + 5
    while not _gone(int(pidfile.read_text())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(int(pidfile.read_text())), "what the tool started outlived it"


def test_tail_keeps_the_last_part_of_each_stream_whole_lines_and_says_it_was_cut():
    r = run_cmd(["sh", "-c", "seq 1 300000; echo done >&2"], 30, limit=4096, tail=True)
    assert isinstance(r, CmdResult) and r.cut and r.rc == 0
    lines = r.stdout.splitlines()
    assert lines[-1] == "300000" and len(r.stdout) <= 4096
    assert [int(x) for x in lines] == list(range(int(lines[0]), 300001))  # no line cut in two
    whole = run_cmd(["sh", "-c", "seq 1 10"], 30, limit=4096, tail=True)
    assert (
        isinstance(whole, CmdResult)
        and not whole.cut
        and whole.stdout.split() == [str(i) for i in range(1, 11)]
    )


def test_at_the_cap_exactly_is_read_one_byte_more_is_stopped():
    assert isinstance(run_cmd(["sh", "-c", "head -c 1000 /dev/zero"], 10, limit=1000), CmdResult)
    assert isinstance(run_cmd(["sh", "-c", "head -c 1001 /dev/zero"], 10, limit=1000), Unavailable)


def test_a_tool_that_closes_its_output_and_runs_on_is_a_timeout():
    t0 = time.monotonic()
    r = run_cmd(["sh", "-c", "exec >&- 2>&-; sleep 300"], 1)
    assert isinstance(r, Unavailable) and r.kind == TIMEOUT and time.monotonic() - t0 < 10


def test_a_background_tool_never_writes_to_our_streams(capfd):
    """A server started for its client (ib_write_bw's): what it prints is read here, bounded, never on hostcheck's
    stdout or stderr; stopping it kills it and gives what it said."""
    tool = Tool(["sh", "-c", "echo banner; echo warn >&2; exec sleep 300"])
    assert tool.started
    tool.read(1.0)
    pid = tool.proc.pid
    said = tool.stop()
    assert isinstance(said, CmdResult) and said.stdout == "banner\n" and said.stderr == "warn\n"
    assert _gone(pid)
    out, err = capfd.readouterr()
    assert "banner" not in out + err and "warn" not in out + err


def test_a_streaming_reader_takes_what_came_and_the_cap_counts_what_was_taken():
    tool = Tool(["sh", "-c", "echo one; sleep 0.3; echo two; exec sleep 300"], limit=64, merge=True)
    got = b""
    end = time.monotonic() + 10
    while b"two" not in got and time.monotonic() < end:
        tool.read(0.1)
        got += tool.take()
    assert got == b"one\ntwo\n" and tool.total == 8 and not tool.over
    tool.close()


def test_a_tool_that_is_missing_or_not_executable_is_a_value(tmp_path):
    assert run_cmd(["hostcheck-no-such-tool"], 1).kind == "not_installed"
    p = tmp_path / "tool"
    p.write_text("#!/bin/sh\n")
    assert run_cmd([str(p)], 1).kind == ERROR  # not executable


# --- one strict number parser ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, kw, want",
    [
        ("42\n", {}, 42),
        (" 7 ", {}, 7),
        ("\u00b2", {}, None),  # superscript two: str.isdigit() says yes, int() raises
        ("\u0663", {}, None),  # Arabic-Indic three: int() reads 3
        ("\uff11", {}, None),  # fullwidth one
        ("-1", {}, None),
        ("-1", {"signed": True}, -1),
        ("--1", {"signed": True}, None),
        ("1" * 19, {}, int("1" * 19)),
        ("1" * 20, {}, None),
        ("12345", {"digits": 4}, None),
        ("0x10", {}, None),
        ("1_000", {}, None),
        ("", {}, None),
        (None, {}, None),
        (12, {}, None),
    ],
)
def test_parse_int_takes_ascii_digits_only(text, kw, want):
    assert parse_int(text, **kw) == want


@pytest.mark.parametrize(
    "text, want",
    [
        ("391.62", 391.62),
        ("0.250", 0.25),
        ("-1", -1.0),
        ("1e3", 1000.0),
        ("\u0663.5", None),
        ("inf", None),
        ("nan", None),
        ("1e999", None),
        ("N/A", None),
        ("", None),
    ],
)
def test_parse_number_takes_ascii_decimals_only(text, want):
    assert parse_number(text) == want


def test_guarded_turns_one_part_s_crash_into_that_part_s_value():
    assert guarded("x", lambda: 5) == 5
    got = guarded("the NVMe drives", lambda: int("\u00b2"))
    assert (
        isinstance(got, Unavailable)
        and got.kind == CRASHED
        and got.reason.startswith("reading the NVMe drives")
    )


# --- the host root --------------------------------------------------------------------------------------------


def test_reads_under_a_host_root_never_follow_a_link_out_of_it(tmp_path):
    root = tmp_path / "host"
    (root / "sys/a").mkdir(parents=True)
    (root / "sys/a/inside").write_text("1\n")
    (tmp_path / "outside").write_text("5\n")
    (root / "sys/a/rel").symlink_to("inside")  # a link within the tree: followed
    (root / "sys/a/abs_in").symlink_to(root / "sys/a/inside")
    (root / "sys/a/out").symlink_to(tmp_path / "outside")
    (root / "sys/a/up").symlink_to("../../../outside")
    (root / "sys/a/zero").symlink_to("/dev/zero")
    (root / "proc").symlink_to("/proc")
    base_dir = under(str(root), "sys/a")
    assert read_text(os.path.join(base_dir, "rel")) == "1\n" == read_text(os.path.join(base_dir, "abs_in"))
    for name in ("out", "up", "zero"):
        got = read_text(os.path.join(base_dir, name))
        assert isinstance(got, Unavailable) and "outside the host root" in got.reason, name
    got = list_dir(under(str(root), "proc"))
    assert isinstance(got, Unavailable) and "outside the host root" in got.reason
    assert outside_root("/etc/hostname") is None  # not under a host root: the node's own /


def test_a_bridge_s_config_space_linked_out_of_the_host_root_is_not_read(tmp_path):
    """ACS is read from a bridge's config space with the raw reader: the same confinement holds there."""
    from hostcheck.gather.rdma import read_acs

    bridge = tmp_path / "host/sys/bus/pci/devices/0000:15:01.0"
    bridge.mkdir(parents=True)
    (tmp_path / "config").write_bytes(b"\0" * 4096)
    (bridge / "config").symlink_to(tmp_path / "config")
    acs = read_acs(str(tmp_path / "host"), "0000:15:01.0")
    assert acs.enabled is None and "outside the host root" in acs.why


# --- the one atomic writer -----------------------------------------------------------------------------------


def test_write_atomic_keeps_owner_and_mode_when_told(tmp_path):
    p = tmp_path / "h.toml"
    p.write_text("old")
    p.chmod(0o640)
    if os.geteuid() == 0:
        os.chown(p, 65534, 65534)
    outfile.write_atomic(str(p), "new", keep=True)
    st = os.stat(p)
    assert p.read_text() == "new" and st.st_mode & 0o777 == 0o640
    assert st.st_uid == (65534 if os.geteuid() == 0 else os.geteuid())
    outfile.write_atomic(str(p), "report")  # a report: 0644 whatever it was
    assert os.stat(p).st_mode & 0o777 == 0o644
    assert sorted(os.listdir(tmp_path)) == ["h.toml"]


def test_an_interrupted_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    def interrupted(src, dst):
        raise KeyboardInterrupt  # SIGTERM, as hostcheck.command raises it, between the write and the rename

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        outfile.write_atomic(str(tmp_path / "state.json"), "{}")
    assert os.listdir(tmp_path) == []


def test_leftovers_of_a_dead_writer_go_those_of_a_live_one_and_others_stay(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    live = subprocess.Popen(["sleep", "30"])
    try:
        names = {
            f".h.toml.hostcheck-{dead.pid}-0123456789ab.tmp": False,
            f".h.toml.hostcheck-{live.pid}-0123456789ab.tmp": True,
            f".other.toml.hostcheck-{dead.pid}-0123456789ab.tmp": True,  # another file's
            "h.toml.tmp": True,  # not ours
        }
        for n in names:
            (tmp_path / n).write_text("x")
        assert outfile.remove_leftovers(str(tmp_path / "h.toml")) == [next(iter(names))]
        assert {n: (tmp_path / n).exists() for n in names} == names
    finally:
        live.kill()
        live.wait()


def test_the_folder_lock_makes_a_second_writer_wait_and_gives_up_after_its_limit(tmp_path):
    path = str(tmp_path / "h.toml")
    order: list[str] = []

    def second() -> None:
        with outfile.locked(path):
            order.append("second")

    with outfile.locked(path):
        t = threading.Thread(target=second)
        t.start()
        time.sleep(0.3)
        order.append("first done")
    t.join(5)
    assert order == ["first done", "second"]
    with (
        outfile.locked(path),
        pytest.raises(OSError, match="another hostcheck run"),
        outfile.locked(path, 0.2),
    ):
        pass
