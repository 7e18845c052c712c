"""The orchestrator's end of a long-lived worker (``python -m hostcheck.inside.bench_worker --serve '<json>'``).

A :class:`Server` is started in its own session (process group) with the environment, PYTHONPATH overlay or
``unshare`` wrapper of its variant; it prints a hello line once torch and PIL are imported, then answers one
JSON line per request line. Every wait has a deadline (select on the stdout pipe, a check every 0.2 s that
the process still lives: a dead server whose DataLoader workers still hold the pipe is seen as dead). What
can go wrong becomes a :class:`~hostcheck.child.launch.ProbeRun` with an error, the same value a one-shot
child gives: a timeout (the whole group killed), a crash (exit status or signal, the last stderr line), bad
JSON, a flood (a line longer than output.RECORDS_CAP, a stderr file past output.OUTPUT_CAP: stopped). stderr
goes to a temporary file, so a chatty child can never block on a full pipe. :meth:`close` ends
the server and anything left in its process group (orphaned DataLoader workers).

A server is started and ended through the one launcher (:class:`hostcheck.child.launch.Launch`): a session of
its own, the run token in its environment, tracked in the launcher's live registry, so
:func:`~hostcheck.child.launch.kill_all` (SIGINT/SIGTERM) kills it, its group and what carries the token, and
no server starts after it until :func:`~hostcheck.child.launch.reopen`. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import tempfile
import time
from typing import Any

from hostcheck.child import launch
from hostcheck.child.launch import ProbeRun, describe_rc, tail
from hostcheck.child.output import OUTPUT_CAP, RECORDS_CAP

#: How long a closed server may take to exit on its own before its process group is killed.
CLOSE_GRACE_S = 3.0
#: How long a server that closed its stdout gets to exit before it is killed.
EOF_GRACE_S = 2.0
_POLL_S = 0.2
_TAIL_BYTES = 64 * 1024


def describe_status(rc: int | None) -> str:
    return "still running" if rc is None else describe_rc(rc)


class Server:
    """One worker process serving one variant: :meth:`hello`, then :meth:`request` any number of times, then
    :meth:`close` (idempotent; also what ends it after a timeout, a crash or bad output)."""

    def __init__(self, argv: list[str], env: dict[str, str] | None, name: str = "", cwd: str = "/"):
        """Start ``argv`` (``env``: its whole environment, default the launcher's child_env) now."""
        self.name = name
        self.requests = 0
        #: Seconds from the start to the hello line (None until it came).
        self.startup_s: float | None = None
        #: How the process ended ("exit 0", "killed: timed out after 120 s", ...), None while it runs.
        self.ended: str | None = None
        self._t0 = time.monotonic()
        self._buf = b""
        self._tail = ""
        self._closed = False
        self._done = False
        self._err = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        self._launch = launch.Launch()
        self.proc: subprocess.Popen | None
        try:
            self.proc = self._launch.start(
                argv, env, cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, bufsize=0
            )
            if self.proc is None:
                self.ended = launch.NOT_STARTED
        except OSError as exc:
            self.proc = None
            self.ended = f"could not start {argv[0]}: {exc}"
        if self.proc is None:
            self._closed = True
            self._err.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def token(self) -> str:
        """The run token in its environment (hostcheck.child.launch.TOKEN_VAR): what it starts carries it too."""
        return self._launch.token

    # ------------------------------------------------------------------------------------- exchanges

    def hello(self, timeout: float) -> ProbeRun:
        """The start-up line (``{"event": "hello", "ok": ...}``) within ``timeout`` seconds of now."""
        run = self._exchange(None, timeout)
        if run.records:
            self.startup_s = time.monotonic() - self._t0
        return run

    def request(self, cfg: dict[str, Any], timeout: float) -> ProbeRun:
        """Send one measurement config; its answer within ``timeout`` seconds, or why there is none."""
        return self._exchange(json.dumps(cfg, sort_keys=True).encode() + b"\n", timeout)

    def _exchange(self, line: bytes | None, timeout: float) -> ProbeRun:
        t0 = time.monotonic()
        if self.proc is None or self._closed:
            return ProbeRun(name=self.name, error=f"the worker process is not running ({self.ended})")
        if line is not None:
            self.requests += 1
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(line)
            except OSError:  # it is gone: say how
                return self._dead(t0)
        answer, why = self._read_line(t0 + timeout)
        if answer is None and why == "timeout":
            self.close(0.0, f"killed: timed out after {timeout:g} s")
            return ProbeRun(
                name=self.name,
                error=f"timed out after {timeout:g} s and was killed",
                timed_out=True,
                wall_s=time.monotonic() - t0,
                stderr_tail=self._tail,
            )
        if answer is None and why == "flood":
            self.close(0.0, "killed: printed too much")
            return ProbeRun(
                name=self.name,
                error=f"printed a line longer than {RECORDS_CAP >> 20} MiB or more than "
                f"{OUTPUT_CAP >> 20} MiB to stderr, and was stopped",
                wall_s=time.monotonic() - t0,
                stderr_tail=self._tail,
            )
        if answer is None:
            return self._dead(t0)
        text = answer.decode("utf-8", "replace").strip()
        try:
            rec = json.loads(text)
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            self.close(0.0, "killed: bad JSON")
            return ProbeRun(
                name=self.name,
                error=f"bad JSON from the worker ({exc}): {text[:200]!r}",
                wall_s=time.monotonic() - t0,
                stderr_tail=self._tail,
            )
        stderr = "" if rec.get("ok") else self.stderr_tail()
        return ProbeRun(name=self.name, records=(rec,), wall_s=time.monotonic() - t0, stderr_tail=stderr)

    def _read_line(self, deadline: float) -> tuple[bytes | None, str]:
        """(one line, "") or (None, "timeout" | "eof" | "exited")."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None, "timeout"
            if len(self._buf) > RECORDS_CAP or self._stderr_size() > OUTPUT_CAP:
                return None, "flood"
            if poller.poll(min(left, _POLL_S) * 1000):
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None, "eof"
                self._buf += chunk
            elif self._exited():
                # Dead, but something it forked may still hold the pipe: take what is there, then stop.
                while poller.poll(0):
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        break
                    self._buf += chunk
                if b"\n" not in self._buf:
                    return None, "exited"
        line, _, self._buf = self._buf.partition(b"\n")
        return line, ""

    def _dead(self, t0: float) -> ProbeRun:
        """The server ended (or closed its stdout) without an answer: a crash, with its status and stderr."""
        end = time.monotonic() + EOF_GRACE_S
        while not self._exited() and time.monotonic() < end:
            time.sleep(0.02)
        self.close(0.0, "killed: closed its stdout but did not exit")
        rc = self.proc.returncode if self.proc else None
        error = f"crashed ({describe_status(rc)})" if rc != 0 else "exited (exit 0) without an answer"
        last = self._tail.strip().splitlines()[-1:] if self._tail.strip() else []
        if last and last[0].strip():
            error = f"{error}: {last[0].strip()[:300]}"
        return ProbeRun(
            name=self.name, error=error, rc=rc, wall_s=time.monotonic() - t0, stderr_tail=self._tail
        )

    # ---------------------------------------------------------------------------------------- ending

    def _exited(self) -> bool:
        """Whether the process has ended, without reaping it (its group is killed before it is reaped, so
        its id cannot have been reused by then)."""
        if self.proc is None or self.proc.returncode is not None:
            return True
        try:
            return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def end_input(self) -> None:
        """Close its stdin: an idle server exits (EOF); one in a request finishes it first."""
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def close(self, grace: float = CLOSE_GRACE_S, reason: str | None = None) -> None:
        """End it: stdin closed (not when ``grace`` is 0), up to ``grace`` seconds to exit, then SIGKILL to its
        whole process group (what is left of it: orphaned DataLoader workers, or the server itself), then reaped.
        ``ended`` is its exit status when it exited in time, else ``reason`` (default: killed after ``grace`` s)."""
        if self._done or self.proc is None:
            return
        self._closed = True  # no more requests; _done once it is reaped (a close cut short can be redone)
        if grace > 0:  # with no grace it is killed as it stands: an EOF now would race the kill
            self.end_input()
        end = time.monotonic() + grace
        while not self._exited() and time.monotonic() < end:
            time.sleep(0.02)
        exited = self._exited()
        # The launcher's end: its group killed (before the server is reaped), the server reaped, the token swept.
        if self._launch.end():
            reason = (
                f"{reason or 'killed'}; pid {self.proc.pid} did not die on SIGKILL (stuck in the kernel?)"
            )
        if self.proc.stdout is not None:
            with contextlib.suppress(OSError):
                self.proc.stdout.close()
        self._tail = self.stderr_tail()
        self._err.close()
        if exited:
            self.ended = describe_status(self.proc.returncode)
        else:
            self.ended = reason or f"killed: still running {grace:g} s after its stdin was closed"
        self._done = True

    def _stderr_size(self) -> int:
        try:
            return os.fstat(self._err.fileno()).st_size
        except (OSError, ValueError):
            return 0

    def stderr_tail(self) -> str:
        if self._err.closed:
            return self._tail
        try:
            size = self._err.seek(0, os.SEEK_END)
            self._err.seek(max(0, size - _TAIL_BYTES))
            return tail(self._err.read().decode("utf-8", "replace"))
        except (OSError, ValueError):
            return self._tail

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": self.pid,
            "startup_s": round(self.startup_s, 3) if self.startup_s is not None else None,
            "requests": self.requests,
            "ended": self.ended,
        }


def close_all(servers: list[Any], grace: float = CLOSE_GRACE_S, reason: str | None = None) -> None:
    """Close several servers together: every stdin first, so they exit in parallel. Interrupted (Ctrl-C
    while waiting), it kills every one of them at once before it lets the interrupt go on."""
    try:
        for s in servers:
            s.end_input()
        end = time.monotonic() + grace
        for s in servers:
            s.close(max(0.0, end - time.monotonic()), reason)
    except BaseException:
        for s in servers:
            s.close(0.0, "killed: interrupted")
        raise
