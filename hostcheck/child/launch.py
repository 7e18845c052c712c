"""Run probes in child processes with a hard timeout; turn every way a child can go wrong into a value.

A child runs in its own session (process group). At the timeout the whole group is killed with SIGKILL,
so a hung CUDA kernel or NCCL call, and any DataLoader workers it forked, cannot outlive the report.
Descendants that start a session of their own (torchrun starts every worker so) are found by a token in
their environment (``HOSTCHECK_RUN_TOKEN``, inherited from the child) and killed too.
Output goes to temporary files (no pipe can fill up and block the child), at most OUTPUT_CAP bytes each (a
child that writes more is stopped), and only its record lines and the tail of its stderr are read back. The
child reports by printing lines ``HOSTCHECK_WORKLOAD_JSON:{...}``; every such line is a record, so what a child
finished before it hung or crashed is kept.

:class:`Launch` is the one way a child starts (here, and for the long-lived workers of hostcheck.child.session):
each launch is tracked in a live registry until it ends, so :func:`kill_all` (SIGHUP/SIGINT/SIGTERM) reaches
every child, its group and what carries its token, and no child starts after it until :func:`reopen`. Each start
and end is also told to the run's reaper (hostcheck.child.reaper), a small process that kills what is left when
hostcheck dies without cleaning up (SIGKILL).

Code that runs in the training Python (hostcheck.inside) starts one way: :func:`inside_argv`, which runs
hostcheck.inside.<module> as ``python -m`` would, with a folder holding only a link to this hostcheck package
(:func:`pythonpath_root`) first on sys.path, so a training venv without hostcheck runs it and a venv with another
hostcheck runs ours (the folder hostcheck lives in may be a site-packages whose packages must not shadow the
training venv's). The job hook is the one exception: every Python of the user's job must load it, and the job's
command is the user's, so a sitecustomize folder goes first on the job's PYTHONPATH, through the same
:func:`inside_env` that puts a bench variant's PIL overlay first.

A signal that would raise in the main thread while it starts a child (between the fork and the registration,
where the exception would lose the child) is held until the child is registered (:func:`signal_held`).

Why one module: the live registry, the closed flag, the starts under way and the signal hold are one state that
:class:`Launch`, :func:`kill_all` and :func:`reopen` share; split, each part would reach into another's privates.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hostcheck.child import reaper
from hostcheck.child.output import OUTPUT_CAP, read_records, read_tail, written

# The one sweep (the reaper runs it too) and the token it looks for live in the reaper, which imports nothing.
from hostcheck.child.reaper import TOKEN_VAR, kill_by_token, start_ticks

MARKER = "HOSTCHECK_WORKLOAD_JSON:"
#: How long to wait for a killed child to go; one stuck in the kernel (D state) is left behind.
KILL_WAIT_S = 5.0
TAIL_LINES = 20
TAIL_CHARS = 2000


@dataclass(frozen=True)
class ProbeRun:
    """What one child process gave: its records, or why it gave none (error)."""

    name: str
    records: tuple[dict, ...] = ()
    #: None when the child exited 0 and every marker line parsed; otherwise a sentence saying what failed.
    error: str | None = None
    rc: int | None = None
    timed_out: bool = False
    wall_s: float = 0.0
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def data(self) -> dict:
        """The last record, or {}."""
        return self.records[-1] if self.records else {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "records": list(self.records),
            "error": self.error,
            "rc": self.rc,
            "timed_out": self.timed_out,
            "wall_s": round(self.wall_s, 3),
            "stderr_tail": self.stderr_tail,
        }


def tail(text: str, lines: int = TAIL_LINES, chars: int = TAIL_CHARS) -> str:
    out = "\n".join(text.rstrip().splitlines()[-lines:])
    return out[-chars:]


def parse_records(stdout: str, marker: str = MARKER) -> tuple[list[dict], str | None]:
    """Every marker line as a dict, and an error when a marker line is not a JSON object."""
    records: list[dict] = []
    bad: str | None = None
    for line in stdout.splitlines():
        if not line.startswith(marker):
            continue
        payload = line[len(marker) :]
        try:
            rec = json.loads(payload)
        except ValueError as exc:
            bad = f"bad JSON from the probe ({exc}): {payload[:200]!r}"
            continue
        if not isinstance(rec, dict):
            bad = f"bad JSON from the probe (not an object): {payload[:200]!r}"
            continue
        records.append(rec)
    return records, bad


def describe_rc(rc: int) -> str:
    """A child's return code in words: 'exit 3', 'killed by signal SIGKILL'."""
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit {rc}"


