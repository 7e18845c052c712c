"""Shared gathering types: a missing value is a value (:class:`Unavailable`), never an exception."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import math
import os
import re
import selectors
import shutil
import subprocess
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, TypeVar, Union

from hostcheck import infile
from hostcheck.child.launch import Launch

#: Where a node's / is for every sysfs and procfs read (``Options.host_root``, ``--host-root``): a fixture tree in
#: tests and scenarios.
HOST_ROOT = "/"


#: The host roots given (not "/"), each with its real path: what is read under one must resolve inside it.
_ROOTS: dict[str, str] = {}


def under(root: str, path: str) -> str:
    """``path`` (relative to a node's /) under ``root``: the one way a path under a host root is made, and what
    confines every read under that root to it (:func:`outside_root`)."""
    key = os.path.abspath(root)
    if key != "/" and key not in _ROOTS:
        _ROOTS[key] = os.path.realpath(key)
        _root_of.cache_clear()  # a folder seen before may lie under this new root
    return os.path.join(root, path.lstrip("/"))


def outside_root(path: str) -> str | None:
    """Why ``path`` may not be read: it lies under a host root (``--host-root``) but resolves outside it (a link
    in the tree to /dev/zero, to /etc, to ../..: not the node's file, not followed). None when it may be read."""
    if not _ROOTS:
        return None
    folder, leaf = os.path.split(os.path.abspath(path))
    root = _root_of(folder)
    if root is None:
        return None
    real = _ROOTS[root]
    # The folder's real path once per folder (a port's sixteen counters share it); the leaf itself each time.
    target = os.path.join(_real(folder), leaf)
    if os.path.islink(target):
        target = os.path.realpath(target)
    if target == real or target.startswith(real.rstrip("/") + "/"):
        return None
    return f"{path} leads outside the host root {root} (to {target}): not followed"


@functools.lru_cache(maxsize=4096)
def _root_of(folder: str) -> str | None:
    """The host root ``folder`` lies under (the root itself included), or None."""
    probe = folder
    while probe not in _ROOTS:
        parent = os.path.dirname(probe)
        if parent == probe:
            return None
        probe = parent
    return probe


@functools.lru_cache(maxsize=4096)
def _real(folder: str) -> str:
    return os.path.realpath(folder)


@dataclass(frozen=True)
class Unavailable:
    """Why a value could not be read. ``kind`` is one of the KIND_* strings below."""

    kind: str
    reason: str

    def __str__(self) -> str:
        return f"unavailable ({self.reason})"


NOT_INSTALLED = "not_installed"
NOT_SUPPORTED = "not_supported"
NO_PERMISSION = "no_permission"
GPU_LOST = "gpu_lost"
TIMEOUT = "timeout"
NOT_FOUND = "not_found"
ERROR = "error"
#: Not run on purpose: another process holds a GPU or a Slurm job runs on the node.
BUSY = "busy"
#: hostcheck's own gathering code raised: a defect or a hostile input, never a verdict on the node.
CRASHED = "crashed"


T = TypeVar("T")


def is_missing(v: Any) -> bool:
    return isinstance(v, Unavailable)


@dataclass(frozen=True)
class CmdResult:
    rc: int
    stdout: str
    stderr: str
    #: The tool printed more than the cap and only the last part of each stream is here (``run_cmd(tail=True)``):
    #: whoever uses the text says it was cut.
    cut: bool = False


#: Injected command runner: (argv, timeout) -> CmdResult | Unavailable.
Runner = Callable[[Sequence[str], float], Union[CmdResult, Unavailable]]

#: What an external tool may print, stdout and stderr together, before it is stopped: the largest answer read here
#: (``dcgmi diag -r 3 -j`` on 8 GPUs: tens of KiB; ``journalctl -k`` of 50,000 lines: a few MiB) and room to spare.
#: A tool that prints 1 GB, or prints for ever, costs hostcheck this much memory and no more.
OUTPUT_CAP = 8 << 20
#: One read: a pipe holds 64 KiB; a log read to its end (``tail``) takes larger bites of a flood.
_CHUNK, _TAIL_CHUNK = 1 << 16, 1 << 20


class Tool:
    """One external program (nvidia-smi, dcgmi, journalctl, ib_write_bw, scontrol...) running: the one way
    hostcheck starts a tool. It starts through the one launcher (hostcheck.child.launch: a session of its own,
    tracked until it ends, its group killed on SIGINT/SIGTERM and by the reaper should hostcheck die), reads
    /dev/null, and its stdout and stderr come to pipes read here, never to hostcheck's own streams. At most
    ``limit`` bytes are kept: past them the tool is stopped (its group killed) and its answer says so, or, with
    ``tail``, it runs on and the last ``limit`` bytes of each stream are kept (``CmdResult.cut``). Every way out
    (:meth:`finish`, :meth:`close`) kills what is left of its group and reaps it.

    Reading is done by the caller's thread (:meth:`read`, :meth:`finish`): no thread of its own, so a run where no
    thread can start (a tight ``ulimit -v``) still reads its tools."""

    def __init__(
        self, argv: Sequence[str], limit: int = OUTPUT_CAP, tail: bool = False, merge: bool = False
    ) -> None:
        self.argv = list(argv)
        #: stderr into the stdout pipe (a tool whose errors are lines among its output: dcgmi dmon).
        self.merge = merge
        self.name = os.path.basename(self.argv[0]) if self.argv else "?"
        self.limit, self.tail = max(1, int(limit)), tail
        self.launch = Launch()
        self.proc: subprocess.Popen | None = None
        #: Why it could not start, or None.
        self.error: Unavailable | None = None
        #: Bytes read in all; True once past the cap (stopped, or with ``tail``: its start dropped).
        self.total, self.over = 0, False
        self._bufs: dict[int, deque[bytes]] = {}
        self._sizes: dict[int, int] = {}
        self._open: set[int] = set()
        self._fds = (-1, -1)  # stdout, stderr
        self._ended = False
        self._start()

    def _start(self) -> None:
        if not self.argv or ("/" not in self.argv[0] and shutil.which(self.argv[0]) is None):
            self.error = Unavailable(NOT_INSTALLED, f"{self.argv[0] if self.argv else 'a tool'} not found")
            return
        try:
            p = self.launch.start(
                self.argv,
                env=dict(os.environ),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if self.merge else subprocess.PIPE,
            )
        except FileNotFoundError:
            self.error = Unavailable(NOT_INSTALLED, f"{self.argv[0]} not found")
            return
        except OSError as exc:
            self.error = Unavailable(ERROR, f"{self.argv[0]}: {exc.strerror or exc}")
            return
        if p is None:
            self.error = Unavailable(ERROR, f"{self.argv[0]} not started: the run was interrupted")
            return
        self.proc = p
        self._fds = (p.stdout.fileno(), -1 if p.stderr is None else p.stderr.fileno())
        for fd in self._fds[: 1 if p.stderr is None else 2]:
            os.set_blocking(fd, False)
            if self.tail:  # a log read to its end: fewer, larger reads of a flood
                with contextlib.suppress(OSError, AttributeError):
                    fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _TAIL_CHUNK)
            self._bufs[fd], self._sizes[fd] = deque(), 0
            self._open.add(fd)

    @property
    def started(self) -> bool:
        return self.proc is not None

    def _keep(self, fd: int, data: bytes) -> None:
        self.total += len(data)
        buf = self._bufs[fd]
        buf.append(data)
        self._sizes[fd] += len(data)
        if not self.tail:
            if self.total > self.limit:
                self.over = True
                self._stop()
            return
        while self._sizes[fd] > self.limit:  # keep the last ``limit`` bytes of the stream
            self.over = True
            extra = self._sizes[fd] - self.limit
            head = buf.popleft()
            if len(head) > extra:
                buf.appendleft(head[extra:])
                self._sizes[fd] -= extra
            else:
                self._sizes[fd] -= len(head)

    def read(self, seconds: float = 0.0) -> bool:
        """Read what the tool prints for up to ``seconds`` (0: what is there now); True once both streams have
        closed (or it was stopped)."""
        end = time.monotonic() + max(0.0, seconds)
        with selectors.DefaultSelector() as sel:
            for fd in self._open:
                sel.register(fd, selectors.EVENT_READ)
            while self._open and not self._ended:
                ready = sel.select(max(0.0, end - time.monotonic()))
                if not ready and time.monotonic() >= end:
                    break
                for key, _events in ready:
                    # Never more than one byte past the cap: that byte is what says the tool printed more.
                    size = _TAIL_CHUNK if self.tail else min(_CHUNK, self.limit + 1 - self.total)
                    try:
                        data = os.read(key.fd, size)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(key.fd)
                        self._open.discard(key.fd)
                        continue
                    self._keep(key.fd, data)
                    if self._ended:
                        break
        return not self._open or self._ended

    def take(self) -> bytes:
        """The stdout read since the last call (a stream read as it comes: ``dcgmi dmon``); what was taken still
        counts towards the cap."""
        fd = self._fds[0]
        data = b"".join(self._bufs.get(fd, ()))
        if fd in self._bufs:
            self._bufs[fd].clear()
            self._sizes[fd] = 0
        return data

    def _text(self, fd: int) -> str:
        data = b"".join(self._bufs.get(fd, ()))
        if self.tail and self.over:  # the first line kept may be the end of one cut in two
            data = data.partition(b"\n")[2] if b"\n" in data else data
        return data.decode("utf-8", "replace")

    def _answer(self) -> CmdResult | Unavailable:
        p = self.proc
        assert p is not None
        if self.over and not self.tail:
            return Unavailable(
                ERROR, f"{self.name} printed more than {self.limit} bytes: stopped, its output not used"
            )
        rc = p.returncode if p.returncode is not None else -9
        return CmdResult(rc, self._text(self._fds[0]), self._text(self._fds[1]), cut=self.over)

    def finish(self, timeout: float) -> CmdResult | Unavailable:
        """Read until both streams close and the tool exits, at most ``timeout`` seconds from now; then stop it
        (its whole group killed, the tool reaped) and give its answer, or why there is none."""
        if self.error is not None:
            return self.error
        assert self.proc is not None
        end = time.monotonic() + timeout
        try:
            closed = self.read(timeout)
            if not closed:
                return Unavailable(TIMEOUT, f"{self.name} timed out after {timeout:g} s")
            if not self._ended:
                try:
                    self.proc.wait(max(0.0, end - time.monotonic()))
                except subprocess.TimeoutExpired:  # it closed its output, yet runs on
                    return Unavailable(TIMEOUT, f"{self.name} timed out after {timeout:g} s")
        finally:
            self.close()
        return self._answer()

    def stop(self) -> CmdResult | Unavailable:
        """Stop the tool now (a server whose client is done): what it printed, or why there is nothing."""
        if self.error is not None:
            return self.error
        self.read(0)
        self.close()
        return self._answer()

    def _stop(self) -> None:
        self._ended = True
        self.launch.end()

    def close(self) -> None:
        """Kill what is left of its group, reap it, close the pipes (again: nothing)."""
        if self.proc is None:
            return
        self._stop()
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        self._open.clear()


def run_cmd(
    argv: Sequence[str], timeout: float = 10.0, limit: int = OUTPUT_CAP, tail: bool = False
) -> CmdResult | Unavailable:
    """A system tool's answer, through :class:`Tool`: under ``timeout`` (then its whole group killed: a hung
    systemctl or nvidia-smi leaves no child behind), at most ``limit`` bytes of output (a tool that prints more
    is stopped and the answer says so; ``tail``: the last ``limit`` bytes of each stream, ``cut`` set)."""
    return Tool(argv, limit, tail).finish(timeout)


# --- numbers ------------------------------------------------------------------------------------------------


def parse_int(text: Any, *, signed: bool = False, digits: int = 19) -> int | None:
    """A tool's or a kernel file's number ("42\\n", " 7 ") as an int: ASCII digits 0-9 only, at most ``digits`` of
    them, a leading "-" only when ``signed``; None for anything else. "²" and "٣" are digits to str.isdigit, and
    int() raises on the first and reads the second: neither is a number a tool or the kernel writes, so neither is
    one here. The one parser of the integers hostcheck reads from outside."""
    if not isinstance(text, str):
        return None
    t = text.strip()
    sign = 1
    if signed and t.startswith("-"):
        sign, t = -1, t[1:]
    if not 0 < len(t) <= digits or not t.isascii() or not t.isdigit():
        return None
    return sign * int(t)


_NUMBER = re.compile(r"-?[0-9]{1,30}(?:\.[0-9]{1,30})?(?:[eE][-+]?[0-9]{1,3})?")


def parse_number(text: Any) -> float | None:
    """A tool's decimal number ("391.62", "0.250", "-1", "1e3") as a finite float: ASCII only (float() takes "٣"
    too), no "inf" or "nan"; None for anything else. The one parser of the non-integers read from outside."""
    if not isinstance(text, str):
        return None
    t = text.strip()
    if not _NUMBER.fullmatch(t):
        return None
    v = float(t)
    return v if math.isfinite(v) else None


def parse_counter(text: Any) -> int | None:
    """A sysfs counter file's text ("42\\n") as an int; None for anything else (a sign, garbage, 20 digits or more,
    a digit that is not ASCII)."""
    return parse_int(text)


def guarded(what: str, fn: Callable[[], T]) -> T | Unavailable:
    """``fn()``, or when it raises (a defect, or input no parser foresaw) why not, naming ``what``: one part of a
    gatherer lost, never the whole gatherer."""
    try:
        return fn()
    except Exception as exc:  # each part stands alone: the rest is still read
        return Unavailable(CRASHED, f"reading {what} failed: {type(exc).__name__}: {str(exc)[:200]}")


def list_dir(path: str, limit: int | None = None) -> list[str] | Unavailable:
    """The names in a folder, sorted (at most ``limit`` of them, read in the folder's order), or why not: the one
    folder reader of the sysfs/procfs gatherers. Under a host root, a folder that resolves outside it is not read."""
    escape = outside_root(path)
    if escape:
        return Unavailable(NOT_FOUND, escape)
    try:
        with os.scandir(path) as it:
            names = []
            for entry in it:
                names.append(entry.name)
                if limit is not None and len(names) >= limit:
                    break
        return sorted(names)
    except FileNotFoundError:
        return Unavailable(NOT_FOUND, f"{path} does not exist")
    except PermissionError:
        return Unavailable(NO_PERMISSION, f"{path} not readable (run as root)")
    except OSError as exc:  # a loop, a file where a folder should be
        return Unavailable(NOT_FOUND, f"{path}: {exc.strerror or exc}")


def read_text(path: str, limit: int = 1 << 20, strict: bool = False) -> str | Unavailable:
    """A file's text through the one reader (hostcheck.infile). ``strict=False`` (kernel files): at most
    ``limit`` bytes, bad bytes replaced; ``strict=True`` (a file someone else wrote: an environment file): a
    larger file or one that is not UTF-8 is refused, and the reason names it. Under a host root, a file that
    resolves outside it is not read (:func:`outside_root`)."""
    escape = outside_root(path)
    if escape:
        return Unavailable(NOT_FOUND, escape)
    try:
        return infile.read_text(path, limit, truncate=not strict, strict=strict)
    except infile.ReadError as exc:
        kind = {infile.MISSING: NOT_FOUND, infile.NO_PERMISSION: NO_PERMISSION}.get(exc.kind, ERROR)
        return Unavailable(kind, str(exc))
