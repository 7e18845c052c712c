"""The storage under each dataset directory: which disk, rotational or not, free space, a short read measurement.

A directory's file system is the longest mount point of /proc/self/mountinfo that holds it; its major:minor
leads to /sys/dev/block, from a partition to its disk and from a device-mapper or md device through ``slaves/``
to the disks under it. The disk is rotational when any disk under it says so in ``queue/rotational``.

The read measurement is bounded (``seconds``, ``max_bytes``) and leaves the page cache as it found it, so a job
running beside it keeps what it cached: files are read with O_DIRECT (no page cache at all) where the file system
takes it; elsewhere only files none of whose pages are resident (mincore) are read, and the pages read are then
dropped again (POSIX_FADV_DONTNEED). A few readers run at once, as DataLoader workers would.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import mmap
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from hostcheck.gather.base import ERROR, NOT_FOUND, NOT_SUPPORTED, Unavailable, parse_int, read_text
from hostcheck.registry import Thread

#: A measurement reads at most this long and this much per directory.
READ_SECONDS = 3.0
READ_MAX_BYTES = 512 << 20
#: Readers at once (DataLoader workers read in parallel; one reader at queue depth 1 undersells an SSD).
READERS = 4
#: Files looked at to find ones to read, at most.
MAX_FILES = 20000
CHUNK = 1 << 20
#: File systems without a block device of their own that hold data in memory.
MEMORY_FS = ("tmpfs", "ramfs", "hugetlbfs")


@dataclass(frozen=True)
class Mount:
    mount_point: str
    major: int
    minor: int
    fstype: str
    source: str


def _unescape(field_text: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040).
    out, i = [], 0
    while i < len(field_text):
        octal = field_text[i + 1 : i + 4]
        if field_text[i] == "\\" and len(octal) == 3 and all(c in "01234567" for c in octal):
            out.append(chr(int(field_text[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field_text[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """/proc/self/mountinfo (proc(5)): mount point (field 5), major:minor (3), type and source after ' - '."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if not sep or len(f) < 5 or len(r) < 2:
            continue
        major, _colon, minor = (parse_int(x, digits=9) for x in f[2].partition(":"))
        if major is None or minor is None:
            continue
        out.append(Mount(_unescape(f[4]), major, minor, r[0], _unescape(r[1])))
    return out


def mount_of(path: str, mounts: Sequence[Mount]) -> Mount | None:
    """The mount holding ``path`` (already resolved): the longest mount point above it, the later one of equals
    (a later mount hides an earlier one on the same point)."""
    best: Mount | None = None
    for m in mounts:
        mp = m.mount_point.rstrip("/") or "/"
        inside = path == mp or path.startswith(mp + "/") or mp == "/"
        if inside and (best is None or len(mp) >= len(best.mount_point.rstrip("/") or "/")):
            best = m
    return best


@dataclass(frozen=True)
class BlockDevice:
    name: str
    #: The whole disks under it (the device itself when it is one).
    disks: tuple[str, ...]
    #: True when any disk under it is rotational; None when no disk said.
    rotational: bool | None


def block_device(major: int, minor: int, sys_root: str = "/sys") -> BlockDevice | Unavailable:
    if major == 0:
        return Unavailable(NOT_SUPPORTED, "no block device (a network, overlay or memory file system)")
    link = f"{sys_root}/dev/block/{major}:{minor}"
    real = os.path.realpath(link)
    if not os.path.isdir(real):
        return Unavailable(NOT_FOUND, f"{link} does not exist")
    name = os.path.basename(real)
    disks = _disks_under(real, sys_root, depth=0)
    rot = [_rotational(d, sys_root) for d in disks]
    known = [r for r in rot if r is not None]
    return BlockDevice(name, tuple(disks), any(known) if known else None)


def _disks_under(real: str, sys_root: str, depth: int) -> list[str]:
    if depth > 8:
        return []
    if os.path.exists(os.path.join(real, "partition")):  # a partition: its disk is the folder above
        real = os.path.dirname(real)
    slaves = os.path.join(real, "slaves")
    try:
        under = sorted(os.listdir(slaves))
    except OSError:
        under = []
    if under:  # device-mapper, md: the disks below every slave
        out: list[str] = []
        for s in under:
            for d in _disks_under(os.path.realpath(os.path.join(slaves, s)), sys_root, depth + 1):
                if d not in out:
                    out.append(d)
        return out
    return [os.path.basename(real)]