def kill_group(p: subprocess.Popen) -> None:
    """SIGKILL a child's process group (it leads one: every child starts a session of its own), then the
    child itself should the group kill have failed. The group goes first, before the child can be reaped, so
    its id cannot have been reused by then."""
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        os.killpg(p.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        p.kill()


def stop(p: subprocess.Popen, wait_s: float | None = None) -> bool:
    """:func:`kill_group`, then reap the child within ``wait_s`` seconds (default :data:`KILL_WAIT_S`); False
    when it did not die: stuck in the kernel (D state, a wedged GPU driver), it is left behind."""
    kill_group(p)
    try:
        p.wait(KILL_WAIT_S if wait_s is None else wait_s)
    except subprocess.TimeoutExpired:
        return False
    return True


def _outcome(
    name: str, rc: int | None, timed_out: bool, timeout: float, out: str, err: str, wall: float, marker: str
):
    records, bad = parse_records(out, marker)
    error: str | None = None
    if timed_out:
        error = f"timed out after {timeout:g} s and was killed"
    elif rc is not None and rc != 0:
        error = f"crashed ({describe_rc(rc)})"
    elif bad:
        error = bad
    elif not records:
        error = "exited 0 but printed no result"
    errtail = tail(err)
    if error and errtail and not timed_out:
        # The last line that says something: torchrun ends its error report with a rule of '='.
        said = [ln.strip() for ln in errtail.splitlines() if any(c.isalnum() for c in ln)]
        if said:
            error = f"{error}: {said[-1][:300]}"
    return ProbeRun(
        name=name,
        records=tuple(records),
        error=error,
        rc=rc,
        timed_out=timed_out,
        wall_s=wall,
        stderr_tail=errtail,
    )


def python_arg(value: str) -> str:
    """A --python value as children can run it: they start in /, so a relative path is made absolute, and
    a bare name (python3) is looked up on PATH now."""
    if os.sep in value:
        return os.path.abspath(value)
    return shutil.which(value) or value


def child_env(env_overrides: dict | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(env_overrides or {})
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    # NVML (nvidia-smi) numbers GPUs in PCI bus order; make CUDA's indices agree unless told otherwise.
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return env


#: The package whose modules run in the training Python.
INSIDE_PACKAGE = "hostcheck.inside"
_ROOT_LOCK = threading.Lock()
#: This process's private PYTHONPATH folder (pid, path), made at the first child that needs one.
_PRIVATE_ROOT: list[tuple[int, str]] = []


def pythonpath_root(workdir: str | None = None) -> str:
    """A folder holding only a link to our hostcheck package, for the training Python's PYTHONPATH: ``workdir``/
    pythonpath (the bench's work folder), or by default a private temporary folder made once per process and
    removed when it ends (by the reaper should it die). When no link can be made, the folder hostcheck lives in."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if workdir is None:
        with _ROOT_LOCK:
            if not _PRIVATE_ROOT or _PRIVATE_ROOT[0][0] != os.getpid():
                try:
                    folder = tempfile.mkdtemp(prefix="hostcheck-inside-")
                except OSError:
                    return os.path.dirname(pkg)
                remove_at_death(folder)
                atexit.register(_remove_root, folder)
                _PRIVATE_ROOT[:] = [(os.getpid(), folder)]
            workdir = _PRIVATE_ROOT[0][1]
    shim = os.path.join(workdir, "pythonpath")
    link = os.path.join(shim, "hostcheck")
    try:
        os.makedirs(shim, exist_ok=True)
        if os.path.islink(link) and os.readlink(link) == pkg:
            return shim
        with contextlib.suppress(FileNotFoundError):
            os.unlink(link)
        os.symlink(pkg, link)
        return shim
    except OSError:
        return os.path.dirname(pkg)


def _remove_root(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    removed(folder)


def release_private_root() -> None:
    """Remove this process's private PYTHONPATH folder now (the command's end: nothing it made may outlive the run;
    a later child makes a new one). At exit and at death (the reaper) it goes anyway."""
    with _ROOT_LOCK:
        if not _PRIVATE_ROOT or _PRIVATE_ROOT[0][0] != os.getpid():
            return
        folder = _PRIVATE_ROOT.pop()[1]
    _remove_root(folder)


def inside_module(module: str) -> str:
    """The dotted name of a module of hostcheck.inside ("workload" -> "hostcheck.inside.workload")."""
    return f"{INSIDE_PACKAGE}.{module}"


#: What the training Python runs first: our PYTHONPATH folder first on sys.path, then the module as ``-m`` runs it
#: (runpy: a package's __main__, relative imports, the module's spec for multiprocessing's spawn and forkserver,
#: which hand sys.path to their children). Not PYTHONPATH alone: a training Python behind a wrapper with -E or -I
#: ignores it.
BOOTSTRAP = (
    "import runpy, sys; sys.path.insert(0, sys.argv[1]); m = sys.argv[2]; del sys.argv[1:3]; "
    "runpy.run_module(m, run_name='__main__', alter_sys=True)"
)


def inside_argv(python: str, module: str, *args: str, root: str | None = None) -> list[str]:
    """The one way to start hostcheck.inside.``module`` in the training Python ``python``, with ``args``:
    :data:`BOOTSTRAP` with ``root`` (default :func:`pythonpath_root`), which runs it as ``python -m`` would. Under
    torchrun it goes after ``--no-python``, so every rank starts the same way."""
    return [python, "-c", BOOTSTRAP, root or pythonpath_root(), inside_module(module), *args]


def inside_env(
    env: dict[str, str] | None = None,
    first: Sequence[str | None] = (),
    root: str | None = None,
    hook: bool = False,
) -> dict[str, str]:
    """``env`` (default :func:`child_env`) with PYTHONPATH ``first`` (a PIL overlay, the job hook's sitecustomize
    folder), then ``root`` (a :func:`pythonpath_root`, for what the code starts in turn), then what it held.
    ``hook``: the environment of the user's job, which changes in nothing else."""
    out = dict(env) if env is not None else child_env()
    paths = [p for p in (*first, root, out.get("PYTHONPATH")) if p]
    out["PYTHONPATH"] = os.pathsep.join(paths)
    if not hook:
        out["PYTHONDONTWRITEBYTECODE"] = "1"
        out["PYTHONUNBUFFERED"] = "1"
    return out


class _Reaper:
    """This process's reaper (hostcheck.child.reaper), started at the first child; what it is told goes over its
    standard input, whose end of file (hostcheck gone, however) makes it kill what is still registered. When it
    cannot start or has gone, children run as before: only the SIGKILL case loses its safety net (a new reaper
    knows only the children started after it; after three failed starts, under tight limits, none is tried)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._owner = 0  # the pid that started it: a forked copy of hostcheck starts its own
        self._starts = 0

    def _start(self) -> subprocess.Popen | None:
        if not sys.executable or not os.path.isfile(reaper.__file__):
            return None
        try:
            return subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(reaper.__file__)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                # It needs nothing from the environment, and carries nothing of the run's (tests count those).
                env={},
                start_new_session=True,
            )
        except (OSError, ValueError, MemoryError, RuntimeError):
            return None

    def ensure(self) -> None:
        """Start the reaper now, before the child it must outlive hostcheck for."""
        with self._lock:
            if self._owner != os.getpid():
                self._proc, self._owner, self._starts = None, os.getpid(), 0
            if (self._proc is None or self._proc.poll() is not None) and self._starts < 3:
                self._starts += 1
                self._proc = self._start()

    def say(self, line: str) -> None:
        with self._lock:
            p = self._proc
            if p is None or p.stdin is None or self._owner != os.getpid():
                return
            try:
                p.stdin.write(line.encode("ascii") + b"\n")
                p.stdin.flush()
            except (OSError, ValueError):  # it died: the next start gets a new one
                with contextlib.suppress(OSError, ValueError):
                    p.stdin.close()
                self._proc = None


_REAPER = _Reaper()


def remove_at_death(folder: str) -> None:
    """Have the reaper remove ``folder`` (a private temporary folder this run made) should hostcheck die before it
    does so itself; :func:`removed` once it has."""
    _REAPER.ensure()
    _REAPER.say("d " + os.fsencode(os.path.abspath(folder)).hex())


def removed(folder: str) -> None:
    _REAPER.say("u " + os.fsencode(os.path.abspath(folder)).hex())


#: Every launch still running, by token. kill_all (a signal handler) ends them all.
_LIVE: dict[str, Launch] = {}
_LIVE_LOCK = threading.Lock()
#: Starts under way (between their check of _CLOSED and their registration), and kill_all's wait for them.
_STARTING = [0]
_STARTED = threading.Condition(_LIVE_LOCK)
#: Set by kill_all: a thread still running a suite must not start the next child after the run was ended.
_CLOSED = threading.Event()
#: Why a child asked for after kill_all was not started.
NOT_STARTED = "not started: the run was interrupted"


def reopen() -> None:
    """Allow launches again (a new run in the same process: the CLI's main, tests)."""
    _CLOSED.clear()


class _SignalHold:
    """The main thread between a child's fork and its registration, where an exception a signal handler raises
    (hostcheck.command's Signalled) would lose the child: Popen would never return it, kill_all would not know
    it, and it would outlive the run. A handler asks :func:`signal_held` first; a held signal is raised again
    (signal.raise_signal, so the same handler runs) as soon as the child is registered."""

    def __init__(self) -> None:
        self.active = False
        self.pending: int | None = None

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        if self.active or threading.current_thread() is not threading.main_thread():
            yield  # a thread's start is not interrupted by signals: kill_all waits for it (_STARTING)
            return
        self.active = True
        try:
            yield
        finally:
            self.active = False
            pending, self.pending = self.pending, None
            if pending is not None:
                signal.raise_signal(pending)


_HOLD = _SignalHold()


def signal_held(signum: int) -> bool:
    """For a signal handler that raises in the main thread: True when the main thread is starting a child (fork
    to registration); the signal is then kept and raised again once the child is registered, and the handler
    must return without raising."""
    if not _HOLD.active:
        return False
    _HOLD.pending = _HOLD.pending or signum
    return True


class Launch:
    """Children started together under one token, each in a session (process group) of its own, and tracked
    in the live registry from the first start until :meth:`end`, so that :func:`kill_all` reaches them, their
    groups and whatever carries the token. Every child hostcheck starts in the training Python starts through
    one: the one-shot children of :func:`run_children` and the long-lived workers of hostcheck.child.session."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex
        self.procs: list[subprocess.Popen] = []
        #: When the first child started (clock ticks since boot): what carries the token started no earlier.
        self.since: int | None = None

    def start(self, argv: Sequence[str], env: dict | None = None, cwd: str | None = None, **popen: Any):
        """Start ``argv`` (``env``: the whole environment, default :func:`child_env`; the token is added) in a
        new session, in ``cwd`` (default /); ``popen``: stdin, stdout, stderr, bufsize. The started
        ``subprocess.Popen``, or None when the launcher is closed (kill_all): then nothing is left running.
        Raises OSError when the program cannot be started."""
        with _HOLD.hold():  # the count of starts under way too: a signal between its two steps would leak it
            with _LIVE_LOCK:
                if _CLOSED.is_set():
                    return None
                _STARTING[0] += 1
            try:
                return self._start(argv, env, cwd, popen)
            finally:
                with _LIVE_LOCK:
                    _STARTING[0] -= 1
                    _STARTED.notify_all()

    def _start(self, argv: Sequence[str], env: dict | None, cwd: str | None, popen: dict[str, Any]):
        popen.setdefault("stdin", subprocess.DEVNULL)
        _REAPER.ensure()
        p = subprocess.Popen(
            list(argv),
            env={**(env if env is not None else child_env()), TOKEN_VAR: self.token},
            cwd=cwd or "/",
            start_new_session=True,
            **popen,
        )
        ticks = start_ticks(p.pid)
        if self.since is None:
            self.since = ticks
        with _LIVE_LOCK:
            refused = _CLOSED.is_set()  # kill_all ran while it started: it must not outlive the run
            if not refused:
                self.procs.append(p)
                _LIVE[self.token] = self
        if ticks is not None:
            _REAPER.say(f"+ {self.token} {p.pid} {ticks}")
        if refused:
            stop(p)
            self.sweep()
            return None
        return p

    def sweep(self) -> list[int]:
        """SIGKILL what carries the token (what left the children's groups: torchrun's workers); their pids."""
        return kill_by_token(self.token, self.since) if self.since is not None else []

    def kill(self) -> int:
        """SIGKILL every child's group and what carries the token, reaping nothing (safe in a signal handler
        while the owner's thread waits on them); how many processes were signalled."""
        n = 0
        for p in list(self.procs):
            if p.returncode is None:
                kill_group(p)
                n += 1
        return n + len(self.sweep())

    def end(self) -> list[int]:
        """Kill every child's group (what a finished child left in it too: orphaned DataLoader workers) and
        reap the child, sweep the token, leave the registry; the pids that did not die on SIGKILL."""
        stuck = [p.pid for p in self.procs if not stop(p)]
        self.sweep()
        with _LIVE_LOCK:
            if _LIVE.get(self.token) is self:
                del _LIVE[self.token]
        if self.procs and not stuck:  # one stuck in the kernel stays the reaper's to try again
            _REAPER.say(f"- {self.token}")
        return stuck


def kill_all() -> int:
    """SIGKILL every running launch (its process groups, then what carries its token) and refuse new ones
    until :func:`reopen`; how many processes were signalled. For SIGHUP/SIGINT/SIGTERM: the launches' own threads
    may never get to clean up.

    A child whose start was under way (forked, not yet registered) is not in the registry yet: its thread finds
    the launcher closed and ends it. kill_all waits for those threads (at most :data:`KILL_WAIT_S` + 1 s), since
    the process may exit right after it and take a thread that has not run yet with it."""
    with _LIVE_LOCK:
        _CLOSED.set()
        live = list(_LIVE.values())
        _LIVE.clear()
    killed = sum(launch.kill() for launch in live)
    with _STARTED:
        _STARTED.wait_for(lambda: _STARTING[0] == 0, timeout=KILL_WAIT_S + 1.0)
    return killed


def run_child(
    argv: Sequence[str],
    timeout: float,
    name: str = "",
    env: dict | None = None,
    cwd: str | None = None,
    marker: str = MARKER,
) -> ProbeRun:
    """Run argv in a new process group; kill the group at ``timeout`` seconds."""
    return run_children([list(argv)], timeout, name=name, envs=[env], cwd=cwd, marker=marker)[0]


def run_children(
    argvs: Sequence[Sequence[str]],
    timeout: float,
    name: str = "",
    envs: Sequence[dict | None] | None = None,
    cwd: str | None = None,
    grace_after_failure: float = 10.0,
    marker: str = MARKER,
) -> list[ProbeRun]:
    """Run several children together (e.g. one per rank) under one deadline.

    When one child fails, the others get ``grace_after_failure`` seconds before they are killed: a rank
    that crashed leaves its peers hung in a collective.
    """
    envs = list(envs) if envs is not None else [None] * len(argvs)
    if _CLOSED.is_set():
        return [ProbeRun(name=name, error=NOT_STARTED) for _ in argvs]
    launch = Launch()
    start = time.monotonic()
    deadline = start + timeout
    procs: list[subprocess.Popen | None] = []
    files = []
    spawn_errors: list[str | None] = []
    stack = contextlib.ExitStack()
    # From the first start on, whatever ends this call (a signal's exception too) ends the launch first.
    try:
        for argv, env in zip(argvs, envs):
            fo = stack.enter_context(tempfile.TemporaryFile())  # noqa: SIM115 (closed by the stack)
            fe = stack.enter_context(tempfile.TemporaryFile())  # noqa: SIM115 (closed by the stack)
            files.append((fo, fe))
            try:
                p = launch.start(argv, env, cwd, stdout=fo, stderr=fe)
                procs.append(p)
                spawn_errors.append(None if p is not None else NOT_STARTED)
            except OSError as exc:
                procs.append(None)
                spawn_errors.append(f"could not start {argv[0]}: {exc}")
        timed_out, flooded = [False] * len(procs), [False] * len(procs)
        unkillable = [False] * len(procs)
        ends: list[float | None] = [None] * len(procs)
        peer_failed = any(spawn_errors)
        if peer_failed:
            deadline = min(deadline, time.monotonic() + grace_after_failure)
        while True:
            now = time.monotonic()
            running = False
            for i, p in enumerate(procs):
                if p is None or ends[i] is not None:
                    continue
                rc = p.poll()
                if rc is None and written(files[i]) > OUTPUT_CAP:  # a flood: stopped, a failed child
                    flooded[i], unkillable[i] = True, not stop(p)
                    rc = -9 if p.returncode is None else p.returncode
                if rc is None:
                    running = True
                    continue
                ends[i] = now
                if rc != 0:
                    peer_failed = True
                    deadline = min(deadline, now + grace_after_failure)
            if not running:
                break
            if now >= deadline:
                for i, p in enumerate(procs):
                    if p is not None and ends[i] is None:
                        timed_out[i] = True
                        # One stuck in the kernel (a wedged GPU driver) is left behind.
                        unkillable[i] = not stop(p)
                        ends[i] = time.monotonic()
                break
            time.sleep(0.02)
        # Reap anything a finished child left in its group (orphaned DataLoader workers, for one); what
        # left the group (torchrun's workers, each in a session of its own) is swept by token below.
        for p in procs:
            if p is not None:
                kill_group(p)
        runs = []
        for i, p in enumerate(procs):
            fo, fe = files[i]
            nm = name if len(procs) == 1 else f"{name}[{i}]"
            if p is None:
                runs.append(ProbeRun(name=nm, error=spawn_errors[i]))
                continue
            wall = (ends[i] or time.monotonic()) - start
            out, err = read_records(fo, marker), read_tail(fe)
            run = _outcome(nm, p.returncode, timed_out[i], timeout, out, err, wall, marker)
            if flooded[i]:
                run = replace(run, error=f"printed more than {OUTPUT_CAP >> 20} MiB and was stopped")
            if timed_out[i] and peer_failed and wall < timeout:
                run = replace(run, error=f"killed {grace_after_failure:g} s after a peer process failed")
            if unkillable[i]:
                run = replace(
                    run,
                    error=f"{run.error}; pid {p.pid} did not die on SIGKILL within {KILL_WAIT_S:g} s "
                    "(stuck in the kernel: a wedged GPU driver?)",
                )
            runs.append(run)
        return runs
    finally:
        launch.end()
        stack.close()


def free_port() -> int:
    """A TCP port on the loopback interface that was free a moment ago (for MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
