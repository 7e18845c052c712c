"""Shared gathering types: a missing value is a value (:class:`Unavailable`), never an exception."""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Union

from hostcheck import infile
from hostcheck.child.launch import Launch

#: Where a node's / is for every sysfs and procfs read (``Options.host_root``, ``--host-root``): a fixture tree in
#: tests and scenarios.
HOST_ROOT = "/"


def under(root: str, path: str) -> str:
    """``path`` (relative to a node's /) under ``root``."""
    return os.path.join(root, path.lstrip("/"))


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


def is_missing(v: Any) -> bool:
    return isinstance(v, Unavailable)


@dataclass(frozen=True)
class CmdResult:
    rc: int
    stdout: str
    stderr: str


#: Injected command runner: (argv, timeout) -> CmdResult | Unavailable.
Runner = Callable[[Sequence[str], float], Union[CmdResult, Unavailable]]


def run_cmd(argv: Sequence[str], timeout: float = 10.0, limit: int | None = None) -> CmdResult | Unavailable:
    """A system tool's answer. It starts through the one launcher: in a session of its own, its whole group
    killed at the deadline (a hung systemctl or nvidia-smi leaves no child behind) and on SIGINT/SIGTERM.
    ``limit``: at most that many bytes of stdout and stderr together are read; a tool that prints more is
    stopped (its group killed) and the answer says so."""
    if "/" not in argv[0] and shutil.which(argv[0]) is None:
        return Unavailable(NOT_INSTALLED, f"{argv[0]} not found")
    launch = Launch()
    try:
        p = launch.start(argv, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except FileNotFoundError:
        return Unavailable(NOT_INSTALLED, f"{argv[0]} not found")
    except OSError as exc:
        return Unavailable(ERROR, f"{argv[0]}: {exc}")
    if p is None:
        return Unavailable(ERROR, f"{argv[0]} not started: the run was interrupted")
    try:
        if limit is None:
            out, err = p.communicate(timeout=timeout)
        else:
            got = _read_bounded(p, timeout, limit)
            if got is None:
                return Unavailable(ERROR, f"{argv[0]} printed more than {limit} bytes: stopped")
            out, err = got
    except subprocess.TimeoutExpired:
        return Unavailable(TIMEOUT, f"{argv[0]} timed out after {timeout:g} s")
    finally:
        launch.end()
        for f in (p.stdout, p.stderr):
            with contextlib.suppress(OSError):
                f.close()
    return CmdResult(p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


def _read_bounded(p: subprocess.Popen, timeout: float, limit: int) -> tuple[bytes, bytes] | None:
    """stdout and stderr of ``p`` until both close and it exits; None past ``limit`` bytes in all. Raises
    subprocess.TimeoutExpired past ``timeout`` (the caller's launcher then kills the group)."""
    end = time.monotonic() + timeout
    bufs: dict[int, list[bytes]] = {p.stdout.fileno(): [], p.stderr.fileno(): []}
    total = 0
    with selectors.DefaultSelector() as sel:
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = end - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(p.args, timeout)
            for key, _events in sel.select(left):
                data = os.read(key.fd, 1 << 16)
                if not data:
                    sel.unregister(key.fd)
                    continue
                total += len(data)
                if total > limit:
                    return None
                bufs[key.fd].append(data)
    p.wait(max(0.0, end - time.monotonic()))
    return b"".join(bufs[p.stdout.fileno()]), b"".join(bufs[p.stderr.fileno()])


def parse_counter(text: Any) -> int | None:
    """A sysfs counter file's text ("42\\n") as an int; None for anything else (a sign, garbage, 20 digits or more)."""
    if not isinstance(text, str):
        return None
    t = text.strip()
    return int(t) if t.isdigit() and len(t) < 20 else None


def list_dir(path: str, limit: int | None = None) -> list[str] | Unavailable:
    """The names in a folder, sorted (at most ``limit`` of them, read in the folder's order), or why not: the one
    folder reader of the sysfs/procfs gatherers."""
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
    larger file or one that is not UTF-8 is refused, and the reason names it."""
    try:
        return infile.read_text(path, limit, truncate=not strict, strict=strict)
    except infile.ReadError as exc:
        kind = {infile.MISSING: NOT_FOUND, infile.NO_PERMISSION: NO_PERMISSION}.get(exc.kind, ERROR)
        return Unavailable(kind, str(exc))
