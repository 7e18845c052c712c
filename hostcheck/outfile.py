"""Report files: checked before a run, written without clobbering what the path names.

hostcheck runs as root from cron and timers, so a report path may name anything. A new or regular file is replaced
atomically (a reader never sees half a report); a character device or FIFO (/dev/null, a pipe a collector reads)
is written in place (/dev/stdout is a symlink: refused); a symlink, folder, socket or block device is refused, as is an empty path or one path given
for two reports. Every refusal happens before any check runs.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import time
from collections.abc import Iterator, Sequence


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


#: How long a writer waits for another hostcheck run that holds the folder (a baseline or state write: moments).
LOCK_WAIT_S = 10.0
#: A temporary file older than this is a leftover whatever its pid says (the pid may have been reused).
STALE_S = 3600.0


def _temp_prefix(path: str) -> str:
    """The start of the temporary files :func:`write_atomic` makes for ``path``: the file's name (so a leftover
    says what it was for) and the writer's pid (so a later run knows a dead writer's from a live one's)."""
    return f".{os.path.basename(path)[:100]}.hostcheck-"


@contextlib.contextmanager
def locked(path: str, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold the folder of ``path`` while the caller re-reads the file, decides and replaces it, so that two hostcheck
    runs never interleave there. The lock is flock(2) on the folder itself: no lock file to leave behind. Another run
    holding it is waited for, at most ``wait_s`` seconds (then OSError); a signal while waiting ends the wait as it
    ends the run. Temporary files left behind by a writer that died (SIGKILL) are removed first."""
    folder = os.path.dirname(os.path.abspath(path))
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        end = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= end:
                    raise OSError(
                        errno.EAGAIN, f"another hostcheck run has held {folder} for {wait_s:g} s"
                    ) from None
                time.sleep(0.05)
        remove_leftovers(path)
        yield
    finally:
        os.close(fd)


def remove_leftovers(path: str) -> list[str]:
    """Remove the temporary files of ``path`` (:func:`_temp_prefix`) whose writer is gone (its pid not alive) or
    that are older than STALE_S: what a SIGKILL left. Only regular files this user owns; the names removed."""
    folder = os.path.dirname(os.path.abspath(path))
    pattern = re.compile(re.escape(_temp_prefix(path)) + r"([0-9]{1,10})-[A-Za-z0-9_]{1,16}\.tmp")
    gone = []
    try:
        names = os.listdir(folder)
    except OSError:
        return gone
    for name in names:
        m = pattern.fullmatch(name)
        if not m:
            continue
        full = os.path.join(folder, name)
        try:
            st = os.lstat(full)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                continue
            if _alive(int(m.group(1))) and time.time() - st.st_mtime < STALE_S:
                continue
            os.unlink(full)
            gone.append(name)
        except OSError:
            continue
    return gone


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # under the lock, none of ours is being written
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


#: The temporary files being written now: named before they are created, so that whatever interrupts a write (a
#: signal raised at any point of it) the command's end can remove what is left (:func:`remove_pending`).
_PENDING: set[str] = set()


def write_atomic(path: str, text: str | bytes, mode: int = 0o644, keep: bool = False) -> None:
    """Replace ``path`` with ``text`` in one rename (mode 0644 unless told). ``keep``: a file that is replaced keeps
    its owner and mode (when its owner cannot be kept, it is not replaced: OSError), and the data is on disk before
    the rename (a configuration, the counters' state). An interrupted write removes its temporary file (and
    :func:`remove_pending` at the command's end, should the interruption come at the worst moment); one left by
    SIGKILL is removed by the next write into that folder (:func:`locked`, :func:`remove_leftovers`)."""
    d = os.path.dirname(os.path.abspath(path))
    data = text.encode("utf-8") if isinstance(text, str) else text
    tmp = os.path.join(d, f"{_temp_prefix(path)}{os.getpid()}-{os.urandom(6).hex()}.tmp")
    _PENDING.add(tmp)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            owner = _owner_and_mode(path) if keep else None
            if owner is not None:
                uid, gid, mode = owner
                if (uid, gid) != (os.geteuid(), os.getegid()):
                    try:
                        os.fchown(f.fileno(), uid, gid)
                    except OSError as exc:
                        raise OSError(exc.errno, f"its owner ({uid}:{gid}) cannot be kept") from None
            os.fchmod(f.fileno(), mode)
            if keep:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except FileExistsError:  # the name was taken: not ours to remove
        raise
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        _PENDING.discard(tmp)


def remove_pending() -> None:
    """Remove the temporary files of writes that never finished (a signal came between two lines of one)."""
    for tmp in list(_PENDING):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        _PENDING.discard(tmp)


def _owner_and_mode(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)
