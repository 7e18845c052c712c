"""The progress line: on a terminal (a pty here, as a person's ssh session has) while a run takes longer than a
second, never in a pipe, a log, a --json or --summary run, or under Slurm."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hostcheck import progress as P

ROOT = Path(__file__).resolve().parents[2]
ERASE = "\r\x1b[K"


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("stream", "machine", "slurm", "env", "shown"),
    [
        (Tty(), False, False, {}, True),
        (io.StringIO(), False, False, {}, False),  # a pipe or a file
        (Tty(), True, False, {}, False),  # --json, --summary
        (Tty(), False, True, {}, False),  # --slurm-drain
        (Tty(), False, False, {"SLURM_JOB_ID": "42", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}, False),
        (Tty(), False, False, {"TERM": "dumb"}, False),
        (None, False, False, {}, False),  # standard error closed
    ],
)
def test_the_line_is_for_a_person_at_a_terminal_only(stream, machine, slurm, env, shown):
    assert P.wanted(stream, machine, slurm, env) is shown
    assert isinstance(P.progress("x", stream, machine, slurm, environ=env), P.Progress if shown else P.Quiet)


def test_what_the_line_says():
    now = [100.0]
    line = P.Progress(Tty(), "hostcheck bench", estimate_s=300, clock=lambda: now[0], width=80)
    line.begin("threads/train")
    line.note(3, 40)
    now[0] += 75
    assert line.line() == "hostcheck bench: threads/train  [3/40]  1 min 15 s of about 5 min 00 s"
    now[0] += 400
    assert line.line().endswith("7 min 55 s, longer than estimated")
    line.end("threads/train")
    limited = P.Progress(Tty(), "hostcheck", clock=lambda: now[0], width=80, limit_s=60)
    limited.begin("torch probe")
    limited.begin("DCGM")
    assert limited.line() == "hostcheck: torch probe, DCGM  0 s (ends by 1 min 00 s at the latest)"
    narrow = P.Progress(Tty(), "hostcheck", clock=lambda: now[0], width=30)
    narrow.begin("a step with a long name")
    assert len(narrow.line()) < 30


def test_durations():
    assert [P.duration(s) for s in (0, 4.4, 59.6, 61, 3599, 3600, 7322)] == [
        "0 s",
        "4 s",
        "1 min 00 s",
        "1 min 01 s",
        "59 min 59 s",
        "1 h 00 min",
        "2 h 02 min",
    ]


def test_a_short_run_draws_nothing_and_a_long_one_erases_its_line(monkeypatch):
    monkeypatch.setattr(P, "DELAY_S", 0.05)
    monkeypatch.setattr(P, "INTERVAL_S", 0.02)
    quick = Tty()
    with P.Progress(quick, "hostcheck"):
        pass
    assert quick.getvalue() == ""
    slow = Tty()
    with P.Progress(slow, "hostcheck") as line:
        line.begin("torch probe")
        time.sleep(0.2)
    text = slow.getvalue()
    assert text.count(ERASE + "hostcheck: torch probe") >= 2 and text.endswith(ERASE)


# --- the real command on a pseudo-terminal ----------------------------------------------------------------------


def run_on_pty(argv: list[str], env: dict[str, str], timeout: float = 120.0) -> tuple[int, str, str]:
    """``python -m hostcheck ARGV`` with standard error on a pty (a person's terminal) and standard output in a pipe:
    (exit code, what the terminal showed, what standard output got)."""
    main, sub = pty.openpty()
    p = subprocess.Popen(
        [sys.executable, "-m", "hostcheck", *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=sub,
        env=env,
        cwd=ROOT,
    )
    os.close(sub)
    shown = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(main, 65536)
                except OSError:  # the pty's other end closed: the run is over
                    break
                if not chunk:
                    break
                shown += chunk
            elif p.poll() is not None:
                break
        out = p.stdout.read().decode() if p.stdout else ""
        rc = p.wait(timeout=30)
    finally:
        os.close(main)
        if p.poll() is None:
            p.kill()
    return rc, shown.decode(errors="replace"), out


@pytest.fixture
def slow_python(tmp_path):
    """A training Python that takes three seconds to answer (then fails): the run lasts past the line's delay."""
    py = tmp_path / "python"
    py.write_text("#!/bin/sh\nsleep 3\nexit 1\n")
    py.chmod(0o755)
    return str(py)


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update({"PYTHONPATH": str(ROOT), "TERM": "xterm", **extra})
    return env


def base(tmp_path: Path, python: str) -> list[str]:
    return [
        "--only",
        "torch",
        "--python",
        python,
        "--facts-dir",
        str(tmp_path),
        "--state-file",
        str(tmp_path / "s"),
    ]


def test_a_long_run_on_a_terminal_shows_its_step_and_time_then_clears_the_line(tmp_path, slow_python):
    rc, shown, out = run_on_pty(base(tmp_path, slow_python), env_for(tmp_path))
    assert rc in (0, 1), shown
    assert ERASE + "hostcheck: torch probe  1 s (ends by 1 min 00 s at the latest)" in shown, repr(shown)
    assert ERASE + "hostcheck: torch probe  2 s" in shown, repr(shown)
    assert shown.endswith(ERASE), repr(shown[-200:])  # erased before the report: nothing of it is left behind
    assert (
        "hostcheck" in out and ERASE not in out and "\x1b" not in out
    )  # the report itself: no progress in it


@pytest.mark.parametrize(
    ("extra", "env"),
    [
        (["--json"], {}),
        (["--summary"], {}),
        ([], {"SLURM_JOB_ID": "7", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}),
        ([], {"TERM": "dumb"}),
    ],
)
def test_no_line_for_a_program_or_under_slurm(tmp_path, slow_python, extra, env):
    rc, shown, out = run_on_pty([*base(tmp_path, slow_python), *extra], env_for(tmp_path, **env))
    assert rc in (0, 1), shown
    assert "torch probe" not in shown and ERASE not in shown and ERASE not in out, repr(shown)


def test_no_line_when_standard_error_is_not_a_terminal(tmp_path, slow_python):
    p = subprocess.run(
        [sys.executable, "-m", "hostcheck", *base(tmp_path, slow_python)],
        capture_output=True,
        text=True,
        env=env_for(tmp_path),
        cwd=ROOT,
        timeout=120,
    )
    assert p.returncode in (0, 1) and p.stderr == "", p.stderr


def test_the_job_doctor_says_what_it_watches_for_and_how_it_ends_on_a_terminal_only(tmp_path):
    """The command's own output is the job's progress (a redrawn line would tear it): one line before it starts,
    on a terminal, not under Slurm."""
    argv = ["job", "--seconds", "1", "--grace", "2", "--", "sleep", "30"]
    rc, shown, _ = run_on_pty(argv, env_for(tmp_path))
    assert rc == 0, shown
    want = "hostcheck job: watching the command for 1 s (--seconds), then SIGINT and up to 2 s for it to stop"
    assert want in shown and "stopped at the end of its 1 s window" in shown, shown
    rc, shown, _ = run_on_pty(argv, env_for(tmp_path, SLURM_JOB_ID="9"))
    assert rc == 0 and "watching the command" not in shown and "window" in shown, shown
