"""Report files: checked before a run, written without clobbering what the path names.

hostcheck runs as root from cron and timers, so a report path may name anything. A new or regular file is replaced
atomically (a reader never sees half a report); a character device or FIFO (/dev/null, a pipe a collector reads)
is written in place (/dev/stdout is a symlink: refused); a symlink, folder, socket or block device is refused, as is an empty path or one path given
for two reports. Every refusal happens before any check runs.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Sequence


def path_error(path: str) -> str | None:
    """Why ``path`` cannot take a report, or None."""
    if not path.strip():
        return "empty path"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        return exc.strerror or str(exc)
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            return "is a symbolic link (give the path it points to)"
        if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            return None if os.access(path, os.W_OK) else "not writable"
        if not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file, character device or FIFO"
            return f"is {kind}"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return "its folder does not exist"
    if not os.access(parent, os.W_OK | os.X_OK):
        return "its folder is not writable"
    return None


def paths_error(flags: Sequence[tuple[str, str | None]]) -> str | None:
    """The first problem with the report paths given ([(flag, path or None)]), as a usage message, or None."""
    seen: dict[str, str] = {}
    for flag, path in flags:
        if path is None:
            continue
        why = path_error(path)
        if why:
            return f"{flag} {path or repr(path)}: {why}"
        key = os.path.realpath(path)
        if key in seen:
            return f"{seen[key]} and {flag} name the same file ({path})"
        seen[key] = flag
    return None


def write_report(path: str, text: str | bytes) -> None:
    """Write one report (text, or bytes: a PNG): in place to a character device or FIFO, else atomically
    (raises OSError)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = 0
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        # Non-blocking open: a FIFO nobody reads is an error (ENXIO), not a hang.
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY)
        try:
            os.set_blocking(fd, True)
            data = text.encode("utf-8") if isinstance(text, str) else text
            while data:
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)
        return
    if mode and not stat.S_ISREG(mode):
        raise OSError(f"{path}: not a regular file, character device or FIFO")
    write_atomic(path, text)


def write_atomic(path: str, text: str | bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` in one rename (mode 0644 unless told: a file replaced keeps its own)."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".hostcheck.", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8") if isinstance(text, str) else text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
