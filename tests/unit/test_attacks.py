"""Attacks on the real command line: hostcheck never clobbers, never leaks a process, never hangs, never lies on
bad input (the hardening issue's list of attacks, one row each).

Each attack runs ``python -m hostcheck ...`` as a subprocess, under a time limit, in a fresh folder of its own
that holds its facts folder (``--facts-dir``), its environment file (``--env-file``), its TMPDIR and its HOME.
Every one must:

- end with exit 0, 1 or 2 (129 / 130 / 143 for SIGHUP / SIGINT / SIGTERM, killed for SIGKILL), or the narrower
  set its row names;
- print no Python traceback on stdout or stderr;
- leave no process behind: each run carries a marker of its own in its environment (``HOSTCHECK_ATTACK=<uuid>``),
  which everything it starts inherits, and no live process may carry it once the run is over;
- touch no file of its folder other than the report paths its row declares and its state folder (``state/``, where
  ``--state-file`` keeps the hardware counters between runs) (a listing with types, sizes, modes, inodes and
  mtimes, before and after), and leave /dev/full and /dev/zero character devices.

Where torch is not the point, the training Python is a tiny fake one (this interpreter with ``-S``: the real
probe, no site-packages, so no torch and no PIL) and the checks are ``--quick --only system,tuning``: a run
takes well under a second.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import xmlschema

REPO = Path(__file__).resolve().parents[2]
TRACEBACK = "Traceback (most recent call last)"
MARKER_VAR = "HOSTCHECK_ATTACK"
#: Per run: generous, the machine may be busy. An attack that needs longer is a hang.
RUN_TIMEOUT = 60.0
#: How long the processes a run started may take to disappear after it ended (SIGKILLed, then reaped).
GONE_WAIT = 5.0
ANY = (0, 1, 2)
USAGE = (2,)
JUDGED = (0, 1)
NOBODY = ("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups")


# --- the folder an attack runs in -----------------------------------------------------------------------


@dataclass
class Ctx:
    """One attack's folder and what is in it before the run."""

    root: Path
    interp: str  # the Python that runs hostcheck
    marker: str
    user: str | None = None

    def __post_init__(self) -> None:
        for d in ("facts", "tmp", "home"):
            (self.root / d).mkdir()
        self.facts = self.root / "facts"
        self.tmp = self.root / "tmp"
        self.home = self.root / "home"
        self.env_file = self.root / "training.env"
        self.env_file.write_text("OMP_NUM_THREADS=2\n")
        # The hardware counters between runs: in the folder, never in the machine's /var/lib/hostcheck.
        self.state = self.root / "state" / "state.json"
        # The tiny training Python: the real probe runs in it, without site-packages (no torch, no PIL).
        self.python = self.script("python", f'exec {self.interp} -S "$@"\n')

    def p(self, name: str) -> str:
        return str(self.root / name)

    def script(self, name: str, body: str) -> str:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
        return str(path)

    def fact(self, role: str, text: str | bytes) -> None:
        path = self.facts / f"{role}.fact"
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)

    def fake_torch(self, source: str) -> str:
        """A training Python whose ``import torch`` runs ``source`` (a package on its PYTHONPATH)."""
        pkg = self.root / "faketorch" / "torch"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(source)
        return self.script("torchpython", f'PYTHONPATH={pkg.parent} exec {self.interp} -S "$@"\n')

    def base(
        self,
        *extra: str,
        only: str | None = "system,tuning",
        python: str | None = None,
        env_file: bool = True,
        json_out: bool = False,
        state: str | None = None,
    ) -> list[str]:
        """check's options for a quick run against this folder, then ``extra``."""
        argv = ["--quick", "--facts-dir", str(self.facts), "--python", python or self.python]
        argv += ["--state-file", state or str(self.state)]
        if only:
            argv += ["--only", only]
        if env_file:
            argv += ["--env-file", str(self.env_file)]
        if json_out:
            argv.append("--json")
        return [*argv, *extra]


@dataclass
class Run:
    """How to run one attack, and what it may do."""

    argv: list[str]
    codes: tuple[int, ...] = ANY
    #: Environment changes for the hostcheck process; None removes the variable.
    env: dict[str, str | None] = field(default_factory=dict)
    #: Paths (in the folder) the run may create, change or replace: its reports. A folder: all under it.
    reports: tuple[str, ...] = ()
    #: In stderr (when stderr is read).
    needle: str = ""
    stdout: str = "pipe"  # pipe, closed, devfull, broken (a pipe whose reader already left)
    stderr: str = "pipe"  # pipe, closed
    stdin: str = "devnull"  # devnull, closed
    limits: dict[int, int] = field(default_factory=dict)
    #: Sent once two ``sleep`` processes carry the run's marker (the hung fake Python and its grandchild), or,
    #: with ``signal_when="handling"``, once hostcheck has installed its signal handlers (a run with no child).
    signal: int | None = None
    signal_when: str = "sleeping"
    #: A FIFO (in the folder) that a reader holds open through the run; what it got is Outcome.fifo.
    fifo_reader: str | None = None
    copies: int = 1
    #: Flags of the interpreter that runs hostcheck (``-S``: hostcheck without nvidia-ml-py).
    pyflags: tuple[str, ...] = ()
    check: Callable[[Outcome], None] | None = None
    timeout: float = RUN_TIMEOUT
    #: A folder (in the attack's folder) the test holds flock(2) on through the run: another writer at work.
    hold_lock: str | None = None


@dataclass
class Outcome:
    rc: int
    out: str
    err: str
    ctx: Ctx
    fifo: bytes = b""

    def doc(self) -> dict[str, Any]:
        return json.loads(self.out)

    def checks(self) -> dict[str, dict[str, Any]]:
        return {c["id"]: c for c in self.doc()["checks"]}


# --- what a run left behind ----------------------------------------------------------------------------


