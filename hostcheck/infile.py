"""The one reader for every file hostcheck did not write itself: facts, environment files, the config file, node
reports (``hostcheck fleet``), the job's hook records, kernel files.

Such a file may be anything someone put there: a FIFO (an open would wait for a writer for ever), a device
(/dev/zero never ends), a symbolic link, a file that grows while it is read, bytes that are not UTF-8. So a file
is opened without blocking (O_NONBLOCK; O_NOFOLLOW where the caller says a link is not one of its files), checked
on the open descriptor (a regular file, not too large: no swap between a check and the open), read at most to
its cap, and decoded strictly. Every refusal is a :class:`ReadError` whose message names the file and why, so the
caller can name what it dropped. Each caller decides the rules:

- follow symbolic links (``follow=True``): paths an admin names (``--config``, ``--env-file``, facts): a link
  there is the admin's, and the descriptor check still refuses what it leads to if that is not a file;
- refuse them (``follow=False``): files in a folder that others write into (node reports, the job's records
  folder, which the job itself can write): a link there is not one of the files, and may lead anywhere.
"""

from __future__ import annotations

import errno
import os
import stat

#: The default cap: facts, environment and config files are a few KiB.
DEFAULT_LIMIT = 1 << 20

MISSING = "missing"
NO_PERMISSION = "no_permission"
NOT_A_FILE = "not_a_file"
TOO_LARGE = "too_large"
NOT_TEXT = "not_text"
FAILED = "failed"


class ReadError(OSError):
    """Why a file was not read: ``kind`` (one of the constants above) and a message that names the file."""

    def __init__(self, path: str, kind: str, why: str) -> None:
        super().__init__(f"{path} {why}")
        self.path, self.kind, self.why = path, kind, why

    def __str__(self) -> str:
        return f"{self.path} {self.why}"


def _kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_bytes(
    path: str, limit: int = DEFAULT_LIMIT, *, follow: bool = True, truncate: bool = False
) -> bytes:
    """At most ``limit`` bytes of the regular file ``path`` (raises :class:`ReadError`).

    ``truncate``: a longer file gives its first ``limit`` bytes (kernel files); otherwise it is refused."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        code = exc.errno or 0
        if code == errno.ENOENT:
            why = "is a broken symbolic link" if os.path.islink(path) else "does not exist"
            raise ReadError(path, MISSING, why) from None
        if code == errno.ELOOP:
            why = "is a symbolic link loop" if follow else "is a symbolic link (not followed here)"
            raise ReadError(path, NOT_A_FILE, why) from None
        if code in (errno.EACCES, errno.EPERM):
            raise ReadError(path, NO_PERMISSION, "is not readable (run as root)") from None
        if code == errno.ENXIO:  # a socket
            raise ReadError(path, NOT_A_FILE, "is a socket, not a regular file") from None
        raise ReadError(path, FAILED, f"cannot be opened: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ReadError(path, NOT_A_FILE, f"is {_kind_of(st.st_mode)}, not a regular file")
        if st.st_size > limit and not truncate:
            raise ReadError(path, TOO_LARGE, f"is {st.st_size} bytes, more than the {limit} read here")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
        if size > limit:
            if not truncate:
                raise ReadError(path, TOO_LARGE, f"grew past {limit} bytes while being read")
            data = data[:limit]
        return data
    except BlockingIOError:
        raise ReadError(path, FAILED, "would block (a lock or a file system that does not answer)") from None
    except ReadError:
        raise
    except OSError as exc:
        raise ReadError(path, FAILED, f"cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def decode(path: str, data: bytes) -> str:
    """``data`` as UTF-8 (raises :class:`ReadError` naming the first bad byte)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReadError(path, NOT_TEXT, f"is not UTF-8 text (byte {exc.start})") from None


def read_text(
    path: str, limit: int = DEFAULT_LIMIT, *, follow: bool = True, truncate: bool = False, strict: bool = True
) -> str:
    """The text of the regular file ``path``: :func:`read_bytes`, then UTF-8 (``strict=False``: bad bytes
    become U+FFFD, for kernel files only)."""
    data = read_bytes(path, limit, follow=follow, truncate=truncate)
    return decode(path, data) if strict else data.decode("utf-8", "replace")