def _rotational(disk: str, sys_root: str) -> bool | None:
    text = read_text(f"{sys_root}/block/{disk}/queue/rotational")
    if isinstance(text, str) and text.strip() in ("0", "1"):
        return text.strip() == "1"
    return None


@dataclass(frozen=True)
class ReadMeasure:
    bytes: int
    seconds: float
    files: int
    #: "O_DIRECT" or "uncached files"
    method: str
    #: Files passed over because some of their pages were cached (the uncached method only).
    skipped_cached: int = 0
    readers: int = READERS

    @property
    def mb_s(self) -> float | None:
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 and self.bytes else None


@dataclass(frozen=True)
class DataDir:
    path: str
    error: Unavailable | None = None
    mount_point: str | None = None
    fstype: str | None = None
    source: str | None = None
    device: BlockDevice | Unavailable | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    read: ReadMeasure | Unavailable | None = None


@dataclass(frozen=True)
class DataPathSnapshot:
    dirs: tuple[DataDir, ...] = ()
    #: Where the directories came from ("--data-dir", "gpunode_tuning.data_dirs", or "" when none were named).
    source: str = ""
    #: What else ran while the reads were measured (a GPU in use, a Slurm job), else None.
    busy: str | None = None
    #: Why nothing could be gathered (the gatherer timed out or failed).
    error: Unavailable | None = None


# --- page residency and the two ways of reading without disturbing the cache -------------------------------
_libc = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = (
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        )
        lib.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        lib.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
        _libc = lib
    return _libc


def resident_pages(fd: int, size: int) -> int | None:
    """How many of the file's pages are in the page cache (mincore on a mapping that touches none); None when
    it cannot be told."""
    if size <= 0:
        return 0
    try:
        lib = _lib()
    except OSError:
        return None
    page = mmap.PAGESIZE
    pages = (size + page - 1) // page
    addr = lib.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        return None
    try:
        vec = (ctypes.c_ubyte * pages)()
        if lib.mincore(addr, size, vec) != 0:
            return None
        return sum(b & 1 for b in vec)
    finally:
        lib.munmap(addr, size)


def _candidates(root: str, limit: int = MAX_FILES, deadline: float | None = None) -> list[str]:
    """Regular files under ``root`` (breadth first, bounded), the largest first within each folder."""
    out: list[str] = []
    todo = [root]
    seen = 0
    while todo and len(out) < limit:
        if deadline is not None and time.monotonic() > deadline:
            break
        d = todo.pop(0)
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        files = []
        for e in entries:
            seen += 1
            if seen > limit * 4:
                break
            try:
                if e.is_dir(follow_symlinks=False):
                    todo.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    files.append((e.stat(follow_symlinks=False).st_size, e.path))
            except OSError:
                continue
        out += [p for size, p in sorted(files, reverse=True) if size > 0]
    return out[:limit]


class _Budget:
    def __init__(self, seconds: float, max_bytes: int) -> None:
        self.deadline = time.monotonic() + seconds
        self.left = max_bytes
        self.lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self.lock:
            if self.left <= 0 or time.monotonic() >= self.deadline:
                return False
            self.left -= n
            return True

    def refund(self, n: int) -> None:
        with self.lock:
            self.left += max(0, n)


def _read_direct(path: str, budget: _Budget, buf: mmap.mmap) -> int:
    """Read a file with O_DIRECT; raises OSError(EINVAL) when the file system refuses it."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0) | os.O_CLOEXEC)
    try:
        n = 0
        offset = 0
        while budget.take(CHUNK):
            got = os.preadv(fd, [buf], offset)
            budget.refund(CHUNK - max(0, got))
            if got <= 0:
                break
            n += got
            offset += got
            if got < CHUNK:
                break
        return n
    finally:
        os.close(fd)


def _read_uncached(path: str, budget: _Budget) -> int | None:
    """Read a file none of whose pages are cached, then drop the pages read; None when some were cached."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if resident_pages(fd, size) != 0:
            return None
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        n = 0
        try:
            while budget.take(CHUNK):
                data = os.read(fd, CHUNK)
                budget.refund(CHUNK - len(data))
                if not data:
                    break
                n += len(data)
        finally:
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # only pages this read brought in
        return n
    finally:
        os.close(fd)