def listing(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` (links not followed): type and mode, and for what is not a folder its inode,
    size and mtime."""
    seen: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            if stat.S_ISDIR(st.st_mode):
                seen[rel] = (st.st_mode, st.st_uid)
            else:
                seen[rel] = (st.st_mode, st.st_uid, st.st_ino, st.st_size, st.st_mtime_ns)
    return seen


def _start_ticks(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def carriers(marker: str, since: int) -> list[tuple[int, str]]:
    """Live processes started at or after ``since`` (clock ticks since boot) whose environment carries the
    marker: (pid, command line). Only recent processes are read (an old one stuck in the kernel could block
    the read of its environment); a zombie's environment reads empty."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        started = _start_ticks(pid)
        if started is None or started < since:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append((int(pid), cmd))
    return found


def _ticks_now() -> int:
    with open("/proc/self/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19])


def _kill(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


# --- running one attack --------------------------------------------------------------------------------


def _env(ctx: Ctx, run: Run) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "PYTHONDONTWRITEBYTECODE": "1",
            "TMPDIR": str(ctx.tmp),
            "HOME": str(ctx.home),
            MARKER_VAR: ctx.marker,
        }
    )
    for key in ("TMP", "TEMP", "NO_COLOR", "PYTHONIOENCODING", "PYTEST_CURRENT_TEST"):
        env.pop(key, None)
    for key, value in run.env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _preexec(run: Run) -> Callable[[], None]:
    def setup() -> None:
        for res, value in run.limits.items():
            resource.setrlimit(res, (value, value))
        if run.stdin == "closed":
            os.close(0)
        if run.stdout == "closed":
            os.close(1)
        if run.stderr == "closed":
            os.close(2)

    return setup


def _read_fifo(fd: int) -> bytes:
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 1 << 20):
            data += chunk
    return data


def execute(ctx: Ctx, run: Run, since: int) -> list[Outcome]:
    cmd = [ctx.interp, *run.pyflags, "-m", "hostcheck", *run.argv]
    if ctx.user:
        cmd = [*NOBODY, *cmd]
    stdout: Any = subprocess.PIPE
    to_close: list[int] = []
    if run.stdout == "devfull":
        stdout = os.open("/dev/full", os.O_WRONLY)
        to_close.append(stdout)
    elif run.stdout == "closed":
        stdout = subprocess.DEVNULL
    elif run.stdout == "broken":
        r, w = os.pipe()
        os.close(r)  # the reader left before the first write: every write is EPIPE
        stdout = w
        to_close.append(w)
    stderr: Any = subprocess.DEVNULL if run.stderr == "closed" else subprocess.PIPE
    fifo_fd = None
    if run.fifo_reader:
        fifo_fd = os.open(ctx.p(run.fifo_reader), os.O_RDONLY | os.O_NONBLOCK)
        with contextlib.suppress(OSError):  # room for a whole report: the writer never waits on us
            fcntl.fcntl(fifo_fd, fcntl.F_SETPIPE_SZ, 1 << 20)
    procs = []
    if run.hold_lock:
        fd = os.open(ctx.p(run.hold_lock), os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        to_close.append(fd)  # the lock goes with the descriptor, once the run is over
    try:
        for _ in range(run.copies):
            procs.append(
                subprocess.Popen(
                    cmd,
                    cwd=ctx.root,
                    env=_env(ctx, run),
                    stdin=subprocess.DEVNULL,
                    stdout=stdout,
                    stderr=stderr,
                    preexec_fn=_preexec(run),
                    start_new_session=True,
                )
            )
        for fd in to_close if not run.hold_lock else to_close[:-1]:
            os.close(fd)
        to_close = to_close[-1:] if run.hold_lock else []
        if run.signal is not None:
            _signal_mid_run(procs[0], run.signal, ctx.marker, since, run.signal_when)
        # Read every copy's pipes at once: one run blocked on a full pipe must not stall the others.
        results: list[Any] = [None] * len(procs)

        def reap(i: int, p: subprocess.Popen) -> None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                results[i] = p.communicate(timeout=run.timeout)

        threads = [threading.Thread(target=reap, args=(i, p)) for i, p in enumerate(procs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        hung = [p.pid for p, r in zip(procs, results) if r is None]
        if hung:
            for p in procs:
                with contextlib.suppress(OSError):
                    os.killpg(p.pid, signal.SIGKILL)
            _kill([pid for pid, _ in carriers(ctx.marker, since)])
            pytest.fail(f"hung: still running after {run.timeout:g} s: {' '.join(cmd)}")
        fifo = _read_fifo(fifo_fd) if fifo_fd is not None else b""
        return [
            Outcome(
                p.returncode,
                (out or b"").decode(errors="replace"),
                (err or b"").decode(errors="replace"),
                ctx,
                fifo,
            )
            for p, (out, err) in zip(procs, results)
        ]
    finally:
        for fd in to_close:
            os.close(fd)
        if fifo_fd is not None:
            os.close(fifo_fd)
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _handling(pid: int) -> bool:
    """Whether the process catches SIGHUP, SIGINT and SIGTERM (its SigCgt mask): hostcheck's main has begun."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = int(next(ln for ln in f if ln.startswith("SigCgt:")).split()[1], 16)
    except (OSError, StopIteration, ValueError):
        return False
    return all(caught >> (s - 1) & 1 for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM))


def _holds(pid: int, folder: str) -> bool:
    """Whether the process has ``folder`` open (a writer waiting for the folder's lock holds it open)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") == folder:
                return True
    return False


def _signal_mid_run(p: subprocess.Popen, sig: int, marker: str, since: int, when: str = "sleeping") -> None:
    """Send ``sig`` once the run is in the middle of its hung probe: two ``sleep`` processes carry the marker
    (``when="handling"``: once hostcheck has installed its signal handlers; ``"holding:FOLDER"``: once it has the
    folder open, waiting for its lock)."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while True:
        if when == "handling" and _handling(p.pid):
            break
        if when.startswith("holding:") and _holds(p.pid, when.split(":", 1)[1]):
            break
        sleeping = [pid for pid, cmd in carriers(marker, since) if cmd.startswith("sleep")]
        if when == "sleeping" and len(sleeping) >= 2:
            break
        assert p.poll() is None, f"the run ended (exit {p.returncode}) before its probe hung"
        assert time.monotonic() < deadline, "the probe never started"
        time.sleep(0.05)
    p.send_signal(sig)


# --- building blocks of the table ----------------------------------------------------------------------


def _mkfifo(ctx: Ctx, name: str) -> str:
    os.mkfifo(ctx.p(name))
    return ctx.p(name)


def _sparse(path: str, size: int, head: bytes = b"") -> str:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return path


def _prom_ok(text: str) -> None:
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    assert "hostcheck_score" in samples and any(k.startswith("hostcheck_check_status{") for k in samples)


#: Jenkins' junit-10.xsd (fixtures/schemas, with its source): every JUnit file an attack leaves must validate.
JUNIT_SCHEMA = xmlschema.XMLSchema(str(Path(__file__).parent / "fixtures" / "schemas" / "junit-10.xsd"))


def _junit_ok(text: str) -> None:
    root = ET.fromstring(text)
    assert list(root.iter("testcase")) and int(root.get("tests")) > 0
    JUNIT_SCHEMA.validate(text)


def _status(o: Outcome, check_id: str) -> tuple[str, str]:
    c = o.checks()[check_id]
    return c["status"], c["message"]


def _e004_names(*words: str) -> Callable[[Outcome], None]:
    """system.E004 (the local facts) warns and names what it could not use."""

    def check(o: Outcome) -> None:
        status, message = _status(o, "system.E004")
        assert status == "warn" and all(w in message for w in words), message

    return check


def _env_file_named(*words: str) -> Callable[[Outcome], None]:
    """tuning.E011 (the environment file) does not pass, and names the problem."""

    def check(o: Outcome) -> None:
        status, message = _status(o, "tuning.E011")
        assert status != "pass" and all(w in message for w in words), (status, message)

    return check


def _torch_not_ok(*words: str) -> Callable[[Outcome], None]:
    """torch.E001 says the training Python's torch cannot be used, and why; never pass, never a quiet skip."""

    def check(o: Outcome) -> None:
        status, message = _status(o, "torch.E001")
        assert status in ("fail", "error") and all(w in message for w in words), (status, message)
        assert o.rc == 1

    return check


@functools.cache
def import_footprint_kib() -> int:
    """The address space hostcheck takes once imported (VmPeak, KiB): the base of the ``ulimit -v`` attacks."""
    code = "import hostcheck.command\nprint([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmPeak')][0])"
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return int(p.stdout)


def _ulimit_v(extra_mib: int) -> Callable[[Ctx], Run]:
    def build(c: Ctx) -> Run:
        limit = (import_footprint_kib() + extra_mib * 1024) * 1024
        return Run(c.base(), limits={resource.RLIMIT_AS: limit})

    return build


NO_THREADS_IN_THREADS = """\
import threading

_start = threading.Thread.start


def start(self):
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("can't start new thread")
    return _start(self)


threading.Thread.start = start
"""


def _threads_cannot_start_threads(c: Ctx) -> Run:
    site = c.root / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_THREADS_IN_THREADS)
    return Run(
        c.base(only="system,tuning,torch.E001", json_out=True),
        JUDGED,
        env={"PYTHONPATH": f"{site}:{REPO}"},
        check=_torch_not_ok("can't start new thread"),
    )


@functools.cache
def nobody_python() -> tuple[str | None, str]:
    """A Python that ``nobody`` can run hostcheck with, or why there is none."""
    if os.geteuid() != 0:
        return None, "not root: cannot switch to the nobody user"
    if shutil.which("setpriv") is None:
        return None, "setpriv (util-linux) is not installed"
    for py in (sys.executable, "/usr/bin/python3"):
        if not os.path.exists(py):
            continue
        p = subprocess.run(
            [*NOBODY, py, "-c", "import hostcheck.command"],
            cwd="/",
            capture_output=True,
            env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"},
        )
        if p.returncode == 0:
            return py, ""
    return None, f"no Python that nobody may run can import hostcheck from {REPO}"


# Fake torch packages (``import torch`` in the training Python runs one).
TORCH_RAISES = "raise RuntimeError('fake torch: libcudart.so.12 is broken')\n"
TORCH_EXITS = "raise SystemExit(3)\n"
TORCH_VANISHES = "import os\nos._exit(0)\n"
TORCH_HANGS = "import time\ntime.sleep(300)\n"
TORCH_WORKS = """\
from types import SimpleNamespace as _NS
__version__ = "2.5.1+cu124"
version = _NS(cuda="12.4")
backends = _NS(cudnn=_NS(version=lambda: 90100))
def _is_available():
    return False
cuda = _NS(is_available=_is_available, device_count=lambda: 0, get_arch_list=lambda: ["sm_90"],
           nccl=_NS(version=lambda: (2, 21, 5)))
def get_num_threads():
    return 1
"""
TORCH_CUDA_RAISES = TORCH_WORKS.replace(
    "    return False", "    raise RuntimeError('fake torch: CUDA driver initialization failed')"
)
TORCH_LEAVES_A_DAEMON = (
    "import subprocess\n"
    "subprocess.Popen(['setsid', 'sleep', '300'], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,\n"
    "                 stderr=subprocess.DEVNULL, start_new_session=True)\n" + TORCH_WORKS
)
TORCH_BAD_MARKERS = (
    "import sys\n"
    "sys.stdout.write('\\nHOSTCHECK_PROBE_JSON:{not json\\nHOSTCHECK_PROBE_JSON:[1, 2]\\n')\n" + TORCH_WORKS
)
# A training Python that hangs with a grandchild in a session of its own (what a signal must end).
HANGING_PYTHON = "setsid sleep 300 &\nexec sleep 300\n"
# Tools on PATH that fail or talk nonsense.
FAILING_TOOL = "echo 'garbage \377\376 output'\necho 'error: something broke' >&2\nexit 3\n"
GARBAGE_SMI = """\
case "$1" in
  --query-gpu=*) printf '0, [N/A], nan, inf, -1, 1e400, 99999999999999999999999, \\377\\376, , ,\\n,,,\\n1\\n' ;;
  --query-*) printf 'garbage, [Unknown Error]\\n' ;;
  *) printf 'CUDA Version: 99999999999999999999.-1\\n' ;;
esac
"""
TIME_OPTIONS = [
    ("--burn", "inf"),
    ("--burn", "nan"),
    ("--torch-timeout", "inf"),
    ("--torch-timeout", "nan"),
    ("--torch-timeout", "-5"),
    ("--timeout", "nan"),
    ("--timeout", "inf"),
    ("--workload-timeout", "nan"),
    ("--workload-timeout", "inf"),
    ("--rdzv-timeout", "nan"),
    ("--rdzv-timeout", "inf"),
    ("--rdzv-timeout", "-1"),
]


def _time_option(flag: str, value: str) -> Callable[[Ctx], Run]:
    return lambda c: Run(c.base(f"{flag}={value}"), USAGE, needle=f"argument {flag}")


def _report_run(c: Ctx, flag: str, path: str, codes: tuple[int, ...], needle: str = "", **kw: Any) -> Run:
    return Run(c.base(flag, path), codes, needle=needle, **kw)


def _symlink(c: Ctx, name: str, target: str) -> str:
    os.symlink(target, c.p(name))
    return c.p(name)


def _hardlinked(c: Ctx) -> Run:
    Path(c.p("victim.prom")).write_text("# another collector's file: keep me\n")
    os.link(c.p("victim.prom"), c.p("hostcheck.prom"))

    def check(o: Outcome) -> None:
        assert Path(c.p("victim.prom")).read_text() == "# another collector's file: keep me\n"
        _prom_ok(Path(c.p("hostcheck.prom")).read_text())

    return Run(
        c.base("--prometheus", c.p("hostcheck.prom")), JUDGED, reports=("hostcheck.prom",), check=check
    )


def _existing_report(c: Ctx) -> Run:
    Path(c.p("junit.xml")).write_text("old")
    Path(c.p("junit.xml")).chmod(0o600)

    def check(o: Outcome) -> None:
        _junit_ok(Path(c.p("junit.xml")).read_text())
        assert stat.S_IMODE(os.stat(c.p("junit.xml")).st_mode) == 0o644

    return Run(c.base("--junit", c.p("junit.xml")), JUDGED, reports=("junit.xml",), check=check)


def _fifo_with_reader(flag: str, parse: Callable[[str], None]) -> Callable[[Ctx], Run]:
    def build(c: Ctx) -> Run:
        _mkfifo(c, "collector")
        return Run(
            c.base(flag, c.p("collector")),
            JUDGED,
            reports=("collector",),
            fifo_reader="collector",
            check=lambda o: parse(o.fifo.decode()),
        )

    return build


def _unix_socket(c: Ctx) -> Run:
    s = socket.socket(socket.AF_UNIX)
    s.bind(c.p("collector.sock"))
    s.close()
    return Run(c.base("--prometheus", c.p("collector.sock")), USAGE, needle="not a regular file")


def _signal(sig: int, code: int, bench: bool = False) -> Callable[[Ctx], Run]:
    def build(c: Ctx) -> Run:
        py = c.script("hung/python", HANGING_PYTHON)
        if bench:
            argv = ["bench", "--python", py, "--facts-dir", str(c.facts), "--workdir", c.p("bench"), "-q"]
            reports: tuple[str, ...] = ("bench",)
        else:
            argv = c.base(only="system,tuning,torch.E001", python=py)
            reports = ()
        return Run(
            argv, (code,), reports=reports, signal=sig, needle=f"interrupted by {signal.Signals(sig).name}"
        )

    return build


# --- signals for every subcommand -------------------------------------------------------------------------
#: What each subcommand runs while the signal comes: check's and bench's hung training Python (a grandchild in a
#: session of its own), job's command doing the same, fleet reading many reports.
SIGNAL_EXITS = {signal.SIGHUP: 129, signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGKILL: -signal.SIGKILL}


def _fleet_reports(c: Ctx, count: int = 3000) -> str:
    """A folder of ``count`` node reports, enough that fleet is still reading them when the signal comes."""
    folder = c.root / "reports"
    folder.mkdir()
    checks = [{"id": f"x.E{i:03d}", "status": "warn", "weight": 1, "message": "m" * 40} for i in range(60)]
    text = json.dumps({"score": {"value": 90, "ready": True}, "checks": checks, "host": {"hostname": "n"}})
    for i in range(count):
        (folder / f"node{i:05d}.json").write_text(text)
    return str(folder)


def _signalled(command: str, sig: int) -> Callable[[Ctx], Run]:
    """``sig`` in the middle of ``command``: exit 128 + N with one line and every child gone (SIGKILL: killed,
    and no child left behind either, by the reaper)."""

    def build(c: Ctx) -> Run:
        py = c.script("hung/python", HANGING_PYTHON)
        reports: tuple[str, ...] = ()
        when = "sleeping"
        if command == "check":
            argv = c.base(only="system,tuning,torch.E001", python=py)
        elif command == "bench":
            argv = ["bench", "--python", py, "--facts-dir", str(c.facts), "--workdir", c.p("bench"), "-q"]
            reports = ("bench",)
        elif command == "job":
            argv = [
                "job",
                "--seconds",
                "50",
                "--grace",
                "1",
                "--",
                "sh",
                "-c",
                "setsid sleep 300 & exec sleep 300",
            ]
        else:
            argv = ["fleet", _fleet_reports(c)]
            reports, when = ("reports",), "handling"
        needle = "" if sig == signal.SIGKILL else f"interrupted by {signal.Signals(sig).name}"
        return Run(argv, (SIGNAL_EXITS[sig],), reports=reports, signal=sig, signal_when=when, needle=needle)

    return build


def _facts_fifo(c: Ctx) -> Run:
    os.mkfifo(c.facts / "gpunode_tuning.fact")
    return Run(c.base(json_out=True), JUDGED, check=_e004_names("gpunode_tuning.fact", "not a regular file"))


def _facts_symlink_loop(c: Ctx) -> Run:
    (c.facts / "gpunode_driver.fact").symlink_to(c.facts / "gpunode_driver.fact")
    return Run(c.base(json_out=True), JUDGED, check=_e004_names("symbolic link loop"))


def _facts_broken_symlink(c: Ctx) -> Run:
    (c.facts / "gpunode_cuda.fact").symlink_to(c.facts / "nowhere")
    return Run(c.base(json_out=True), JUDGED, check=_e004_names("broken symbolic link"))


def _facts_to_dev_zero(c: Ctx) -> Run:
    (c.facts / "gpunode_tuning.fact").symlink_to("/dev/zero")
    return Run(c.base(json_out=True), JUDGED, check=_e004_names("not a regular file"))


def _facts_50mb(c: Ctx) -> Run:
    _sparse(str(c.facts / "gpunode_tuning.fact"), 50 << 20, b'{"pad": "')
    return Run(c.base(json_out=True), JUDGED, check=_e004_names("52428800 bytes"))


def _fact(
    role: str, text: str | bytes, *named: str, env_file: bool = True, only: str = "system,tuning"
) -> Callable[[Ctx], Run]:
    def build(c: Ctx) -> Run:
        c.fact(role, text)
        return Run(c.base(json_out=True, env_file=env_file, only=only), JUDGED, check=_e004_names(*named))

    return build


def _fact_env_file_int(c: Ctx) -> Run:
    """{"env_file": 1} once made hostcheck open(1) and close its own stdout: the JSON must come out whole."""
    c.fact("gpunode_tuning", '{"env_file": 1}')
    return Run(
        c.base(json_out=True, env_file=False, only="system,tuning.E011"),
        JUDGED,
        check=_e004_names("gpunode_tuning.fact: env_file is 1"),
    )


def _fact_venv_int(c: Ctx) -> Run:
    """{"venv": 12} once killed the torch gatherer: the next venv in the facts must be probed instead."""
    venv_python = c.script("venv/bin/python", f'exec {c.interp} -S "$@"\n')
    c.fact("gpunode_pytorch", '{"venv": 12}')
    c.fact("gpunode_tuning", json.dumps({"venv": c.p("venv")}))

    def check(o: Outcome) -> None:
        _e004_names("gpunode_pytorch.fact: venv is 12")(o)
        status, message = _status(o, "system.E003")  # the training Python probed: the next venv's
        assert status != "error" and venv_python in message, (status, message)

    argv = [a for a in c.base(json_out=True) if a != c.python]
    argv.remove("--python")
    return Run(argv, JUDGED, check=check)


def _facts_dir_is_a_file(c: Ctx) -> Run:
    Path(c.p("not-a-folder")).write_text("{}")
    return Run([*c.base(json_out=True), "--facts-dir", c.p("not-a-folder")], JUDGED)


def _facts_dir_missing(c: Ctx) -> Run:
    return Run(
        [*c.base(json_out=True), "--facts-dir", c.p("no-such-folder")],
        JUDGED,
        check=_e004_names("no gpunode_"),
    )


def _envfile(text: bytes | str, *named: str) -> Callable[[Ctx], Run]:
    def build(c: Ctx) -> Run:
        data = text.encode() if isinstance(text, str) else text
        c.env_file.write_bytes(data)
        return Run(c.base(json_out=True), JUDGED, check=_env_file_named(*named) if named else None)

    return build


def _env_omp(value: str) -> Callable[[Ctx], Run]:
    def build(c: Ctx) -> Run:
        c.env_file.write_text(f"OMP_NUM_THREADS={value}\n")

        def check(o: Outcome) -> None:
            status, message = _status(o, "tuning.E005")
            assert status != "pass" and "OMP_NUM_THREADS" in message, (status, message)

        return Run(c.base(json_out=True), JUDGED, check=check)

    return build


def _env_preload_missing(c: Ctx) -> Run:
    """A preload of a file that does not exist fails tuning.E002 (ld.so only warns and runs without it)."""
    c.env_file.write_text("LD_PRELOAD=/nonexistent/libtcmalloc.so.4\n")

    def check(o: Outcome) -> None:
        status, message = _status(o, "tuning.E002")
        assert status == "fail" and "/nonexistent/libtcmalloc.so.4 (does not exist)" in message, message

    return Run(c.base(json_out=True), JUDGED, check=check)


def _fleet_hostile_figures(c: Ctx) -> Run:
    """Reports whose GPU figures are NaN, huge, negative, text or nested: the fleet comparison leaves them out."""
    nodes = c.root / "fleetin"
    nodes.mkdir()
    gpus = [
        {"name": "NVIDIA H100 80GB HBM3", "matmul_flops_per_second": {"bf16": v}, "copy_bytes_per_second": v}
        for v in (float("nan"), 1e308, -5, "fast", {"x": [1]}, 10**400)
    ]
    for i, g in enumerate(gpus):
        check = {"id": "workload.E013", "status": "pass", "value": g["matmul_flops_per_second"]["bf16"]}
        doc = {"checks": [check], "score": {"value": 100, "ready": True}, "gpus": [g] * 8}
        # json.dumps writes NaN and a 400-digit integer as Python's json reads them back.
        (nodes / f"n{i}.json").write_text(json.dumps(doc))

    def check(o: Outcome) -> None:
        assert "slower than their fleet peers" not in o.out, o.out
        # A figure of the wrong type or NaN breaks the report's schema: each such node is named, not ready.
        assert "not ready: n0, n1, n2, n3, n4, n5" in o.out, o.out

    return Run(["fleet", str(nodes), "--out", c.p("fleetout")], (1,), reports=("fleetout",), check=check)


def _env_fifo(c: Ctx) -> Run:
    c.env_file.unlink()
    os.mkfifo(c.env_file)
    return Run(c.base(json_out=True), JUDGED, check=_env_file_named("FIFO"))


def _env_folder(c: Ctx) -> Run:
    c.env_file.unlink()
    c.env_file.mkdir()
    return Run(c.base(json_out=True), JUDGED)


def _env_missing(c: Ctx) -> Run:
    c.env_file.unlink()
    return Run(c.base(json_out=True), JUDGED)


def _env_loop(c: Ctx) -> Run:
    c.env_file.unlink()
    c.env_file.symlink_to(c.env_file)
    return Run(c.base(json_out=True), JUDGED)


def _env_50mb(c: Ctx) -> Run:
    _sparse(str(c.env_file), 50 << 20, b"OMP_NUM_THREADS=2\n")
    return Run(c.base(json_out=True), JUDGED)


def _tmpdir(value: Callable[[Ctx], str]) -> Callable[[Ctx], Run]:
    return lambda c: Run(c.base(), JUDGED, env={"TMPDIR": value(c)})


def _tmpdir_file(c: Ctx) -> str:
    Path(c.p("a-file")).write_text("x")
    return c.p("a-file")


def _path_tools(c: Ctx, body: str, tools: Sequence[str]) -> str:
    for tool in tools:
        c.script(f"bin/{tool}", body)
    return c.p("bin")


def _concurrent(c: Ctx) -> Run:
    def check(o: Outcome) -> None:
        assert o.doc()["checks"]  # each run's own stdout: one whole JSON document
        prom, junit = Path(c.p("out/hostcheck.prom")).read_text(), Path(c.p("out/junit.xml")).read_text()
        _prom_ok(prom)
        assert prom.count("\nhostcheck_score ") + prom.startswith("hostcheck_score ") == 1, prom
        _junit_ok(junit)
        assert sorted(os.listdir(c.p("out"))) == ["hostcheck.prom", "junit.xml"], os.listdir(c.p("out"))

    os.mkdir(c.p("out"))
    argv = c.base("--prometheus", c.p("out/hostcheck.prom"), "--junit", c.p("out/junit.xml"), "--json")
    return Run(argv, JUDGED, reports=("out/hostcheck.prom", "out/junit.xml"), copies=4, check=check)


def _as_nobody(c: Ctx) -> Run:
    os.chown(c.p("out"), 65534, 65534)

    def check(o: Outcome) -> None:
        _prom_ok(Path(c.p("out/hostcheck.prom")).read_text())
        assert os.stat(c.p("out/hostcheck.prom")).st_uid == 65534  # written by nobody, not by root
        assert o.checks()

    argv = c.base("--json", "--prometheus", c.p("out/hostcheck.prom"))
    return Run(argv, JUDGED, reports=("out/hostcheck.prom",), check=check)


def _as_nobody_report_in_roots_folder(c: Ctx) -> Run:
    return Run(
        c.base("--prometheus", c.p("rootonly/hostcheck.prom")), USAGE, needle="its folder is not writable"
    )


# --- the hardware state file and the host root (system.E006-E010) -------------------------------------------
# The state file is input anyone with root could have replaced: it is read through the one bounded reader (never
# blocked on, never followed into a device) and replaced atomically; what cannot be used is system.E010's warning.

HARDWARE = "system.E006,system.E007,system.E008,system.E009,system.E010"


def _state_run(c: Ctx, state: str, *words: str, reports: tuple[str, ...] = ()) -> Run:
    def check(o: Outcome) -> None:
        status, message = _status(o, "system.E010")
        assert status == "warn" and all(w in message for w in words), (status, message)
        assert {cid for cid, r in o.checks().items() if r["status"] == "error"} == set(), o.checks()

    return Run(c.base(only=HARDWARE, json_out=True, state=state), JUDGED, reports=reports, check=check)


def _state_fifo(c: Ctx) -> Run:
    return _state_run(c, _mkfifo(c, "state.fifo"), "not a regular file", reports=("state.fifo",))


def _state_dev_zero(c: Ctx) -> Run:
    os.symlink("/dev/zero", c.p("zero.json"))
    return _state_run(c, c.p("zero.json"), "not a regular file", reports=("zero.json",))


def _state_garbage(c: Ctx) -> Run:
    Path(c.p("garbage.json")).write_bytes(b"\x00{[\xff" * 1000)
    return _state_run(c, c.p("garbage.json"), "not JSON", reports=("garbage.json",))


def _state_huge(c: Ctx) -> Run:
    return _state_run(c, _sparse(c.p("huge.json"), 4 << 30, b"{"), "bytes", reports=("huge.json",))


def _state_folder_is_a_file(c: Ctx) -> Run:
    Path(c.p("notadir")).write_text("")
    return _state_run(c, c.p("notadir/state.json"), "not kept")


def _state_unwritable_as_nobody(c: Ctx) -> Run:
    return _state_run(c, c.p("rootonly/state.json"), "not kept")


def _host_root_hostile(c: Ctx) -> Run:
    """A host root whose counters are a FIFO, a huge file and garbage: read without blocking, judged, never an
    internal error."""
    mc = c.root / "host/sys/devices/system/edac/mc/mc0"
    mc.mkdir(parents=True)
    os.mkfifo(mc / "ce_count")
    _sparse(str(mc / "ue_count"), 4 << 30)
    dev = c.root / "host/sys/bus/pci/devices/0000:18:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x10de\n")
    (dev / "class").write_text("0x030200\n")
    (dev / "aer_dev_fatal").write_bytes(b"TOTAL_ERR_FATAL " + b"9" * 5000)
    os.mkfifo(dev / "aer_dev_correctable")
    (c.root / "host/proc/77").mkdir(parents=True)
    (c.root / "host/proc/77/stat").write_text("77 (x) D " + "9" * 100000)

    def check(o: Outcome) -> None:
        statuses = {cid: r["status"] for cid, r in o.checks().items()}
        assert "error" not in statuses.values(), statuses
        # Nothing readable is nothing judged: said, never a pass or a fail.
        assert statuses["system.E006"] == statuses["system.E009"] == "skip", statuses

    argv = c.base("--host-root", c.p("host"), only=HARDWARE, json_out=True)
    return Run(argv, JUDGED, check=check)


def _rdma_hostile(c: Ctx) -> Run:
    """An RDMA tree whose counter is a FIFO, whose rate is garbage, whose links loop and whose files are huge:
    read without blocking or following a loop, nothing unreadable judged, never an internal error."""
    host = c.root / "host"
    port = host / "sys/class/infiniband/mlx5_0/ports/1"
    (port / "counters").mkdir(parents=True)
    os.mkfifo(port / "counters/symbol_error")
    _sparse(str(port / "counters/link_downed"), 4 << 30, b"1")
    (port / "rate").write_bytes(b"\xff\x00 fast " * 1000)
    os.mkfifo(port / "state")
    (port / "phys_state").write_text("5: LinkUp\n")
    os.symlink("hw_counters", port / "hw_counters")  # a link to itself
    dev = host / "sys/class/infiniband/mlx5_0"
    os.symlink("device", dev / "device")
    _sparse(str(dev / "fw_ver"), 4 << 30)
    pci = host / "sys/bus/pci/devices"
    pci.mkdir(parents=True)
    os.symlink("0000:18:00.0", pci / "0000:18:00.0")  # a loop where a GPU's link should be
    (host / "sys/class/net").mkdir(parents=True)
    os.symlink("eth0", host / "sys/class/net/eth0")
    c.env_file.write_text("NCCL_IB_HCA=" + "^=" * 5000 + ",:" * 5000 + "\nNCCL_SOCKET_IFNAME=eth\n")

    def check(o: Outcome) -> None:
        statuses = {cid: r["status"] for cid, r in o.checks().items()}
        assert "error" not in statuses.values(), statuses
        assert statuses["fabric.E001"] == statuses["fabric.E002"] == "skip", o.checks()["fabric.E001"]

    argv = c.base("--host-root", str(host), only="fabric", json_out=True)
    return Run(argv, JUDGED, check=check)


def _nccl_hostile(
    plant: Callable[[Ctx, Path], None], *words: str, status: str = "warn"
) -> Callable[[Ctx], Run]:
    """A node (an HGX H100 tree, tests/unit/fixtures/fabrictree.py) whose NCCL configuration (/etc/nccl.conf,
    the file NCCL_CONF_FILE names, the training environment file) is hostile: read without blocking or following
    a device, never an internal error; fabric.E009 says what it could not read or what is stale, briefly."""

    def build(c: Ctx) -> Run:
        import fabrictree

        host = fabrictree.build(c.root / "host")
        (host / "etc").mkdir(exist_ok=True)
        plant(c, host)

        def check(o: Outcome) -> None:
            statuses = {cid: r["status"] for cid, r in o.checks().items()}
            assert "error" not in statuses.values(), statuses
            e009 = o.checks()["fabric.E009"]
            assert e009["status"] == status and all(w in e009["message"] for w in words), e009["message"]
            assert len(e009["message"]) < 4000 and len(f"hostcheck: fabric.E009 {e009['brief']}") <= 80

        return Run(c.base("--host-root", str(host), only="fabric", json_out=True), JUDGED, check=check)

    return build


def _nccl_conf(data: bytes) -> Callable[[Ctx, Path], None]:
    return lambda c, host: (host / "etc/nccl.conf").write_bytes(data)


def _nccl_conf_file_fifo(c: Ctx, host: Path) -> None:
    os.mkfifo(host / "etc/site-nccl.conf")
    c.env_file.write_text("NCCL_CONF_FILE=/etc/site-nccl.conf\n")


NCCL_ABSURD = (
    b"NCCL_IB_HCA=^^^=::::,,,,=" + b"\x1b[31m" * 50 + b"\n"
    b"NCCL_NET_GDR_LEVEL=999999999999999999999999999999\n"
    b"NCCL_SOCKET_IFNAME=" + b"=" * 3000 + b"\n"
    b"NCCL_IB_HCA" + b" " * 2000 + b"=mlx5_0\n" + b"=" * 5000 + b"\n"
)


def _only_ids(*ids: str) -> Callable[[Outcome], None]:
    def check(o: Outcome) -> None:
        assert sorted(o.checks()) == sorted(ids), sorted(o.checks())

    return check


def _cuda_error_not_hidden(o: Outcome) -> None:
    status, message = _status(o, "torch.E004")
    assert status != "pass", message


def _stdout_encoding_check(o: Outcome) -> None:
    assert o.out.startswith("hostcheck ") and "score" in o.out


@dataclass(frozen=True)
class Attack:
    id: str
    build: Callable[[Ctx], Run]
    user: str | None = None
    #: The outcome the row expects, in words (shown when it fails); the id names the attack.
    expect: str = ""


def A(id: str, build: Callable[[Ctx], Run], user: str | None = None, expect: str = "") -> Any:
    return pytest.param(Attack(id, build, user, expect), id=id)


ATTACKS = [
    # Report paths: refused before the run, or written without clobbering what the path names.
    A(
        "report-junit-dev-full",
        lambda c: _report_run(c, "--junit", "/dev/full", USAGE, "writing a report file"),
    ),
    A(
        "report-prometheus-dev-full",
        lambda c: _report_run(c, "--prometheus", "/dev/full", USAGE, "writing a report file"),
    ),
    A("report-junit-dev-null", lambda c: _report_run(c, "--junit", "/dev/null", JUDGED)),
    A(
        "report-prometheus-symlink-to-a-file",
        lambda c: _report_run(
            c,
            "--prometheus",
            _symlink(c, "link.prom", _sparse(c.p("precious"), 10, b"keep me")),
            USAGE,
            "symbolic link",
        ),
    ),
    A(
        "report-junit-dangling-symlink",
        lambda c: _report_run(
            c, "--junit", _symlink(c, "dangling.xml", c.p("created-through-link")), USAGE, "symbolic link"
        ),
    ),
    A(
        "report-prometheus-fifo-no-reader",
        lambda c: _report_run(c, "--prometheus", _mkfifo(c, "fifo"), USAGE, "writing a report file"),
    ),
    A("report-prometheus-fifo-with-reader", _fifo_with_reader("--prometheus", _prom_ok)),
    A("report-junit-fifo-with-reader", _fifo_with_reader("--junit", _junit_ok)),
    A("report-junit-a-folder", lambda c: _report_run(c, "--junit", str(c.facts), USAGE, "is a folder")),
    A("report-prometheus-empty-path", lambda c: _report_run(c, "--prometheus", "", USAGE, "empty path")),
    A("report-junit-blank-path", lambda c: _report_run(c, "--junit", "   ", USAGE, "empty path")),
    A(
        "report-same-path-for-prometheus-and-junit",
        lambda c: Run(
            c.base("--prometheus", c.p("out"), "--junit", c.p("./out")), USAGE, needle="name the same file"
        ),
    ),
    A(
        "report-same-file-through-a-linked-folder",
        lambda c: Run(
            c.base("--prometheus", c.p("out"), "--junit", _symlink(c, "alias", str(c.root)) + "/out"),
            USAGE,
            needle="name the same file",
        ),
    ),
    A(
        "report-missing-folder",
        lambda c: _report_run(c, "--junit", c.p("no/such/junit.xml"), USAGE, "does not exist"),
    ),
    A("report-unix-socket", _unix_socket),
    A("report-trailing-slash", lambda c: _report_run(c, "--prometheus", c.p("new.prom") + "/", USAGE)),
    A("report-hardlinked-file-is-replaced-not-written-through", _hardlinked),
    A("report-existing-file-replaced-whole", _existing_report),
    # /dev/stdout is a symbolic link (to /proc/self/fd/1): refused like any other today.
    A("report-dev-stdout", lambda c: _report_run(c, "--prometheus", "/dev/stdout", ANY)),
    # Signals in the middle of a run (a hung training Python with a grandchild in a session of its own).
    A("signal-sigint-mid-probe", _signal(signal.SIGINT, 130)),
    A("signal-sigterm-mid-probe", _signal(signal.SIGTERM, 143)),
    A("signal-sigterm-mid-bench", _signal(signal.SIGTERM, 143, bench=True)),
    # Signals for every subcommand: what the rows above lack, SIGHUP (a closed terminal) and SIGKILL (the OOM
    # killer, a time limit; the reaper ends the children).
    A("signal-sighup-mid-probe", _signalled("check", signal.SIGHUP)),
    A("signal-sigkill-mid-probe", _signalled("check", signal.SIGKILL)),
    A("signal-sigint-mid-bench", _signalled("bench", signal.SIGINT)),
    A("signal-sighup-mid-bench", _signalled("bench", signal.SIGHUP)),
    A("signal-sigkill-mid-bench", _signalled("bench", signal.SIGKILL)),
    A("signal-sigint-mid-job", _signalled("job", signal.SIGINT)),
    A("signal-sigterm-mid-job", _signalled("job", signal.SIGTERM)),
    A("signal-sighup-mid-job", _signalled("job", signal.SIGHUP)),
    A("signal-sigkill-mid-job", _signalled("job", signal.SIGKILL)),
    A("signal-sigint-mid-fleet", _signalled("fleet", signal.SIGINT)),
    A("signal-sigterm-mid-fleet", _signalled("fleet", signal.SIGTERM)),
    A("signal-sighup-mid-fleet", _signalled("fleet", signal.SIGHUP)),
    A("signal-sigkill-mid-fleet", _signalled("fleet", signal.SIGKILL)),
    # The facts folder.
    A("facts-fifo", _facts_fifo),
    A("facts-symlink-loop", _facts_symlink_loop),
    A("facts-broken-symlink", _facts_broken_symlink),
    A("facts-symlink-to-dev-zero", _facts_to_dev_zero),
    A("facts-50mb", _facts_50mb),
    A("facts-env_file-is-1", _fact_env_file_int),
    A(
        "facts-services_disabled-is-5",
        _fact("gpunode_tuning", '{"services_disabled": 5}', "services_disabled is 5"),
    ),
    A("facts-venv-is-12", _fact_venv_int),
    A(
        "facts-expected_gpu_count-1e400",
        _fact(
            "gpunode_driver", '{"expected_gpu_count": 1e400}', "expected_gpu_count is", only="system,gpu.E002"
        ),
    ),
    A(
        "facts-expected_gpu_count-minus-4-string",
        _fact(
            "gpunode_driver",
            '{"expected_gpu_count": "-4"}',
            'expected_gpu_count is "-4"',
            only="system,gpu.E002",
        ),
    ),
    A("facts-not-json", _fact("gpunode_cuda", "{not json", "not JSON")),
    A("facts-a-json-array", _fact("gpunode_cuda", "[1, 2]", "not a JSON object")),
    A("facts-nested-100000-deep", _fact("gpunode_pytorch", "[" * 100_000, "not JSON")),
    A(
        "facts-nul-bytes-and-bad-utf8",
        _fact("gpunode_driver", b'{"version": "5\x0080", "x": "\xff\xfe"}', "not JSON"),
    ),
    A("facts-escaped-nul-in-a-version", _fact("gpunode_driver", '{"version": "5\\u000080"}', "version is")),
    A("facts-dir-missing", _facts_dir_missing),
    A("facts-dir-is-a-file", _facts_dir_is_a_file),
    # Time options: finite seconds in range, refused before the run.
    *[A(f"time{flag}-{value}", _time_option(flag, value)) for flag, value in TIME_OPTIONS],
    A("time--timeout-1e-9", lambda c: Run(c.base("--timeout", "1e-9"), JUDGED)),
    A(
        "time--torch-timeout-1e-9",
        lambda c: Run(
            c.base("--torch-timeout", "1e-9", only="system,tuning,torch.E001", json_out=True),
            (1,),
            check=_torch_not_ok("did not finish"),
        ),
    ),
    # The training environment file.
    A("envfile-omp-num-threads-0", _env_omp("0")),
    A("envfile-omp-num-threads-minus-1", _env_omp("-1")),
    A("envfile-nul-bytes", _envfile(b"OMP_NUM_THREADS=2\nLD_PRELOAD=/x\x00y.so\n", "NUL")),
    A(
        "envfile-bad-keys",
        _envfile(
            "1BAD=x\nA-B=y\n=novalue\nexport OK=1\njust words\nPATH WITH SPACE=1\n", "not a variable name"
        ),
    ),
    A("envfile-bad-utf8", _envfile(b"OMP_NUM_THREADS=\xff\xfe\nMALLOC_CONF=\xc3\x28\n")),
    A("envfile-pythonhome-breaks-the-probe", _envfile("PYTHONHOME=/nonexistent\nPYTHONPATH=/nonexistent\n")),
    A("envfile-ld-preload-missing-library", _env_preload_missing),
    A("envfile-fifo", _env_fifo),
    A("envfile-a-folder", _env_folder),
    A("envfile-missing", _env_missing),
    A("envfile-symlink-loop", _env_loop),
    A("envfile-50mb", _env_50mb),
    # Standard streams.
    A(
        "stdio-stdout-closed",
        lambda c: Run(c.base(), USAGE, stdout="closed", needle="standard output is closed"),
    ),
    A("stdio-stdout-dev-full", lambda c: Run(c.base(), USAGE, stdout="devfull", needle="writing the report")),
    A(
        "stdio-json-stdout-dev-full",
        lambda c: Run(c.base("--json"), USAGE, stdout="devfull", needle="writing the report"),
    ),
    A("stdio-stdout-reader-gone", lambda c: Run(c.base(), JUDGED, stdout="broken")),
    A(
        "stdio-help-dev-full",
        lambda c: Run(["--help"], USAGE, stdout="devfull", needle="writing to standard output"),
    ),
    A(
        "stdio-version-dev-full",
        lambda c: Run(["--version"], USAGE, stdout="devfull", needle="writing to standard output"),
    ),
    A(
        "stdio-bench-help-dev-full",
        lambda c: Run(["bench", "--help"], USAGE, stdout="devfull", needle="writing to standard output"),
    ),
    A("stdio-stderr-closed-usage-error", lambda c: Run([*c.base(), "--frobnicate"], USAGE, stderr="closed")),
    A("stdio-stderr-closed", lambda c: Run(c.base(), JUDGED, stderr="closed")),
    A("stdio-stdin-closed", lambda c: Run(c.base(), JUDGED, stdin="closed")),
    A(
        "stdio-ascii-stdout",
        lambda c: Run(
            c.base(), JUDGED, env={"PYTHONIOENCODING": "ascii", "LC_ALL": "C"}, check=_stdout_encoding_check
        ),
    ),
    # TMPDIR: Python falls back to /tmp where TMPDIR is unusable; a run without any temporary folder is exit 2.
    A("tmpdir-missing", _tmpdir(lambda c: c.p("no-such-tmp"))),
    A("tmpdir-a-file", _tmpdir(_tmpdir_file)),
    A("tmpdir-dev-full", _tmpdir(lambda c: "/dev/full")),
    A("tmpdir-proc", _tmpdir(lambda c: "/proc")),
    A(
        "tmpdir-no-file-can-be-written-ulimit-f-0",
        lambda c: Run(
            c.base(), USAGE, limits={resource.RLIMIT_FSIZE: 0}, needle="cannot create a temporary file"
        ),
    ),
    # Selectors.
    A(
        "select-only-SYSTEM",
        lambda c: Run(
            c.base(only="SYSTEM", json_out=True),
            JUDGED,
            check=_only_ids(*(f"system.E{n:03d}" for n in range(1, 12))),
        ),
    ),
    A(
        "select-only-Gpu.e001",
        lambda c: Run(c.base(only="Gpu.e001", json_out=True), JUDGED, check=_only_ids("gpu.E001")),
    ),
    A("select-only-unknown-id", lambda c: Run(c.base(only="gpu.E999"), USAGE, needle="unknown check id")),
    A("select-only-a-comma", lambda c: Run(c.base(only=","), JUDGED)),
    A(
        "select-skip-everything-selected",
        lambda c: Run(c.base("--skip", "SYSTEM,Tuning"), USAGE, needle="no checks selected"),
    ),
    A("select-only-workload-with-quick", lambda c: Run(c.base(only="workload"), USAGE)),
    # The command line: unknown flags and commands, misplaced options, hostile values.
    A(
        "cli-unknown-flag",
        lambda c: Run([*c.base(), "--frobnicate"], USAGE, needle="unrecognized arguments: --frobnicate"),
    ),
    A("cli-unknown-subcommand", lambda c: Run(["frobnicate"], USAGE, needle="invalid choice: 'frobnicate'")),
    A(
        "cli-bench-unknown-flag",
        lambda c: Run(["bench", "--frobnicate"], USAGE, needle="hostcheck bench: error:"),
    ),
    A(
        "cli-fleet-unknown-flag",
        lambda c: Run(["fleet", "--frobnicate"], USAGE, needle="hostcheck fleet: error:"),
    ),
    A("fleet-hostile-peer-figures", _fleet_hostile_figures),
    A(
        "cli-check-option-before-subcommand",
        lambda c: Run(["--quick", "bench"], USAGE, needle="given before 'bench'"),
    ),
    A("cli-debug-with-unknown-flag", lambda c: Run(["--debug", "--frobnicate"], USAGE)),
    A("cli-min-score-nan", lambda c: Run(c.base("--min-score", "nan"), USAGE, needle="--min-score")),
    A("cli-huge-only-value", lambda c: Run(c.base(only="x" * 100_000), USAGE, needle="unknown check id")),
    A(
        "cli-workload-section-args-nested-deep",
        lambda c: Run(
            c.base("--workload-section-args", "[" * 50_000), USAGE, needle="--workload-section-args"
        ),
    ),
    A(
        "cli-non-utf8-facts-dir",
        lambda c: Run(c.base("--facts-dir", c.p("facts") + os.fsdecode(b"\xff\xfe")), JUDGED),
    ),
    # Resource limits.
    A("limits-ulimit-n-16", lambda c: Run(c.base(), JUDGED, limits={resource.RLIMIT_NOFILE: 16})),
    A(
        "limits-ulimit-n-16-with-reports",
        lambda c: Run(
            c.base("--junit", c.p("j.xml"), "--prometheus", c.p("p.prom")),
            JUDGED,
            limits={resource.RLIMIT_NOFILE: 16},
            reports=("j.xml", "p.prom"),
        ),
    ),
    # What a small ulimit -v does now and then (a thread that cannot start its own), every time: only the
    # main thread may start threads. Then the ulimit -v itself, from just above hostcheck's import footprint.
    A("limits-threads-cannot-start-threads", _threads_cannot_start_threads),
    A("limits-ulimit-v-footprint+4MiB", _ulimit_v(4)),
    A("limits-ulimit-v-footprint+16MiB", _ulimit_v(16)),
    A("limits-ulimit-v-footprint+24MiB", _ulimit_v(24)),
    A("limits-ulimit-v-footprint+40MiB", _ulimit_v(40)),
    # PATH without the tools (hostcheck and the fake Python are absolute paths), or with tools that lie.
    A(
        "path-nonexistent",
        lambda c: Run(
            c.base(only="system,tuning,gpu"), JUDGED, env={"PATH": "/nonexistent"}, pyflags=("-S",)
        ),
    ),
    A("path-empty", lambda c: Run(c.base(only="system,tuning,gpu"), JUDGED, env={"PATH": ""})),
    A("path-unset", lambda c: Run(c.base(only="system,tuning,gpu"), JUDGED, env={"PATH": None})),
    A(
        "path-tools-that-fail",
        lambda c: Run(
            c.base(only="system,tuning,gpu"),
            JUDGED,
            env={
                "PATH": _path_tools(
                    c,
                    FAILING_TOOL,
                    [
                        "nvidia-smi",
                        "lspci",
                        "systemctl",
                        "journalctl",
                        "dmesg",
                        "numactl",
                        "nv-fabricmanager",
                    ],
                )
            },
            pyflags=("-S",),
        ),
    ),
    A(
        "path-nvidia-smi-talks-garbage",
        lambda c: Run(
            c.base(only="gpu,system"),
            JUDGED,
            env={"PATH": _path_tools(c, GARBAGE_SMI, ["nvidia-smi"]) + ":/usr/bin:/bin"},
            pyflags=("-S",),
        ),
    ),
    # The training Python and its torch.
    A(
        "torch-import-raises",
        lambda c: Run(
            c.base(only="system,torch", python=c.fake_torch(TORCH_RAISES), json_out=True),
            JUDGED,
            check=_torch_not_ok("libcudart.so.12 is broken"),
        ),
    ),
    A(
        "torch-import-raises-systemexit",
        lambda c: Run(
            c.base(only="system,torch", python=c.fake_torch(TORCH_EXITS), json_out=True),
            JUDGED,
            check=_torch_not_ok("exit 3"),
        ),
    ),
    A(
        "torch-import-exits-0-silently",
        lambda c: Run(
            c.base(only="system,torch", python=c.fake_torch(TORCH_VANISHES), json_out=True),
            JUDGED,
            check=_torch_not_ok("exit 0", "no output"),
        ),
    ),
    A(
        "torch-import-hangs",
        lambda c: Run(
            c.base(
                "--torch-timeout", "2", only="system,torch", python=c.fake_torch(TORCH_HANGS), json_out=True
            ),
            JUDGED,
            check=_torch_not_ok("hung in the torch import"),
        ),
    ),
    A(
        "torch-cuda-is_available-raises",
        lambda c: Run(
            c.base(only="system,torch", python=c.fake_torch(TORCH_CUDA_RAISES), json_out=True),
            JUDGED,
            check=_cuda_error_not_hidden,
        ),
    ),
    A(
        "torch-import-leaves-a-daemon",
        lambda c: Run(c.base(only="system,torch", python=c.fake_torch(TORCH_LEAVES_A_DAEMON)), JUDGED),
    ),
    A(
        "torch-import-prints-bad-probe-lines",
        lambda c: Run(c.base(only="system,torch", python=c.fake_torch(TORCH_BAD_MARKERS)), JUDGED),
    ),
    A(
        "python-hangs-with-a-grandchild",
        lambda c: Run(
            c.base(
                "--torch-timeout",
                "1",
                only="system,torch.E001",
                python=c.script("hung/python", HANGING_PYTHON),
                json_out=True,
            ),
            JUDGED,
            check=_torch_not_ok("did not finish"),
        ),
    ),
    A(
        "python-segfaults",
        lambda c: Run(
            c.base(
                only="system,torch.E001", python=c.script("segv/python", "kill -SEGV $$\n"), json_out=True
            ),
            JUDGED,
            check=_torch_not_ok("SIGSEGV"),
        ),
    ),
    A(
        "python-floods-stdout",
        lambda c: Run(
            c.base(
                only="system,torch.E001",
                python=c.script("loud/python", "head -c 50000000 /dev/zero | tr '\\0' x\n"),
            ),
            JUDGED,
        ),
    ),
    A(
        "python-is-a-folder",
        lambda c: Run(c.base(python=str(c.facts)), USAGE, needle="not an executable file"),
    ),
    A(
        "python-not-executable",
        lambda c: Run(c.base(python=_sparse(c.p("python.txt"), 0)), USAGE, needle="not an executable file"),
    ),
    # Four runs at once, one --prometheus and one --junit path.
    A("concurrent-4-runs-share-report-paths", _concurrent),
    # An unprivileged user.
    A("user-nobody-run", _as_nobody, user="nobody"),
    A("user-nobody-report-in-roots-folder", _as_nobody_report_in_roots_folder, user="nobody"),
    # The hardware counters' state file and the host root.
    A("state-file-fifo", _state_fifo),
    A("state-file-symlink-to-dev-zero", _state_dev_zero),
    A("state-file-garbage-json", _state_garbage),
    A("state-file-huge-sparse", _state_huge),
    A("state-folder-is-a-file", _state_folder_is_a_file),
    A("state-folder-unwritable-as-nobody", _state_unwritable_as_nobody, user="nobody"),
    A("host-root-counters-fifo-huge-garbage", _host_root_hostile),
    A("host-root-rdma-fifo-loop-huge-garbage-rate", _rdma_hostile),
    # NCCL's configuration files under the host root (fabric.E009).
    A("nccl-conf-fifo", _nccl_hostile(lambda c, h: os.mkfifo(h / "etc/nccl.conf"), "is a FIFO")),
    A(
        "nccl-conf-huge-sparse",
        _nccl_hostile(lambda c, h: _sparse(str(h / "etc/nccl.conf"), 4 << 30, b"NCCL_IB_HCA=x\n"), "bytes"),
    ),
    A("nccl-conf-binary", _nccl_hostile(_nccl_conf(b"NCCL_IB_HCA=\xff\xfe\x00\x80\n"), "not UTF-8")),
    A(
        "nccl-conf-symlink-to-dev-zero",
        _nccl_hostile(lambda c, h: os.symlink("/dev/zero", h / "etc/nccl.conf"), "character device"),
    ),
    A(
        "nccl-conf-absurd-values",
        _nccl_hostile(_nccl_conf(NCCL_ABSURD), "/etc/nccl.conf:3", "/etc/nccl.conf:4", status="fail"),
    ),
    A(
        "nccl-conf-10000-ib-hca-entries",
        _nccl_hostile(
            _nccl_conf(b"NCCL_IB_HCA=" + b",".join(b"mlx5_%d" % i for i in range(10000)) + b"\n"),
            "more than the 65536 read here",
        ),
    ),
    A(
        "nccl-env-10000-ib-hca-entries",
        _nccl_hostile(
            lambda c, h: c.env_file.write_text(
                "NCCL_IB_HCA=" + ",".join(f"x{i}" for i in range(10000)) + "\n"
            ),
            "more entries not judged",
            status="fail",
        ),
    ),
    A("nccl-conf-file-is-a-fifo", _nccl_hostile(_nccl_conf_file_fifo, "/etc/site-nccl.conf", "is a FIFO")),
]


# --- hostile input: job, fleet, bench and check --config (the hostile-input issue, parts 3-6) --------------
# Every subcommand gets the categories the check rows above cover (report paths, standard streams, ulimits,
# hostile files) and the attacks the issue lists. ``job`` must end with the job's own exit code (3 here).

JOB_RC = (3,)
RECORD = "f=$HOSTCHECK_JOB_DIR/hook-1-1.jsonl; "


def _job(script: str, *opts: str, codes: tuple[int, ...] = JOB_RC, **kw: Any) -> Callable[[Ctx], Run]:
    """``hostcheck job OPTS -- sh -c SCRIPT``, whose own exit code is 3 unless the row says otherwise."""
    return lambda c: Run(["job", *opts, "--", "sh", "-c", script + "; exit 3"], codes, **kw)


def _job_dcgmi(body: str | None, needle: str) -> Callable[[Ctx], Run]:
    """``hostcheck job`` with a fake ``dcgmi`` first on PATH running ``body`` (None: a file that cannot run);
    the job sleeps a second so that dmon is read, and exits 3."""

    def build(c: Ctx) -> Run:
        d = c.root / "bin"
        d.mkdir()
        p = d / "dcgmi"
        p.write_text("not a program" if body is None else "#!/bin/sh\n" + body + "\n")
        p.chmod(0o644 if body is None else 0o755)
        env: dict[str, str | None] = {"PATH": f"{d}{os.pathsep}{os.environ.get('PATH', '')}"}
        return Run(["job", "--", "sh", "-c", "sleep 1; exit 3"], JOB_RC, env=env, needle=needle)

    return build


def _job_report(flag: str, path: Callable[[Ctx], str], codes: tuple[int, ...], needle: str = "") -> Callable:
    def build(c: Ctx) -> Run:
        p = path(c)
        reports = (os.path.relpath(p, c.root),) if p.startswith(str(c.root)) else ()
        return Run(["job", flag, p, "--", "sh", "-c", "exit 3"], codes, needle=needle, reports=reports)

    return build


def _keep_records_mode_kept(c: Ctx) -> Run:
    keep = c.root / "keep"
    keep.mkdir()
    keep.chmod(0o755)

    def check(o: Outcome) -> None:
        assert (o.ctx.root / "keep").stat().st_mode & 0o777 == 0o755

    return Run(
        ["job", "-q", "--keep-records", str(keep), "--", "sh", "-c", "exit 3"],
        JOB_RC,
        reports=("keep",),
        check=check,
    )


def _node_report(host: str, **score: Any) -> str:
    return json.dumps(
        {
            "schema_version": 1,
            "host": {"hostname": host, "gpus": [{"index": 0}]},
            "versions": {"driver": "580.159.04", "torch": "2.11.0"},
            "checks": [{"id": "system.E001", "status": "pass", "weight": 1, "message": "ok"}],
            "score": {"value": 100, "ready": True, **score},
        }
    )


def _fleet_pages_name(*words: str) -> Callable[[Outcome], None]:
    """fleet.md names the bad report with ``words`` and still has the good node's row."""

    def check(o: Outcome) -> None:
        md = (o.ctx.root / "out" / "fleet.md").read_text()
        assert "| gpu001 |" in md and all(w in md for w in words), md
        assert "not ready: gpu009" in o.out, o.out

    return check


def _fleet(
    plant: Callable[[Ctx, Path], Any],
    *extra: str,
    codes: tuple[int, ...] = (1,),
    out: str = "out",
    **kw: Any,
) -> Callable[[Ctx], Run]:
    """``hostcheck fleet nodes --out OUT`` with one good node (gpu001) and whatever ``plant`` puts beside it."""

    def build(c: Ctx) -> Run:
        d = c.root / "nodes"
        d.mkdir()
        (d / "gpu001.json").write_text(_node_report("gpu001"))
        plant(c, d)
        kw.setdefault("reports", ("out",))
        return Run(["fleet", str(d), "--out", os.path.join(c.root, out), *extra], codes, **kw)

    return build


def _bad_node(text: str | bytes, name: str = "gpu009.json") -> Callable[[Ctx, Path], None]:
    def plant(c: Ctx, d: Path) -> None:
        path = d / (os.fsdecode(name) if isinstance(name, bytes) else name)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())

    return plant


def _fleet_md_symlink(c: Ctx) -> Run:
    d = c.root / "nodes"
    d.mkdir()
    (d / "gpu001.json").write_text(_node_report("gpu001"))
    (d / "fleet.md").symlink_to(_sparse(c.p("precious"), 10, b"keep me"))
    return Run(["fleet", str(d)], USAGE, needle="symbolic link")


def _config_rows(prefix: str, run: Callable[[Ctx, str, str], Run], bad_row: bytes) -> list[Any]:
    """``--config PATH`` of a subcommand with a FIFO, a link to /dev/zero, a missing file and a threshold row out of
    range: each a usage error naming the problem (rows ``PREFIX-fifo`` ...)."""
    name = bad_row.split(b" ")[0].decode()
    files: list[tuple[str, Callable[[Ctx], str], str]] = [
        ("fifo", lambda c: _mkfifo(c, "hostcheck.toml"), "a FIFO"),
        ("symlink-to-dev-zero", lambda c: _symlink(c, "hostcheck.toml", "/dev/zero"), "character device"),
        ("missing", lambda c: c.p("absent.toml"), "does not exist"),
        (
            "row-out-of-range",
            lambda c: _written(c, "hostcheck.toml", b"[thresholds]\n" + bad_row + b"\n"),
            name,
        ),
    ]
    return [
        A(f"{prefix}-{what}", lambda c, make=make, needle=needle: run(c, make(c), needle))
        for what, make, needle in files
    ]


def _check_config(c: Ctx, path: str, needle: str) -> Run:
    """``hostcheck check --config PATH``: refused (exit 2)."""
    return Run(c.base("--config", path), USAGE, needle=needle)


def _job_config(c: Ctx, path: str, needle: str) -> Run:
    """``hostcheck job --config PATH``: refused (exit 2) before the command runs (it would leave ``started``)."""

    def check(o: Outcome) -> None:
        assert not (o.ctx.root / "started").exists()

    return _job(f"touch {c.p('started')}", "--config", path, codes=USAGE, needle=needle, check=check)(c)


def _fleet_config(c: Ctx, path: str, needle: str) -> Run:
    """``hostcheck fleet --config PATH``: refused (exit 2), no page written."""
    return _fleet(lambda c, d: None, "--config", path, codes=USAGE, reports=(), needle=needle)(c)


def _bench(c: Ctx, *extra: str, **kw: Any) -> Run:
    """bench against the tiny training Python (no torch): refused in about a second, exit 2."""
    argv = ["bench", "--python", c.python, "--facts-dir", str(c.facts), "--workdir", c.p("bench"), "-q"]
    kw.setdefault("reports", ("bench",))
    return Run([*argv, *extra], kw.pop("codes", USAGE), **kw)


def _config(make: Callable[[Ctx], str], needle: str = "cannot read it") -> Callable[[Ctx], Run]:
    return lambda c: _check_config(c, make(c), needle)


def _written(c: Ctx, name: str, data: bytes) -> str:
    (c.root / name).write_bytes(data)
    return c.p(name)


def _v_limit() -> dict[int, int]:
    return {resource.RLIMIT_AS: (import_footprint_kib() + 40 * 1024) * 1024}


PROBE_WRONG_TYPES = (
    "import sys\n"
    'sys.stdout.write(\'\\nHOSTCHECK_PROBE_JSON:{"torch": 5, "python": 3, "env": [1]}\\n\')\n'
    "sys.stdout.flush()\nimport os\nos._exit(0)\n"
)

HOSTILE_INPUT_ATTACKS = [
    # job: the records folder, which the job itself can write.
    A("job-records-fifo", _job(RECORD + "mkfifo $f", needle="hook-1-1.jsonl: is a FIFO")),
    A("job-records-symlink-to-dev-zero", _job(RECORD + "ln -s /dev/zero $f", needle="is a symbolic link")),
    A("job-records-pid-abc", _job(RECORD + 'echo \'{"k":"proc","pid":"abc"}\' > $f', needle='pid is "abc"')),
    A("job-records-argv-5", _job(RECORD + 'echo \'{"k":"proc","pid":1,"argv":5}\' > $f', needle="argv is 5")),
    A(
        "job-records-nan-batch-times",
        _job(
            RECORD + 'printf \'%s\\n\' \'{"k":"proc","pid":1}\' \'{"k":"b","t":[NaN,1,2,3]}\' > $f',
            needle="NaN",
        ),
    ),
    A("job-records-nested-deep", _job(RECORD + "head -c 200000 /dev/zero | tr '\\0' '[' > $f")),
    A("job-records-sparse-100mb", _job(RECORD + "truncate -s 100M $f")),
    # job: its standard streams, limits and report paths.
    A(
        "job-stderr-closed-with-bad-records",
        _job(RECORD + 'echo \'{"k":"proc","pid":"abc"}\' > $f', stderr="closed"),
    ),
    A("job-stdout-dev-full", _job("echo hello", stdout="devfull")),
    A("job-stdout-closed", _job("true", stdout="closed")),
    A("job-stdin-closed", _job("true", stdin="closed")),
    A("job-ulimit-n-16", _job("true", limits={resource.RLIMIT_NOFILE: 16})),
    A("job-ulimit-v-footprint+40MiB", lambda c: _job("true", limits=_v_limit())(c)),
    A("job-leaves-a-daemon", _job("setsid sleep 300 >/dev/null 2>&1 & true")),
    # job --config: the file is read through the one reader, refused before the command starts.
    *_config_rows("job-config", _job_config, b"input_wait_share = 2"),
    # job: a hostile dcgmi on PATH (DCGM's profiling fields are read through dcgmi dmon when it is there).
    A("job-dcgmi-endless-garbage", _job_dcgmi("exec cat /dev/urandom", "dcgmi dmon gave no row")),
    A(
        "job-dcgmi-hangs-ignoring-signals",
        _job_dcgmi("trap '' INT TERM HUP; while :; do sleep 1; done", "gave no row"),
    ),
    A(
        "job-dcgmi-leaves-a-daemon",
        _job_dcgmi("setsid sleep 300 >/dev/null 2>&1 & exec sleep 300", "gave no row"),
    ),
    A("job-dcgmi-not-executable", _job_dcgmi(None, "")),
    A("job-json-dev-full", _job_report("--json", lambda c: "/dev/full", JOB_RC, "writing /dev/full")),
    A(
        "job-json-symlink",
        _job_report(
            "--json",
            lambda c: _symlink(c, "r.json", _sparse(c.p("precious"), 10, b"x")),
            USAGE,
            "symbolic link",
        ),
    ),
    A("job-json-fifo-no-reader", _job_report("--json", lambda c: _mkfifo(c, "fifo"), JOB_RC, "writing")),
    A("job-png-a-folder", _job_report("--png", lambda c: str(c.facts), USAGE, "is a folder")),
    A("job-keep-records-mode-kept", _keep_records_mode_kept),
    A("job-interval-too-short", _job("true", "--interval", "0.001", codes=USAGE, needle="--interval")),
    A(
        "job-command-never-started",
        lambda c: Run(["job", "--", c.p("no-such-command")], (127,), needle="did not start"),
    ),
    # fleet: node reports are written by the nodes.
    A(
        "fleet-report-fifo",
        _fleet(lambda c, d: os.mkfifo(d / "gpu009.json"), check=_fleet_pages_name("FIFO")),
    ),
    A(
        "fleet-report-symlink-to-dev-zero",
        _fleet(
            lambda c, d: (d / "gpu009.json").symlink_to("/dev/zero"), check=_fleet_pages_name("symbolic link")
        ),
    ),
    A(
        "fleet-report-sparse-100mb",
        _fleet(
            lambda c, d: _sparse(str(d / "gpu009.json"), 100 << 20, b"{"), check=_fleet_pages_name("bytes")
        ),
    ),
    A(
        "fleet-report-string-score",
        _fleet(_bad_node(_node_report("gpu009", value="100")), check=_fleet_pages_name("score.value")),
    ),
    A(
        "fleet-report-nan-score",
        _fleet(
            _bad_node(_node_report("gpu009").replace('"value": 100', '"value": NaN')),
            "--min-score",
            "50",
            check=_fleet_pages_name("NaN"),
        ),
    ),
    A(
        "fleet-report-ready-is-the-string-false",
        _fleet(_bad_node(_node_report("gpu009", ready="false")), check=_fleet_pages_name("score.ready")),
    ),
    A(
        "fleet-report-wrong-shapes",
        _fleet(
            _bad_node('{"checks": {"a": 1}, "host": [], "score": 7}'), check=_fleet_pages_name("want array")
        ),
    ),
    A(
        "fleet-report-nested-deep",
        _fleet(_bad_node("[" * 100_000 + "]" * 100_000), check=_fleet_pages_name("nested too deeply")),
    ),
    A(
        "fleet-report-bad-utf8",
        _fleet(_bad_node(b'{"checks": [], "x": "\xff"}'), check=_fleet_pages_name("not UTF-8")),
    ),
    A(
        "fleet-report-file-name-not-utf8",
        _fleet(_bad_node(_node_report("x"), name=b"gpu009\xff.json"), check=_fleet_pages_name("not UTF-8")),
    ),
    A(
        "fleet-report-html-and-pipes",
        _fleet(
            _bad_node(_node_report("<script>alert(1)</script>|x", ready=False)),
            check=lambda o: _no_raw_html(o.ctx.root / "out"),
        ),
    ),
    A("fleet-page-symlink", _fleet_md_symlink),
    A(
        "fleet-out-a-file",
        _fleet(
            lambda c, d: _sparse(c.p("afile"), 3, b"abc"),
            codes=USAGE,
            out="afile",
            reports=(),
            needle="not a folder",
        ),
    ),
    A(
        "fleet-out-dev-full",
        _fleet(lambda c, d: None, codes=USAGE, out="/dev/full", reports=(), needle="not a folder"),
    ),
    A(
        "fleet-stdout-dev-full",
        _fleet(lambda c, d: None, codes=USAGE, stdout="devfull", needle="writing to standard output"),
    ),
    A("fleet-stdout-closed", _fleet(lambda c, d: None, codes=(0,), stdout="closed")),
    A("fleet-stderr-closed", _fleet(_bad_node("{not json"), stderr="closed")),
    A("fleet-stdin-closed", _fleet(lambda c, d: None, codes=(0,), stdin="closed")),
    A("fleet-ulimit-n-16", _fleet(lambda c, d: None, codes=(0,), limits={resource.RLIMIT_NOFILE: 16})),
    # fleet --config: the same reader, a usage error before any page is written.
    *_config_rows("fleet-config", _fleet_config, b"fleet_peer_tolerance = 0"),
    A(
        "fleet-ulimit-v-footprint+40MiB",
        lambda c: _fleet(lambda c, d: None, codes=(0,), limits=_v_limit())(c),
    ),
    # bench: its options and what it reads, refused before anything starts.
    A(
        "bench-huge-shm-small-beside-a-percentage",
        lambda c: _bench(c, "--shm-small", "99999999999999T", "--shm-large", "50%", needle="--shm-small"),
    ),
    A("bench-seed-negative", lambda c: _bench(c, "--seed", "-1", needle="--seed")),
    A("bench-no-torch", lambda c: _bench(c, needle="has no torch")),
    A(
        "bench-json-symlink",
        lambda c: _bench(c, "--json", _symlink(c, "b.json", c.p("x")), needle="symbolic link"),
    ),
    A("bench-json-dev-full", lambda c: _bench(c, "--json", "/dev/full")),
    A("bench-png-fifo-no-reader", lambda c: _bench(c, "--png", _mkfifo(c, "fifo"))),
    A("bench-facts-fifo", lambda c: (os.mkfifo(c.facts / "gpunode_tuning.fact"), _bench(c))[1]),
    A("bench-stdout-dev-full", lambda c: _bench(c, stdout="devfull")),
    A("bench-stdout-closed", lambda c: _bench(c, stdout="closed")),
    A("bench-stderr-closed", lambda c: _bench(c, stderr="closed")),
    A("bench-stdin-closed", lambda c: _bench(c, stdin="closed")),
    A("bench-ulimit-n-16", lambda c: _bench(c, limits={resource.RLIMIT_NOFILE: 16})),
    A("bench-ulimit-v-footprint+40MiB", lambda c: _bench(c, limits=_v_limit())),
    # check --config: the config file is read through the same reader.
    *_config_rows("config", _check_config, b"gpu_peer_tolerance = 1.5"),
    A("config-symlink-loop", _config(lambda c: _symlink(c, "hostcheck.toml", c.p("hostcheck.toml")), "loop")),
    A("config-a-folder", _config(lambda c: str(c.facts), "a folder")),
    A("config-50mb", _config(lambda c: _sparse(c.p("hostcheck.toml"), 50 << 20, b"# x\n"), "52428800 bytes")),
    A(
        "config-bad-utf8",
        _config(lambda c: _written(c, "hostcheck.toml", b'profile = "\xff"\n'), "not UTF-8"),
    ),
    A(
        "config-nested-deep",
        _config(lambda c: _written(c, "hostcheck.toml", b"x = " + b"[" * 100_000), "not valid TOML"),
    ),
    A(
        "config-stderr-closed",
        lambda c: Run(c.base("--config", _mkfifo(c, "h.toml")), USAGE, stderr="closed"),
    ),
    A(
        "config-ulimit-n-16",
        lambda c: Run(c.base("--config", _mkfifo(c, "h.toml")), USAGE, limits={resource.RLIMIT_NOFILE: 16}),
    ),
    # check: a training Python whose probe prints the wrong types.
    A(
        "torch-probe-prints-wrong-types",
        lambda c: Run(
            c.base(only="system,torch", python=c.fake_torch(PROBE_WRONG_TYPES), json_out=True),
            JUDGED,
            check=_torch_not_ok("wrong types", "record.torch is 5"),
        ),
    ),
]


# --- baseline: the configuration file it writes into, and what it reads under --host-root ---------------------
# --write names a file others may have put anything at: refused before anything is read, or replaced atomically
# with only its [baseline] section changed; the host root's files are read through the bounded reader.


def _host(c: Ctx) -> str:
    """A small host root: memory and one CPU, enough for a section."""
    (c.root / "host/proc").mkdir(parents=True)
    (c.root / "host/proc/meminfo").write_text("MemTotal:       2113311792 kB\n")
    (c.root / "host/proc/cpuinfo").write_text("processor\t: 0\nmodel name\t: X\n")
    return c.p("host")


def _baseline(*argv: str, codes: tuple[int, ...] = USAGE, **kw: Any) -> Callable[[Ctx], Run]:
    """``hostcheck baseline --host-root <small host> ARGV``; ARGV's "{}" is the attack's folder."""
    return lambda c: Run(
        ["baseline", "--host-root", _host(c), *(a.format(c.root) for a in argv)], codes, **kw
    )


def _baseline_write(make: Callable[[Ctx], str], needle: str, codes: tuple[int, ...] = USAGE) -> Callable:
    def build(c: Ctx) -> Run:
        host = _host(c)
        return Run(["baseline", "--host-root", host, "--write", make(c)], codes, needle=needle)

    return build


def _baseline_kept(c: Ctx) -> Run:
    """An existing configuration: only its [baseline] section replaced, in one rename, every other byte kept."""
    head = '# the site\'s own\nprofile = "passive"\n\n[slurm]\ndrain = true\n'
    Path(c.p("hostcheck.toml")).write_text(head + "\n[baseline]\ncpu_cores = 99\n")

    def check(o: Outcome) -> None:
        text = Path(c.p("hostcheck.toml")).read_text()
        assert text.startswith(head + "\n[baseline]\n") and "cpu_cores = 1\n" in text, text

    return Run(
        ["baseline", "--host-root", _host(c), "--write", c.p("hostcheck.toml")],
        (0,),
        reports=("hostcheck.toml",),
        check=check,
    )


def _baseline_host_hostile(c: Ctx) -> Run:
    """A host root whose files are a FIFO, /dev/zero, a huge file and garbage: read without blocking, never an
    internal error."""
    host = Path(_host(c))
    os.mkfifo(host / "proc/cpuinfo.fifo")
    (host / "proc/cpuinfo").unlink()
    os.symlink("/dev/zero", host / "proc/cpuinfo")
    net = host / "sys/class/net/eth0"
    (net / "device").mkdir(parents=True)
    os.mkfifo(net / "speed")
    _sparse(str(net / "type"), 4 << 30)
    nvme = host / "sys/class/nvme/nvme0/nvme0n1"
    nvme.mkdir(parents=True)
    (nvme / "size").write_bytes(b"9" * 100000)
    (nvme.parent / "model").write_bytes(b"\xff\x00" * 1000)
    rate = host / "sys/class/infiniband/mlx5_0/ports/1"
    rate.mkdir(parents=True)
    os.mkfifo(rate / "rate")
    return Run(["baseline", "--host-root", str(host), "--json"], (0,))


def _baseline_signalled(sig: int) -> Callable[[Ctx], Run]:
    """``sig`` while baseline waits on a hung nvidia-smi (no nvidia-ml-py under ``-S``: the fallback runs it), which
    leaves a grandchild in a session of its own: exit 128 + N, every child gone."""

    def build(c: Ctx) -> Run:
        smi = c.script("bin/nvidia-smi", HANGING_PYTHON)
        env: dict[str, str | None] = {
            "PATH": f"{os.path.dirname(smi)}{os.pathsep}{os.environ.get('PATH', '')}"
        }
        needle = "" if sig == signal.SIGKILL else f"interrupted by {signal.Signals(sig).name}"
        argv = ["baseline", "--host-root", _host(c)]
        return Run(argv, (SIGNAL_EXITS[sig],), env=env, signal=sig, needle=needle, pyflags=("-S",))

    return build


BASELINE_ATTACKS = [
    A("signal-sigint-mid-baseline", _baseline_signalled(signal.SIGINT)),
    A("signal-sigterm-mid-baseline", _baseline_signalled(signal.SIGTERM)),
    A("signal-sighup-mid-baseline", _baseline_signalled(signal.SIGHUP)),
    A("signal-sigkill-mid-baseline", _baseline_signalled(signal.SIGKILL)),
    A("baseline-write-fifo", _baseline_write(lambda c: _mkfifo(c, "h.toml"), "a FIFO")),
    A("baseline-write-symlink", _baseline_write(lambda c: _symlink(c, "h.toml", c.p("x")), "symbolic link")),
    A(
        "baseline-write-dev-zero-symlink",
        _baseline_write(lambda c: _symlink(c, "h.toml", "/dev/zero"), "symbolic"),
    ),
    A("baseline-write-a-folder", _baseline_write(lambda c: str(c.facts), "a folder")),
    A("baseline-write-dev-null", _baseline_write(lambda c: "/dev/null", "character device")),
    A("baseline-write-empty-path", _baseline_write(lambda c: "", "empty path")),
    A("baseline-write-folder-missing", _baseline_write(lambda c: c.p("nowhere/h.toml"), "does not exist")),
    A(
        "baseline-write-config-50mb",
        _baseline_write(lambda c: _sparse(c.p("h.toml"), 50 << 20, b"# x\n"), "52428800 bytes"),
    ),
    A(
        "baseline-write-config-bad-utf8",
        _baseline_write(lambda c: _written(c, "h.toml", b'profile = "\xff"\n'), "not UTF-8"),
    ),
    A(
        "baseline-write-config-nested-deep",
        _baseline_write(lambda c: _written(c, "h.toml", b"x = " + b"[" * 100_000), "not valid TOML"),
    ),
    A(
        "baseline-write-config-bad-baseline",
        _baseline_write(
            lambda c: _written(c, "h.toml", b'[baseline]\ncpu_cores = "8"\n'), "baseline.cpu_cores"
        ),
    ),
    A(
        "baseline-write-config-dotted-key",
        _baseline_write(
            lambda c: _written(c, "h.toml", b"baseline.cpu_cores = 8\n[xid]\nfail = [79]\n"),
            "cannot be placed",
        ),
    ),
    A("baseline-write-existing-config-kept", _baseline_kept),
    A(
        "baseline-write-in-roots-folder-as-nobody",
        lambda c: Run(
            ["baseline", "--host-root", _host(c), "--write", c.p("rootonly/h.toml")],
            USAGE,
            needle="its folder is not writable",
        ),
        user="nobody",
    ),
    A("baseline-host-root-hostile", _baseline_host_hostile),
    A(
        "baseline-json-with-write",
        _baseline("--json", "--write", "{}/h.toml", needle="cannot go with --write"),
    ),
    A("baseline-stdout-dev-full", _baseline(stdout="devfull", needle="writing to standard output")),
    A("baseline-stdout-closed", _baseline(stdout="closed")),
    A("baseline-stdout-broken-pipe", _baseline(codes=(0,), stdout="broken")),
    A("baseline-stderr-closed", _baseline(codes=(0,), stderr="closed")),
    A("baseline-ulimit-n-16", _baseline(codes=ANY, limits={resource.RLIMIT_NOFILE: 16})),
    A("baseline-ulimit-v-footprint+40MiB", _baseline(codes=(0,), limits=_v_limit())),
]
ATTACKS += BASELINE_ATTACKS


def _no_raw_html(out: Path) -> None:
    md, page = (out / "fleet.md").read_text(), (out / "fleet.html").read_text()
    assert "<script" not in md and "<script" not in page
    row = next(line for line in md.splitlines() if "gpu009" in line)
    assert row.count(" | ") == 6, row


ATTACKS += HOSTILE_INPUT_ATTACKS


# --- hostile dcgmi: DCGM's diagnostic and health watches (gpu.E030-E034) ---------------------------------------
# A fake dcgmi first on PATH answers ``health`` with HEALTH and ``diag`` with the row's body. Whatever it prints
# or however long it takes, gpu.E030 says it could not run (an error, never a fail) and nothing stays behind.

DCGM_IDS = "gpu.E030,gpu.E031,gpu.E032,gpu.E033,gpu.E034"
HEALTHY = '{"body": {"Overall Health": {"value": "Healthy"}}, "header": ["Health Monitor Report"]}'


def _check_dcgmi(diag: str, *words: str, deadline: str | None = None, health: str | None = None) -> Callable:
    """``check --profile full`` (dcgmi diag -r 2) with the fake dcgmi; gpu.E030 is an error naming ``words``."""

    def build(c: Ctx) -> Run:
        d = c.root / "bin"
        d.mkdir()
        answer = health if health is not None else f"echo '{HEALTHY}'"
        c.script("bin/dcgmi", f'case "$1" in health) {answer};; diag) {diag};; esac\n')
        extra = ["--profile", "full", *(["--deadline", deadline] if deadline else [])]
        # A small host root: its proc holds no Slurm job step, whatever runs on this machine (an idle node).
        extra += ["--host-root", _host(c)]
        env: dict[str, str | None] = {"PATH": f"{d}{os.pathsep}{os.environ.get('PATH', '')}"}
        return Run(c.base(*extra, only=DCGM_IDS, json_out=True), JUDGED, env=env, check=_dcgm_error(*words))

    return build


def _dcgm_error(*words: str) -> Callable[[Outcome], None]:
    def check(o: Outcome) -> None:
        status, message = _status(o, "gpu.E030")
        assert status == "error" and "could not run" in message and all(w in message for w in words), message
        assert not any(c["status"] == "fail" for c in o.checks().values())
        assert o.rc == 1

    return check


DCGM_ATTACKS = [
    A("dcgmi-diag-huge-output", _check_dcgmi("head -c 50000000 /dev/zero | tr '\\0' x", "more than")),
    A("dcgmi-diag-endless-binary", _check_dcgmi("exec cat /dev/urandom", "more than")),
    A(
        "dcgmi-diag-deep-json-nesting",
        _check_dcgmi(
            "printf '{\"DCGM Diagnostic\": '; head -c 200000 /dev/zero | tr '\\0' '['; echo", "deeper than"
        ),
    ),
    A(
        "dcgmi-diag-truncated-json",
        _check_dcgmi('printf \'{"DCGM Diagnostic": {"test_categories": [{\'', "JSON"),
    ),
    A(
        "dcgmi-diag-hangs-ignoring-signals",
        _check_dcgmi("trap '' INT TERM HUP; while :; do sleep 1; done", "timed out", deadline="12"),
    ),
    A(
        "dcgmi-diag-leaves-a-daemon",
        _check_dcgmi("setsid sleep 300 >/dev/null 2>&1 & exec sleep 300", "timed out", deadline="12"),
    ),
    A(
        "dcgmi-health-hangs-too",
        _check_dcgmi("exec sleep 300", "", deadline="14", health="exec sleep 300"),
    ),
]
ATTACKS += DCGM_ATTACKS


# --- names that would forge a report line or a terminal escape ---------------------------------------------------
# A GPU's and a NIC's PCI folder, a disk's model (what the host root holds), a process on a GPU (nvidia-smi's
# answer, through its fallback when nvidia-ml-py is absent) and, on the fleet page, a node's own report: each holds
# a new line that starts a line of its own ("[PASS] ...") and an OSC escape that retitles a terminal (xterm's
# ctlseqs: ESC ] 0 ; text BEL). Text, Markdown and HTML show them escaped, never raw.

FORGED = "\n[PASS] gpu.E001 NVIDIA driver and NVML: all good\x1b]0;pwned\x07"
FORGED_SHOWN = "\\n[PASS] gpu.E001 NVIDIA driver and NVML: all good\\x1b]0;pwned\\x07"
#: nvidia-smi's CSV answers (gather/smi.py's fields, in its order) naming a GPU and a process with the escape.
FORGING_SMI = r"""e=$(printf '\033]0;pwned\007')
case "$*" in
*query-gpu*) echo "0, NVIDIA H100 80GB HBM3$e, GPU-1, 00000000:18:00.0, 580.159.04, 9.0, 81559, Enabled, Enabled,\
 0, 0, 0, 0, No, 5, 5, 16, 16, 0x0000000000000001, 40, Enabled";;
*query-compute-apps*) echo "00000000:18:00.0, 4242, python$e, 1024";;
esac
"""


def _forged_host(c: Ctx) -> list[str]:
    """A host root whose GPU and NIC PCI folders and NVMe model carry FORGED, AER errors on both, a baseline
    that names another drive, and a fake nvidia-smi; check's options to read it all."""
    host = c.root / "host"
    for name, cls in (
        ("0000:18:00.0", "0x030200"),
        ("0000:1a:00.0", "0x020700"),
    ):  # a GPU and an InfiniBand NIC
        dev = host / "sys/bus/pci/devices" / (name + FORGED)
        dev.mkdir(parents=True)
        (dev / "vendor").write_text("0x10de\n" if cls.startswith("0x03") else "0x15b3\n")
        (dev / "class").write_text(cls + "\n")
        for f, key in (("fatal", "FATAL"), ("nonfatal", "NONFATAL"), ("correctable", "COR")):
            (dev / f"aer_dev_{f}").write_text(f"TOTAL_ERR_{key} 3\n")
    drive = host / "sys/class/nvme/nvme0"
    (drive / "nvme0n1").mkdir(parents=True)
    (drive / "model").write_text("Disk" + FORGED + "\n")
    (drive / "nvme0n1/size").write_text("2000\n")
    _written(c, "h.toml", b'[baseline]\nnvme = [{model = "Other", size_bytes = 1024000}]\n')
    c.script("bin/nvidia-smi", FORGING_SMI)
    ids = "system.E009,baseline.E003,gpu.E012"
    return c.base("--host-root", str(host), "--config", c.p("h.toml"), only=ids)


def _not_forged(text: str, *shown: str) -> None:
    """No raw escape and no line a name started; each of ``shown`` (the planted text, escaped) in the text, read
    with its wrapped lines joined."""
    assert "\x1b" not in text and "\x07" not in text, repr(text[:3000])
    assert not any(line.lstrip().startswith("[PASS]") for line in text.splitlines()), text
    joined = " ".join(text.split())
    assert all(s in joined for s in shown), text


def _forged_text(*extra: str) -> Callable[[Ctx], Run]:
    def build(c: Ctx) -> Run:
        def check(o: Outcome) -> None:
            _not_forged(
                o.out, "0000:18:00.0" + FORGED_SHOWN, "Disk" + FORGED_SHOWN, "python\\x1b]0;pwned\\x07[4242]"
            )
            assert "0000:1a:00.0" + FORGED_SHOWN in " ".join(o.out.split()) or "--verbose" not in extra, o.out

        env: dict[str, str | None] = {"PATH": f"{c.root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
        return Run([*_forged_host(c), *extra], JUDGED, env=env, pyflags=("-S",), check=check)

    return build


def _forged_fleet(c: Ctx, d: Path) -> None:
    finding = {
        "id": "gpu.E001",
        "status": "fail",
        "weight": 5,
        "message": "driver" + FORGED,
        "hint": "fix" + FORGED,
    }
    doc = json.loads(_node_report("gpu009" + FORGED, ready=False, value=40))
    doc["checks"].append(finding)
    doc["versions"]["driver"] = "580" + FORGED
    (d / "gpu009.json").write_text(json.dumps(doc))


def _forged_pages(o: Outcome) -> None:
    md, page = (o.ctx.root / "out" / "fleet.md").read_text(), (o.ctx.root / "out" / "fleet.html").read_text()
    in_md = FORGED_SHOWN.replace("\\", "\\\\")  # Markdown's own escape of the backslash: it reads "\n"
    _not_forged(md, "gpu009" + in_md, "driver" + in_md, "fix" + in_md, "580" + in_md)
    _not_forged(page, "gpu009" + FORGED_SHOWN, "driver" + FORGED_SHOWN, "fix" + FORGED_SHOWN)
    row = next(line for line in md.splitlines() if "gpu009" in line)
    assert row.count(" | ") == 6, row


def _forged_job_check(o: Outcome) -> None:
    _not_forged(o.err, "error Boom\\x1b]0;pwned\\x07: bad")


#: A hook record of the job's own (the job writes its records: hostile by design) whose error type holds the OSC
#: escape; its message's second line is a forged one (the report shows the first line of a message).
FORGED_JOB = (
    RECORD + 'printf \'%s\\n\' \'{"k":"proc","pid":1}\' '
    '\'{"k":"err","type":"Boom\\u001b]0;pwned\\u0007","message":"bad\\n[PASS] all good"}\' > $f'
)

FORGING_ATTACKS = [
    A("names-forge-lines-and-escapes-text", _forged_text()),
    A("names-forge-lines-and-escapes-job-report", _job(FORGED_JOB, check=_forged_job_check)),
    A("names-forge-lines-and-escapes-text-verbose", _forged_text("--verbose")),
    A("names-forge-lines-and-escapes-fleet-markdown-html", _fleet(_forged_fleet, check=_forged_pages)),
]
ATTACKS += FORGING_ATTACKS


# --- the surfaces added last: every tool bounded, every number strict, the host root confined, the baseline and
# --- state files kept -----------------------------------------------------------------------------------------
# Tools are fakes first on PATH (-S: no nvidia-ml-py, so the nvidia-smi fallback runs), host roots small trees.
# A tool that prints 1 GB or for ever costs hostcheck the output cap and no more: the runs are held to an address
# space of hostcheck's import footprint plus TOOL_ROOM (the cap, its text, the threads' stacks), in which reading
# the flood whole (as communicate() did) ends in a MemoryError.

TOOL_ROOM_MIB = 192
GIGABYTE = "exec head -c 1000000000 /dev/zero\n"
FOR_EVER = "exec yes 'a tool that never stops talking'\n"


def _room() -> dict[int, int]:
    return {resource.RLIMIT_AS: (import_footprint_kib() + TOOL_ROOM_MIB * 1024) * 1024}


def _tool_path(c: Ctx, tools: dict[str, str]) -> dict[str, str | None]:
    for name, body in tools.items():
        c.script(f"bin/{name}", body)
    return {"PATH": f"{c.p('bin')}{os.pathsep}{os.environ.get('PATH', '')}"}


def _said(check_id: str, *words: str, statuses: tuple[str, ...] = ("error",)) -> Callable[[Outcome], None]:
    """``check_id`` has one of ``statuses`` and its message or details name ``words``."""

    def check(o: Outcome) -> None:
        c = o.checks()[check_id]
        text = " ".join([c["message"], *c.get("details", [])])
        assert c["status"] in statuses and all(w in text for w in words), (c["status"], text)

    return check


def _smi_floods(body: str) -> Callable[[Ctx], Run]:
    def build(c: Ctx) -> Run:
        env = _tool_path(c, {"nvidia-smi": body})
        argv = c.base(only="gpu.E001", json_out=True)
        check = _said("gpu.E001", "nvidia-smi printed more than 8388608 bytes")
        return Run(argv, JUDGED, env=env, pyflags=("-S",), limits=_room(), check=check)

    return build


def _log_floods(c: Ctx) -> Run:
    """journalctl prints 1 GB of kernel lines: its last 8 MiB are read and the source says it was cut."""
    env = _tool_path(
        c, {"journalctl": "yes '2026-01-01T00:00:00+0000 host kernel: a line' | head -c 1000000000\n"}
    )
    argv = c.base("--host-root", _host(c), only="system.E007", json_out=True)
    check = _said("system.E007", "cut: only its last 8 MiB read", statuses=("pass",))
    return Run(argv, JUDGED, env=env, limits=_room(), check=check)


def _ras_floods(c: Ctx) -> Run:
    env = _tool_path(c, {"ras-mc-ctl": FOR_EVER, "journalctl": "exit 0\n"})
    argv = c.base("--host-root", _host(c), only="system.E007", json_out=True)
    check = _said("system.E007", "rasdaemon: ras-mc-ctl printed more than", statuses=("pass", "error"))
    return Run(argv, JUDGED, env=env, limits=_room(), check=check)


# perftest's server banner (perftest_parameters.c prints it to stdout while the server waits), then its client.
IB_WRITE_BW = """\
for a in "$@"; do last="$a"; case "$a" in mlx5_*) dev="$a";; esac; done
case "$last" in
  127.0.0.1) ;;
  *) echo "************************************"
     echo "* Waiting for client to connect... *"
     echo "************************************"
     echo "server on $dev" >&2
     exec sleep 60 ;;
esac
[ "$dev" = mlx5_0 ] && { echo "Couldn't allocate MR with CUDA" >&2; exit 1; }
echo " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
echo " 8388608    29172            0.00               391.62               0.005861"
"""


def _ib_host(c: Ctx, devices: int = 2, numa: str = "0\n", extra_port: str = "") -> str:
    """A host root with ``devices`` ACTIVE 400 Gb/s InfiniBand ports (mlx5_0, mlx5_1, ...)."""
    for i in range(devices):
        dev = c.root / f"host/sys/class/infiniband/mlx5_{i}"
        port = dev / "ports/1"
        port.mkdir(parents=True)
        for name, text in (
            ("state", "4: ACTIVE\n"),
            ("phys_state", "5: LinkUp\n"),
            ("rate", "400 Gb/sec (4X NDR)\n"),
            ("link_layer", "InfiniBand\n"),
        ):
            (port / name).write_text(text)
        (dev / "device").mkdir()
        (dev / "device/numa_node").write_text(numa)
        if extra_port:
            (dev / "ports" / extra_port).mkdir()
    return c.p("host")


def _gdr_banner(c: Ctx) -> Run:
    """ib_write_bw's server prints a banner while it waits (to stdout, as perftest does): it never reaches
    hostcheck's --json. The one NIC (one GPU, the tiny Python's plan) fails: none is said to have written. The NIC
    and the GPU share a PCIe switch (tests/unit/fixtures/fabrictree.py): the probe pairs by topology only."""
    import fabrictree

    env = _tool_path(c, {"ib_write_bw": IB_WRITE_BW, "numactl": 'shift 4\nexec "$@"\n'})
    host = c.root / "host"
    fabrictree.switch(host, fabrictree.Node(), 0x15, 0, [0x18], [fabrictree.Nic("mlx5_0", 0x19, 0)])
    argv = ["check", "--profile", "full", "--only", "workload.E018", "--workload-sections", "gdr_write"]
    argv += ["--host-root", str(host), "--python", c.python, "--facts-dir", str(c.facts)]
    argv += ["--env-file", str(c.env_file), "--state-file", str(c.state), "--json"]

    def check(o: Outcome) -> None:
        status, message = _status(o, "workload.E018")  # the document parses: no banner inside it
        assert "Waiting for client" not in o.out + o.err and "server on" not in o.out + o.err
        if status == "skip" and "Slurm job" in message:  # another Slurm job runs on this machine
            pytest.skip(f"the workload does not start beside another job here: {message}")
        assert status == "error" and message == "no NIC wrote into GPU memory (1 NIC not measured)", message

    return Run(argv, JUDGED, env=env, check=check)


def _edac_tree(c: Ctx, ce: str | None, ue: str) -> Path:
    mc = c.root / "host/sys/devices/system/edac/mc/mc0"
    mc.mkdir(parents=True)
    if ce is not None:
        (mc / "ce_count").write_text(ce)
    (mc / "ue_count").write_text(ue)
    return mc


def _non_ascii_digits(c: Ctx) -> Run:
    """Counters and /proc fields written in digits that are not ASCII ("²" passes str.isdigit, int() raises; "٣"
    int() reads as 3): each is an unreadable value, never a number and never the whole gatherer lost."""
    _edac_tree(c, "\u00b2\n", "\u0663\n")
    # The start time (field 22) in "²"; pids and tids named "²"; and one task that reads.
    tasks = (
        ("\u00b2", "1", "0", "D"),
        ("78", "\u00b2", "0", "D"),
        ("79", "79", "\u00b2", "D"),
        ("80", "80", "7", "S"),
    )
    for pid, tid, start, state in tasks:
        task = c.root / f"host/proc/{pid}/task/{tid}"
        task.mkdir(parents=True)
        (task / "stat").write_text(f"{pid} (x) {state} " + " ".join(["0"] * 18 + [start]) + " 0 0\n")
        (task / "status").write_text("voluntary_ctxt_switches:\t1\nnonvoluntary_ctxt_switches:\t1\n")

    def check(o: Outcome) -> None:
        statuses = {cid: r["status"] for cid, r in o.checks().items()}
        assert "error" not in statuses.values(), o.checks()
        assert statuses["system.E006"] == "skip" and statuses["system.E008"] == "pass", statuses

    argv = c.base("--host-root", c.p("host"), only=HARDWARE, json_out=True)
    return Run(argv, JUDGED, check=check)


def _rdma_non_ascii(c: Ctx) -> Run:
    """A port folder named "²" and a NUMA node of "٣": not port 2 and not node 3, and never the fabric gatherer
    lost; port 1 is judged."""
    host = _ib_host(c, devices=1, numa="\u0663\n", extra_port="\u00b2")
    argv = c.base("--host-root", host, only="fabric.E001", json_out=True)
    return Run(argv, JUDGED, check=_said("fabric.E001", "1 RDMA port ACTIVE/LinkUp", statuses=("pass",)))


def _baseline_non_ascii(c: Ctx) -> Run:
    """MemTotal in Arabic-Indic digits and an RDMA port named "²": memory is left out (said), the rest recorded."""
    host = _host(c)
    (c.root / "host/proc/meminfo").write_text("MemTotal:       \u0663\u0663\u0663 kB\n")
    _ib_host(c, devices=1, extra_port="\u00b2")

    def check(o: Outcome) -> None:
        doc = json.loads(o.out)
        assert doc.get("cpu_threads") == 1 and "memory_bytes" not in doc, doc
        # No GPU in this tree: the port's GPU and distance are recorded as none.
        want = {"name": "mlx5_0:1", "rate_gbps": 400, "link_layer": "InfiniBand", "gpu": "", "distance": ""}
        assert doc.get("rdma") == [want], doc
        assert "memory: not recorded" in o.err, o.err

    return Run(["baseline", "--host-root", host, "--json"], (0,), check=check)


def _rdma_past_the_cap(c: Ctx) -> Run:
    """1,100 RDMA devices: the first 1,024 are judged and the report says 76 were not read (never a quiet cut)."""
    _ib_host(c, devices=1100)
    argv = c.base("--host-root", c.p("host"), only="fabric.E001", json_out=True)
    check = _said("fabric.E001", "76 RDMA devices past the first 1024 not read", statuses=("warn",))
    return Run(argv, JUDGED, check=check)


def _host_root_not_a_folder(c: Ctx) -> str:
    Path(c.p("a-file")).write_text("")
    return c.p("a-file")


def _proc_outside(c: Ctx) -> Run:
    """The tree's proc is a link to the machine's /proc: outside the host root, so not followed (the machine's own
    tasks are not the node's under --host-root); system.E008 says so instead of passing."""
    (c.root / "host").mkdir()
    os.symlink("/proc", c.root / "host/proc")
    argv = c.base("--host-root", c.p("host"), only="system.E008", json_out=True)
    return Run(argv, JUDGED, check=_said("system.E008", "outside the host root", statuses=("skip",)))


def _counter_outside(c: Ctx) -> Run:
    """A counter that is a link to a file outside the tree (absolute): not followed; its controller is unreadable."""
    Path(c.p("outside")).write_text("5\n")
    mc = _edac_tree(c, None, "0\n")
    os.symlink(c.p("outside"), mc / "ce_count")
    argv = c.base("--host-root", c.p("host"), only="system.E006", json_out=True)
    return Run(argv, JUDGED, check=_said("system.E006", "outside the host root", statuses=("skip",)))


def _baseline_keeps(owner: int, mode: int, text: str) -> Callable[[Ctx], Run]:
    """--write into an existing configuration (owned by ``owner``, ``mode``): replaced in one rename, owner and
    mode kept."""

    def build(c: Ctx) -> Run:
        path = c.root / "h.toml"
        path.write_text(text)
        os.chown(path, owner, owner)
        path.chmod(mode)

        def check(o: Outcome) -> None:
            st = os.stat(path)
            assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (owner, mode), (st.st_uid, oct(st.st_mode))
            assert "[baseline]" in path.read_text()

        argv = ["baseline", "--host-root", _host(c), "--write", str(path)]
        return Run(argv, (0,), reports=("h.toml",), check=check)

    return build


def _baseline_past_the_read_limit(c: Ctx) -> Run:
    """A configuration just under the 1 MiB hostcheck reads: with the section it would be over, a file every later
    check would refuse. Refused before writing, the file as it was."""
    line = "# " + "x" * 98 + "\n"
    (c.root / "h.toml").write_text(line * ((1 << 20) // len(line) - 1))
    argv = ["baseline", "--host-root", _host(c), "--write", c.p("h.toml")]
    return Run(argv, USAGE, needle="more than the 1048576 hostcheck reads")


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _baseline_leftover(c: Ctx) -> Run:
    """A temporary file a writer killed with SIGKILL left beside the configuration: removed by the next write."""
    (c.root / "h.toml").write_text('profile = "passive"\n')
    tmp = f".h.toml.hostcheck-{_dead_pid()}-0123456789ab.tmp"
    (c.root / tmp).write_text("half a file")

    def check(o: Outcome) -> None:
        assert not (c.root / tmp).exists() and "[baseline]" in (c.root / "h.toml").read_text()

    argv = ["baseline", "--host-root", _host(c), "--write", c.p("h.toml")]
    return Run(argv, (0,), reports=("h.toml", tmp), check=check)


def _baseline_sigterm_locked(c: Ctx) -> Run:
    """SIGTERM while --write waits for the folder another writer holds: exit 143, the file as it was, no
    temporary file left (the listing of the folder is compared)."""
    (c.root / "h.toml").write_text('profile = "passive"\n')
    argv = ["baseline", "--host-root", _host(c), "--write", c.p("h.toml")]
    return Run(
        argv,
        (143,),
        signal=signal.SIGTERM,
        signal_when=f"holding:{c.root}",
        hold_lock=".",
        needle="interrupted by SIGTERM",
    )


def _state_foreign(c: Ctx) -> Run:
    """A JSON file that is not hostcheck's at --state-file: warned about and left byte for byte."""
    foreign = '{"schema": 2, "written_by": "another tool"}\n'
    Path(c.p("theirs.json")).write_text(foreign)

    def check(o: Outcome) -> None:
        assert Path(c.p("theirs.json")).read_text() == foreign
        _said("system.E010", "left as it is", "not a hostcheck state file", statuses=("warn",))(o)

    return Run(c.base(only=HARDWARE, json_out=True, state=c.p("theirs.json")), JUDGED, check=check)


def _state_is(flag: str) -> Callable[[Ctx], Run]:
    def build(c: Ctx) -> Run:
        path = c.p("out.file")
        return Run(c.base(flag, path, only=HARDWARE, state=path), USAGE, needle="name the same file")

    return build


def _state_is_stdout(c: Ctx) -> Run:
    link = _symlink(c, "stdout.json", "/proc/self/fd/1")
    return Run(c.base(only=HARDWARE, json_out=True, state=link), USAGE, needle="is the standard output")


HARDEN_ATTACKS = [
    # One bounded way to run a tool: a flood is stopped at the cap, a log flood keeps its newest part.
    A(
        "tool-nvidia-smi-prints-1gb",
        _smi_floods(GIGABYTE),
        expect="gpu.E001 error 'printed more than'; memory bounded",
    ),
    A("tool-nvidia-smi-prints-for-ever", _smi_floods(FOR_EVER), expect="gpu.E001 error 'printed more than'"),
    A(
        "tool-journalctl-prints-1gb",
        _log_floods,
        expect="system.E007 judges the last 8 MiB and says it was cut",
    ),
    A(
        "tool-ras-mc-ctl-prints-for-ever",
        _ras_floods,
        expect="rasdaemon's answer stopped and said, never judged",
    ),
    A(
        "tool-ib-write-bw-banner-and-a-failed-nic",
        _gdr_banner,
        expect="--json whole; no NIC said to have written",
    ),
    # One strict number parser, each part of a gatherer on its own.
    A(
        "numbers-non-ascii-digits-in-host-files",
        _non_ascii_digits,
        expect="unreadable values, no gatherer lost",
    ),
    A("numbers-non-ascii-rdma-port-and-numa", _rdma_non_ascii, expect="fabric.E001 passes port 1, no error"),
    A(
        "numbers-non-ascii-in-the-baseline",
        _baseline_non_ascii,
        expect="memory left out and said, the rest kept",
    ),
    # No silent truncation.
    A("rdma-1100-devices-past-the-cap", _rdma_past_the_cap, expect="fabric.E001 warns: 76 devices not read"),
    # The host root: a readable folder, and nothing outside it followed.
    A(
        "host-root-missing",
        lambda c: Run(c.base("--host-root", c.p("nowhere")), USAGE, needle="--host-root"),
        expect="usage error, exit 2, not READY",
    ),
    A(
        "host-root-a-file",
        lambda c: Run(c.base("--host-root", _host_root_not_a_folder(c)), USAGE, needle="not a folder"),
        expect="usage error, exit 2",
    ),
    A(
        "baseline-host-root-missing",
        lambda c: Run(["baseline", "--host-root", c.p("nowhere")], USAGE, needle="--host-root"),
        expect="usage error, exit 2, nothing recorded",
    ),
    A(
        "host-root-proc-links-to-the-machines-proc",
        _proc_outside,
        expect="system.E008 skips: outside the root",
    ),
    A(
        "host-root-counter-links-outside",
        _counter_outside,
        expect="system.E006 skips: the link is not followed",
    ),
    # baseline --write keeps data.
    A(
        "baseline-write-keeps-owner-and-mode",
        _baseline_keeps(65534, 0o640, '# the site\'s\nprofile = "passive"\n'),
        expect="written; owner nobody and mode 0640 kept",
    ),
    A(
        "baseline-write-empty-file-keeps-its-mode",
        _baseline_keeps(0, 0o600, ""),
        expect="written; mode 0600 kept",
    ),
    A(
        "baseline-write-never-past-the-read-limit",
        _baseline_past_the_read_limit,
        expect="usage error, the file untouched",
    ),
    A(
        "baseline-write-removes-a-dead-writers-temp",
        _baseline_leftover,
        expect="written; the leftover removed",
    ),
    A(
        "baseline-write-sigterm-while-the-folder-is-locked",
        _baseline_sigterm_locked,
        expect="exit 143, file untouched, no temporary file",
    ),
    # The state file: never another's file, never a report's path or the standard output.
    A(
        "state-file-foreign-json-left-untouched",
        _state_foreign,
        expect="system.E010 warns; the file byte for byte",
    ),
    A("state-file-same-as-prometheus", _state_is("--prometheus"), expect="usage error, exit 2"),
    A("state-file-same-as-junit", _state_is("--junit"), expect="usage error, exit 2"),
    A("state-file-is-the-json-stdout", _state_is_stdout, expect="usage error, exit 2, the link untouched"),
]
ATTACKS += HARDEN_ATTACKS


# --- hostcheck sweep: its contract variables, its port, a hostile training Python, signals mid-sweep -------------
# One node process as a launcher starts it (torch's contract, a world of one unless the row says otherwise). Most rows
# stop before any rank starts; the ``real`` rows run this interpreter's torch, a compute-only sweep of seconds.

#: Sockets the port rows hold through their run.
_HELD: list[socket.socket] = []
_LAUNCHERS = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "SLURM_LOCALID")
_ELASTIC = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sweep_env(**more: str | None) -> dict[str, str | None]:
    env: dict[str, str | None] = {k: None for k in (*_LAUNCHERS, *_ELASTIC, "KUBERNETES_SERVICE_HOST")}
    env.update({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())})
    env.update(more)
    return env


def _srun(nodelist: str, **more: str) -> dict[str, str | None]:
    """What srun sets for a task of two (torch's contract unset): the Slurm path of the contract."""
    return {
        "RANK": None,
        "WORLD_SIZE": None,
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_JOB_NODELIST": nodelist,
        **more,
    }


def _sweep(
    *extra: str | Callable[[Ctx], str],
    env: dict[str, str | None] | None = None,
    python: Callable[[Ctx], str] | None = None,
    real: bool = False,
    codes: tuple[int, ...] = USAGE,
    **kw: Any,
) -> Callable[[Ctx], Run]:
    """``hostcheck sweep`` with ``env`` over a world of one on loopback; the tiny training Python (no torch) unless
    ``python`` or ``real`` (this interpreter, with torch) says otherwise."""

    def build(c: Ctx) -> Run:
        py = sys.executable if real else (python(c) if python else c.python)
        argv = [
            "sweep",
            "--python",
            py,
            "--facts-dir",
            str(c.facts),
            "--env-file",
            str(c.env_file),
            "--device",
            "cpu",
        ]
        argv += [x(c) if callable(x) else x for x in extra]
        return Run(argv, codes, env={**_sweep_env(), **(env or {})}, **kw)

    return build


def _sweep_port_in_use(c: Ctx) -> Run:
    held = socket.socket()
    held.bind(("", 0))
    held.listen()
    _HELD.append(held)
    port = held.getsockname()[1]

    def check(o: Outcome) -> None:
        held.close()

    return _sweep(
        env={"MASTER_PORT": str(port)}, needle=f"MASTER_PORT {port}: in use on this node", check=check
    )(c)


def _sweep_config(c: Ctx, path: str, needle: str) -> Run:
    """``hostcheck sweep --config PATH``: refused (exit 2) before any rank starts."""
    return _sweep("--config", path, needle=needle)(c)


def _sweep_world_of_one(o: Outcome) -> None:
    """One node measured, nothing to judge it against: said so, exit 1, a report of the schema's types."""
    from hostcheck.schema import sweep_schema, type_errors

    report = json.loads((o.ctx.root / "sweep.json").read_text())
    assert type_errors(report, sweep_schema()) == [] and report["verdict"]["judged"] == []
    assert report["nodes"][0]["state"] == "measured" and any("not judged" in n for n in report["notes"])


def _sweep_signalled(sig: int) -> Callable[[Ctx], Run]:
    """``sig`` while the node's rank hangs with a grandchild in a session of its own: 128 + N, nothing left."""

    def build(c: Ctx) -> Run:
        py = c.script("hung/python", HANGING_PYTHON)
        needle = "" if sig == signal.SIGKILL else f"interrupted by {signal.Signals(sig).name}"
        return _sweep(python=lambda c: py, codes=(SIGNAL_EXITS[sig],), signal=sig, needle=needle)(c)

    return build


SWEEP_ATTACKS = [
    # The contract: every wrong or missing variable a usage error naming it, before any rank starts.
    A(
        "sweep-no-contract",
        _sweep(
            env={"RANK": None, "WORLD_SIZE": None, "MASTER_ADDR": None, "MASTER_PORT": None},
            needle="RANK: not set, nor SLURM_PROCID",
        ),
    ),
    A("sweep-rank-abc", _sweep(env={"RANK": "abc"}, needle="RANK: 'abc' is not a whole number")),
    A(
        "sweep-rank-at-world-size",
        _sweep(env={"RANK": "2", "WORLD_SIZE": "2"}, needle="RANK: 2 is not below WORLD_SIZE 2"),
    ),
    A("sweep-world-size-zero", _sweep(env={"WORLD_SIZE": "0"}, needle="WORLD_SIZE: 0 is out of range")),
    A(
        "sweep-world-size-huge",
        _sweep(env={"WORLD_SIZE": "9" * 40}, needle="WORLD_SIZE: " + "9" * 40 + " is out of range"),
    ),
    A(
        "sweep-master-port-70000",
        _sweep(env={"MASTER_PORT": "70000"}, needle="MASTER_PORT: 70000 is out of range"),
    ),
    A("sweep-master-addr-missing", _sweep(env={"MASTER_ADDR": None}, needle="MASTER_ADDR: not set")),
    A(
        "sweep-master-addr-terminal-escape",
        _sweep(
            env={"MASTER_ADDR": "gpu\x1b]0;pwned\x07"},
            needle="MASTER_ADDR:",
            check=lambda o: _no_escape(o.err),
        ),
    ),
    A(
        "sweep-local-rank-1",
        _sweep(env={"LOCAL_RANK": "1"}, needle="LOCAL_RANK: 1: the sweep runs one process per node"),
    ),
    A(
        "sweep-slurm-nodelist-unclosed",
        _sweep(env=_srun("gpu[1-"), needle="SLURM_JOB_NODELIST: 'gpu[1-': a '[' without its ']'"),
    ),
    A(
        "sweep-slurm-nodelist-a-billion-hosts",
        _sweep(env=_srun("n[0-999999999]"), needle="SLURM_JOB_NODELIST: "),
    ),
    A(
        "sweep-slurm-two-tasks-a-node",
        _sweep(
            env=_srun("gpu1", SLURM_PROCID="1", SLURM_LOCALID="1"),
            needle="SLURM_LOCALID: 1: the sweep runs one process per node",
        ),
    ),
    A(
        "sweep-test-fault-garbage",
        _sweep(env={"HOSTCHECK_SWEEP_TEST_FAULT": "$(rm -rf /)"}, needle="HOSTCHECK_SWEEP_TEST_FAULT: "),
    ),
    # The port: one that something listens on is refused before any rank starts.
    A("sweep-port-in-use", _sweep_port_in_use),
    # A hostile training Python: no torch, a torch that raises, one that hangs (cut at --timeout).
    A("sweep-training-python-without-torch", _sweep(needle="import torch")),
    A(
        "sweep-torch-import-raises",
        _sweep(python=lambda c: c.fake_torch(TORCH_RAISES), needle="fake torch: libcudart.so.12 is broken"),
    ),
    A(
        "sweep-torch-import-hangs",
        _sweep("--timeout", "5", python=lambda c: c.fake_torch(TORCH_HANGS), needle="timed out after 5 s"),
    ),
    A(
        "sweep-torch-leaves-a-daemon",
        _sweep(python=lambda c: c.fake_torch(TORCH_LEAVES_A_DAEMON), needle="rank 0"),
    ),
    # Report paths and standard streams.
    A("sweep-json-a-folder", _sweep("--json", lambda c: str(c.facts), needle="facts: is a folder")),
    A("sweep-json-dev-full", _sweep("--json", "/dev/full", real=True, needle="writing /dev/full")),
    A(
        "sweep-world-of-one",
        _sweep(
            "--json",
            lambda c: c.p("sweep.json"),
            real=True,
            codes=(1,),
            reports=("sweep.json",),
            check=_sweep_world_of_one,
        ),
    ),
    A("sweep-stdout-dev-full", _sweep(real=True, stdout="devfull", needle="writing to standard output")),
    A("sweep-ulimit-n-16", _sweep(codes=ANY, limits={resource.RLIMIT_NOFILE: 16})),
    *_config_rows("sweep-config", _sweep_config, b"sweep_min_peers = 1"),
    A("signal-sigint-mid-sweep", _sweep_signalled(signal.SIGINT)),
    A("signal-sigterm-mid-sweep", _sweep_signalled(signal.SIGTERM)),
    A("signal-sighup-mid-sweep", _sweep_signalled(signal.SIGHUP)),
    A("signal-sigkill-mid-sweep", _sweep_signalled(signal.SIGKILL)),
]
ATTACKS += SWEEP_ATTACKS


# --- hostcheck fleet --sweep: the sweep's report is another machine's file ------------------------------------------


def _sweep_report(change: Callable[[dict[str, Any]], Any] | None = None) -> str:
    """A simulated 8-node sweep's report (tests/unit/fixtures/sweep_sim.py, judged by the real code), changed."""
    from fixtures.sweep_sim import Cluster

    from hostcheck.inside import sweep_plan
    from hostcheck.sweep.judge import judge
    from hostcheck.sweep.render import build_report

    record = Cluster(8, seed=7, slow_link={(4, 5): 0.3}).record()
    rules = sweep_plan.Rules()
    report = build_report(record, judge(record, rules), {"time": "t", "thresholds": rules.to_dict()})
    if change:
        change(report)
    return json.dumps(report)


def _fleet_sweep(plant: Callable[[Ctx], str], needle: str) -> Callable[[Ctx], Run]:
    """``hostcheck fleet nodes --sweep PATH`` with one good node and the planted sweep report: refused (exit 2)
    naming what is wrong, no page written."""

    def build(c: Ctx) -> Run:
        d = c.root / "nodes"
        d.mkdir()
        (d / "gpu001.json").write_text(_node_report("gpu001"))
        argv = ["fleet", str(d), "--sweep", plant(c), "--out", c.p("out")]
        return Run(argv, USAGE, needle=needle, reports=("out",))

    return build


def _sweep_file(change: Callable[[dict[str, Any]], Any] | None = None) -> Callable[[Ctx], str]:
    def plant(c: Ctx) -> str:
        path = c.root / "sweep.json"
        path.write_text(_sweep_report(change))
        return str(path)

    return plant


def _sweep_link(target: str) -> Callable[[Ctx], str]:
    def plant(c: Ctx) -> str:
        os.symlink(target, c.p("sweep.json"))
        return c.p("sweep.json")

    return plant


FLEET_SWEEP_ATTACKS = [
    A(
        "fleet-sweep-verdict-without-hosts",
        _fleet_sweep(_sweep_file(lambda r: r["verdict"].pop("hosts")), "verdict lacks hosts"),
    ),
    A(
        "fleet-sweep-pair-without-latency",
        _fleet_sweep(_sweep_file(lambda r: r["pairs"][0].pop("latency_s")), "pairs[0] lacks latency_s"),
    ),
    A(
        "fleet-sweep-suspect-without-nodes",
        _fleet_sweep(_sweep_file(lambda r: r["suspects"][0].pop("nodes")), "suspects[0] lacks nodes"),
    ),
    A(
        "fleet-sweep-without-pairs",
        _fleet_sweep(_sweep_file(lambda r: r.pop("pairs")), "the report lacks pairs"),
    ),
    A(
        "fleet-sweep-rate-of-400-digits",
        _fleet_sweep(
            _sweep_file(lambda r: r["pairs"][0].update(bytes_per_s=10**400)), "pairs[0].bytes_per_s"
        ),
    ),
    A("fleet-sweep-symlink-to-dev-zero", _fleet_sweep(_sweep_link("/dev/zero"), "symbolic link")),
    A("fleet-sweep-dev-zero", _fleet_sweep(lambda c: "/dev/zero", "/dev/zero")),
    A(
        "fleet-sweep-sparse-100mb",
        _fleet_sweep(lambda c: _sparse(c.p("sweep.json"), 100 << 20, b"{"), "bytes"),
    ),
]
ATTACKS += FLEET_SWEEP_ATTACKS


# --- pull mode's result file (system.E011): root's service writes it, but it is read as anyone's ------------------
# gpunode_pull's fact names the result file; whatever is there, system.E011 warns that it cannot use it (naming why),
# never passes, never fails, and the run stays judged.


def _pull(plant: Callable[[Ctx, str], None], *named: str) -> Callable[[Ctx], Run]:
    def build(c: Ctx) -> Run:
        result = c.p("pull/result.json")
        os.makedirs(os.path.dirname(result))
        c.fact(
            "gpunode_pull",
            json.dumps({"result_file": result, "interval_s": 1800, "unit": "gpunode-pull.service"}),
        )
        plant(c, result)

        def check(o: Outcome) -> None:
            status, message = _status(o, "system.E011")
            assert status == "warn" and all(w in message for w in named), (status, message)
            assert o.checks()["system.E011"]["brief"] == "pull result unreadable"

        return Run(c.base(json_out=True, only="system.E011"), JUDGED, check=check)

    return build


def _pull_text(text: str | bytes) -> Callable[[Ctx, str], None]:
    return lambda c, path: Path(path).write_bytes(text if isinstance(text, bytes) else text.encode())


PULL_ATTACKS = [
    A("pull-result-garbage", _pull(_pull_text(b"\xff\xfe garbage \x00"), "result.json")),
    A("pull-result-not-json", _pull(_pull_text("{ok: yes"), "not JSON")),
    A("pull-result-nested-60000-deep", _pull(_pull_text("[" * 60_000), "not JSON")),
    A("pull-result-not-ours", _pull(_pull_text('{"ok": true}'), "not a gpunode pull result")),
    A(
        "pull-result-wrong-types",
        _pull(
            _pull_text(
                json.dumps(
                    {
                        "schema_version": 1,
                        "ok": "yes",
                        "finished": 1e400,
                        "stage": "done",
                        "rc": 10**30,
                        "recap": {"failed": -1},
                        "ref": 5,
                        "commit": "",
                        "message": "",
                        "log": "",
                    }
                ).replace("Infinity", "1e400")
            ),
            "wrong or missing ok, finished, rc, recap, ref",
        ),
    ),
    A(
        "pull-result-sparse-100mb",
        _pull(lambda c, path: _sparse(path, 100 << 20, b'{"schema_version": 1, "pad": "'), "bytes"),
    ),
    A(
        "pull-result-symlink-to-dev-zero",
        _pull(lambda c, path: os.symlink("/dev/zero", path), "symbolic link"),
    ),
    A(
        "pull-result-symlink-to-a-good-result",
        _pull(
            lambda c, path: (
                Path(c.p("elsewhere.json")).write_text(
                    json.dumps({"schema_version": 1, "ok": True, "finished": time.time(), "stage": "done"})
                ),
                os.symlink(c.p("elsewhere.json"), path),
            ),
            "symbolic link",
        ),
    ),
    A("pull-result-fifo", _pull(lambda c, path: os.mkfifo(path), "FIFO")),
    A("pull-result-a-folder", _pull(lambda c, path: os.mkdir(path), "folder")),
]
ATTACKS += PULL_ATTACKS


def _no_escape(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text, text


@pytest.mark.parametrize("attack", ATTACKS)
def test_attack(
    attack: Attack, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> None:
    interp = sys.executable
    if attack.user:
        interp, why = nobody_python()
        if interp is None:
            pytest.skip(why)
    if attack.user:  # a folder nobody can reach (pytest's are private to root)
        root = Path(tempfile.mkdtemp(prefix="hostcheck-attack-"))
        root.chmod(0o755)
        request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
    else:
        root = Path(os.path.realpath(tmp_path_factory.mktemp("attack")))
    marker = uuid.uuid4().hex
    ctx = Ctx(root, interp, marker, attack.user)
    if attack.user:
        (root / "out").mkdir()
        (root / "rootonly").mkdir(mode=0o755)
        for d in (ctx.tmp, ctx.home):
            os.chown(d, 65534, 65534)
    run = attack.build(ctx)
    allowed = {os.path.normpath(r) for r in run.reports} | {"state"}
    before = listing(root)
    devfull = os.lstat("/dev/full")
    devzero = os.lstat("/dev/zero")
    since = _ticks_now()

    outcomes = execute(ctx, run, since)

    deadline = time.monotonic() + GONE_WAIT
    while (left := carriers(marker, since)) and time.monotonic() < deadline:
        time.sleep(0.1)
    _kill([pid for pid, _ in left])
    assert not left, f"processes outlived the run: {left}"
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode) and os.lstat("/dev/full").st_rdev == devfull.st_rdev
    assert stat.S_ISCHR(os.lstat("/dev/zero").st_mode) and os.lstat("/dev/zero").st_rdev == devzero.st_rdev
    after = listing(root)
    touched = sorted(
        k
        for k in before.keys() | after.keys()
        if before.get(k) != after.get(k) and not any(k == a or k.startswith(a + os.sep) for a in allowed)
    )
    assert not touched, f"touched outside the reports {sorted(allowed)}: {touched}"
    want = f"expected: {attack.expect}\n" if attack.expect else ""
    for o in outcomes:
        assert o.rc in run.codes, (
            f"{want}exit {o.rc}, want {run.codes}\nstdout: {o.out[-2000:]}\nstderr: {o.err[-3000:]}"
        )
        assert TRACEBACK not in o.out and TRACEBACK not in o.err, o.err[-3000:] or o.out[-3000:]
        if run.needle and run.stderr == "pipe":
            assert run.needle in o.err, o.err[-2000:]
    if run.check:
        for o in outcomes:
            run.check(o)
