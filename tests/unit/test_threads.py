"""Starting a thread (hostcheck.registry.Thread): never a wait without end on a thread that died before it ran.

threading.Thread.start waits, without a limit, for the new thread to set its ``_started`` event. Under a small
address-space limit (ulimit -v) the new thread can get its stack, then fail its first allocation: CPython's
``thread_run`` calls the thread's ``_bootstrap``, that call raises MemoryError before ``_started.set()``, the
interpreter prints "Exception ignored in thread started by" and the thread ends, leaving its starter waiting
for good (CPython issue gh-140746, https://github.com/python/cpython/issues/140746; seen here as hostcheck
still running after 60 s under ``ulimit -v`` = footprint + 16 MiB). The fakes below make ``_bootstrap`` fail the
same way, before any of threading's own code runs. Each runs in a Python of its own: on a start that waits
without end the test fails at its timeout instead of hanging the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from hostcheck import gather
from hostcheck.registry import Thread, ThreadStartError, Timer, call_with_timeout

REPO = Path(__file__).resolve().parents[2]

#: The new thread's bootstrap fails as thread_run's call of it does when no memory is left (the fault planted),
#: or only after a while (a thread that is slow to be scheduled: it must be waited for, not given up on).
BOOTSTRAP = """\
import threading, time
from hostcheck import registry

_real = threading.Thread._bootstrap


def dies(self):
    raise MemoryError


def slow(self):
    time.sleep(0.5)
    _real(self)


def planted(kind):
    registry.Thread._bootstrap = {"dies": dies, "slow": slow}[kind]
"""


def _run(body: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    code = BOOTSTRAP + textwrap.dedent(body)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
    )


def test_a_thread_that_dies_before_it_runs_is_an_error_at_once_not_a_hang():
    t0 = time.monotonic()
    p = _run(
        """
        planted("dies")
        finished, value = registry.call_with_timeout(lambda: "ran", 30)
        print(finished, type(value).__name__, value)
        """
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("True ThreadStartError can't start new thread: it ended before it ran"), (
        p.stdout
    )
    assert time.monotonic() - t0 < 20  # the thread's end is seen, not the 30 s timeout


def test_a_thread_slow_to_start_is_waited_for():
    p = _run(
        """
        planted("slow")
        print(registry.call_with_timeout(lambda: "ran", 30))
        """
    )
    assert p.returncode == 0 and p.stdout.strip() == "(True, 'ran')", (p.stdout, p.stderr)


def test_without_a_view_of_the_threads_a_start_gives_up_after_its_limit():
    """/proc/self/task unreadable (no descriptor left): the dead thread cannot be seen going; the start ends at
    START_BLIND_S instead. A thread that runs is not cut short by it."""
    p = _run(
        """
        registry.TASKS_DIR = "/nonexistent"
        registry.START_BLIND_S = 1.0
        print(registry.call_with_timeout(lambda: "ran", 30))
        planted("dies")
        t0 = time.monotonic()
        finished, value = registry.call_with_timeout(lambda: "ran", 30)
        print(finished, type(value).__name__, value, time.monotonic() - t0 < 10)
        """
    )
    assert p.returncode == 0, p.stderr
    ran, dead = p.stdout.splitlines()
    assert ran == "(True, 'ran')"
    assert dead == "True ThreadStartError can't start new thread: not running 1 s after its start True"


def test_a_thread_that_cannot_be_created_is_a_thread_start_error(monkeypatch):
    def refused(*args, **kwargs):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading, "_start_new_thread", refused)
    finished, value = call_with_timeout(lambda: "ran", 5)
    assert finished and isinstance(value, ThreadStartError) and str(value) == "can't start new thread"
    with pytest.raises(ThreadStartError):
        Timer(60, lambda: None).start()


def test_threads_and_timers_still_run_join_and_refuse_a_second_start():
    box = []
    t = Thread(target=lambda: box.append("ran"), daemon=True)
    t.start()
    t.join(10)
    assert box == ["ran"] and not t.is_alive()
    with pytest.raises(RuntimeError, match="only be started once"):
        t.start()
    fired = threading.Event()
    timer = Timer(0.01, fired.set)
    timer.start()
    assert fired.wait(10)


def test_a_gatherer_whose_thread_cannot_start_runs_in_the_callers_thread(monkeypatch):
    """gather starts the torch probe and the workload beside the rest; with no thread to be had each runs in
    the caller's thread, so its own gathering says why it failed instead of the whole run crashing."""

    def refused(self):
        raise ThreadStartError("can't start new thread")

    monkeypatch.setattr(gather.Thread, "start", refused)
    ran, threads = [], []
    gather._beside(lambda: ran.append(threading.current_thread()), threads)
    assert ran == [threading.current_thread()] and threads == []
    monkeypatch.undo()
    gather._beside(lambda: ran.append(threading.current_thread()), threads)
    threads[0].join(10)
    assert ran[1] is threads[0]


def test_every_thread_of_hostcheck_starts_through_the_registry():
    """A plain threading.Thread or Timer would bring back the start that waits without end."""
    found = []
    for path in sorted((REPO / "hostcheck").rglob("*.py")):
        if path.name == "registry.py" or "inside" in path.parts:  # inside: the training Python's code
            continue
        text = path.read_text()
        found += [
            f"{path}: {w}"
            for w in ("threading.Thread", "threading.Timer", "from threading import")
            if w in text
        ]
    assert found == []