def measure_read(
    root: str,
    seconds: float = READ_SECONDS,
    max_bytes: int = READ_MAX_BYTES,
    readers: int = READERS,
    direct: bool = True,
) -> ReadMeasure | Unavailable:
    """Read throughput from the files under ``root``, leaving the page cache as it was (module docstring).
    ``direct=False`` goes straight to the uncached-files method (tests)."""
    if not hasattr(os, "O_DIRECT") and not hasattr(os, "posix_fadvise"):
        return Unavailable(NOT_SUPPORTED, "neither O_DIRECT nor posix_fadvise on this platform")
    files = _candidates(root, deadline=time.monotonic() + seconds)
    if not files:
        return Unavailable(NOT_FOUND, f"no file to read under {root}")
    method = ["O_DIRECT" if direct and hasattr(os, "O_DIRECT") else "uncached files"]
    budget = _Budget(seconds, max_bytes)
    lock = threading.Lock()
    totals = {"bytes": 0, "files": 0, "skipped": 0}
    queue = list(reversed(files))
    errors: list[str] = []

    def worker() -> None:
        buf = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT wants
        try:
            while True:
                with lock:
                    if not queue or budget.left <= 0:
                        return
                    path = queue.pop()
                try:
                    if method[0] == "O_DIRECT":
                        try:
                            n: int | None = _read_direct(path, budget, buf)
                        except OSError as exc:
                            if exc.errno != errno.EINVAL:
                                raise
                            with lock:
                                method[0] = "uncached files"
                            n = _read_uncached(path, budget)
                    else:
                        n = _read_uncached(path, budget)
                except OSError as exc:
                    with lock:
                        errors.append(f"{path}: {exc.strerror or exc}")
                    continue
                with lock:
                    if n is None:
                        totals["skipped"] += 1
                    else:
                        totals["bytes"] += n
                        totals["files"] += 1
                if time.monotonic() >= budget.deadline:
                    return
        finally:
            buf.close()

    start = time.monotonic()
    threads = [Thread(target=worker, daemon=True) for _ in range(max(1, readers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 10)
    elapsed = time.monotonic() - start
    if not totals["bytes"]:
        if totals["skipped"]:
            return Unavailable(
                NOT_SUPPORTED,
                f"every file tried ({totals['skipped']}) was already in the page cache: nothing to measure "
                "without evicting it",
            )
        return Unavailable(ERROR, errors[0] if errors else f"nothing could be read under {root}")
    return ReadMeasure(
        bytes=int(totals["bytes"]),
        seconds=elapsed,
        files=int(totals["files"]),
        method=method[0],
        skipped_cached=int(totals["skipped"]),
        readers=max(1, readers),
    )


def describe_dir(path: str, mounts: Sequence[Mount], sys_root: str = "/sys") -> DataDir:
    """Where ``path`` lives (no reading of its files)."""
    real = os.path.realpath(path)
    if not os.path.isdir(real):
        why = "does not exist" if not os.path.exists(real) else "is not a directory"
        return DataDir(path, error=Unavailable(NOT_FOUND, f"{path} {why}"))
    m = mount_of(real, mounts)
    try:
        st = os.statvfs(real)
        free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    except OSError:
        free = total = None
    if m is None:
        return DataDir(path, free_bytes=free, total_bytes=total)
    dev = block_device(m.major, m.minor, sys_root)
    return DataDir(
        path,
        mount_point=m.mount_point,
        fstype=m.fstype,
        source=m.source,
        device=dev,
        free_bytes=free,
        total_bytes=total,
    )


def read_mounts(path: str = "/proc/self/mountinfo") -> list[Mount]:
    text = read_text(path)
    return parse_mountinfo(text) if isinstance(text, str) else []


@dataclass(frozen=True)
class DataPathOptions:
    dirs: tuple[str, ...] = ()
    source: str = ""
    measure: bool = True
    seconds: float = READ_SECONDS
    max_bytes: int = READ_MAX_BYTES
    busy: str | None = None


def gather_datapath(opts: DataPathOptions) -> DataPathSnapshot:
    mounts = read_mounts()
    out = []
    for path in opts.dirs:
        d = describe_dir(path, mounts)
        if d.error is None and opts.measure:
            if d.fstype in MEMORY_FS:
                read: ReadMeasure | Unavailable = Unavailable(
                    NOT_SUPPORTED, f"{d.fstype}: the data is in memory"
                )
            else:
                read = measure_read(path, opts.seconds, opts.max_bytes)
            d = DataDir(**{**d.__dict__, "read": read})
        out.append(d)
    return DataPathSnapshot(dirs=tuple(out), source=opts.source, busy=opts.busy)
