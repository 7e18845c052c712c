"""What ``hostcheck job`` reads from /proc while the job runs: its processes' CPU and reads, /dev/shm, disks, PSI.

Readers return plain values and never raise (a process that ended between the listing and the read is simply
gone); the parsers are pure functions of a file's text. :class:`Series` keeps a bounded number of samples: when
it is full, every other sample is dropped, which keeps cumulative counters exact and halves the resolution.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: Samples kept per series; past it the resolution halves (2 Hz for 34 minutes, then 1 Hz, ...).
MAX_SAMPLES = 4096
#: Block devices that hold no dataset.
_SKIP_DEVICES = ("loop", "ram", "zram")


@dataclass(frozen=True)
class ProcStat:
    """One line of /proc/PID/stat, the fields used."""

    pid: int
    ppid: int
    comm: str
    state: str
    cpu_ticks: int  # utime + stime
    threads: int
    start_ticks: int
    blkio_ticks: int  # delayacct_blkio_ticks: 0 unless the kernel's delay accounting is on


def parse_stat(text: str) -> ProcStat | None:
    """/proc/PID/stat; the command name may hold spaces and ')' so the fields are counted from its end."""
    try:
        head, _, rest = text.rpartition(")")
        pid, _, comm = head.partition(" (")
        f = rest.split()
        return ProcStat(
            pid=int(pid),
            ppid=int(f[1]),
            comm=comm,
            state=f[0],
            cpu_ticks=int(f[11]) + int(f[12]),
            threads=int(f[17]),
            start_ticks=int(f[19]),
            blkio_ticks=int(f[39]) if len(f) > 39 else 0,
        )
    except (ValueError, IndexError):
        return None


def read_table(proc_root: str = "/proc") -> dict[int, ProcStat]:
    """Every process's stat line (only /proc/PID/stat: it takes no lock a stuck process could hold)."""
    out: dict[int, ProcStat] = {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"{proc_root}/{name}/stat", "rb") as f:
                st = parse_stat(f.read().decode("utf-8", "replace"))
        except OSError:
            continue
        if st is not None:
            out[st.pid] = st
    return out


def descendants(table: dict[int, ProcStat], root: int) -> set[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for st in table.values():
        children.setdefault(st.ppid, []).append(st.pid)
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in out or pid not in table:
            continue
        out.add(pid)
        todo.extend(children.get(pid, ()))
    return out


def parse_io(text: str) -> int | None:
    """read_bytes of /proc/PID/io: what the process made the block layer fetch (page cache hits excluded)."""
    for line in text.splitlines():
        if line.startswith("read_bytes:"):
            try:
                return int(line.split(":", 1)[1])
            except ValueError:
                return None
    return None


def read_io(pid: int, proc_root: str = "/proc") -> int | None:
    try:
        with open(f"{proc_root}/{pid}/io") as f:
            return parse_io(f.read())
    except OSError:  # gone, or not ours
        return None


def parse_diskstats(text: str) -> dict[str, tuple[int, int]]:
    """/proc/diskstats: device name -> (sectors read, milliseconds the device was busy)."""
    out: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) < 13 or f[2].startswith(_SKIP_DEVICES):
            continue
        try:
            out[f[2]] = (int(f[5]), int(f[12]))
        except ValueError:
            continue
    return out


def read_diskstats(path: str = "/proc/diskstats") -> dict[str, tuple[int, int]]:
    try:
        with open(path) as f:
            return parse_diskstats(f.read())
    except OSError:
        return {}


def parse_pressure(text: str) -> int | None:
    """The ``some`` line's total (microseconds some task stalled) of /proc/pressure/{io,cpu}."""
    for line in text.splitlines():
        if line.startswith("some "):
            for part in line.split():
                if part.startswith("total="):
                    try:
                        return int(part[len("total=") :])
                    except ValueError:
                        return None
    return None


def read_pressure(kind: str, root: str = "/proc/pressure") -> int | None:
    try:
        with open(f"{root}/{kind}") as f:
            return parse_pressure(f.read())
    except OSError:  # no PSI (kernel < 4.20, or psi=0)
        return None


def parse_cpu_total(text: str) -> tuple[int, int] | None:
    """The node's CPU from /proc/stat's first line: (busy ticks, all ticks); iowait counts as idle."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            try:
                v = [int(x) for x in line.split()[1:]]
            except ValueError:
                return None
            idle = v[3] + (v[4] if len(v) > 4 else 0)
            total = sum(v[:8])
            return total - idle, total
    return None


def read_cpu_total(path: str = "/proc/stat") -> tuple[int, int] | None:
    try:
        with open(path) as f:
            return parse_cpu_total(f.read(4096))
    except OSError:
        return None


def shm_usage(path: str = "/dev/shm") -> tuple[int, int] | None:
    """(used bytes, size in bytes) of /dev/shm, or None."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize


@dataclass
class Series:
    """Samples in time order, at most ``cap``; full, it keeps every other one (counters stay exact)."""

    cap: int = MAX_SAMPLES
    items: list[Any] = field(default_factory=list)

    def append(self, item: Any) -> None:
        self.items.append(item)
        if len(self.items) > self.cap:
            last = self.items[-1]
            self.items = self.items[::2]
            if self.items[-1] is not last:
                self.items.append(last)


@dataclass(frozen=True)
class ProcSample:
    """One sample of the job: per process (cpu ticks, read bytes, blkio ticks), /dev/shm used, the node's CPU,
    each disk's counters, PSI totals."""

    t: float
    procs: dict[int, tuple[int, int | None, int]]
    shm_used: int | None
    node_cpu: tuple[int, int] | None
    disks: dict[str, tuple[int, int]]
    psi_io: int | None
    psi_cpu: int | None


@dataclass
class ProcInfo:
    """What is known of one process of the job (the newest values)."""

    pid: int
    ppid: int
    comm: str
    start_ticks: int
    first_t: float
    last_t: float
    threads: int = 1


class ProcSampler:
    """Samples the job's process tree (the leader and everything below it)."""

    def __init__(self, leader: int, proc_root: str = "/proc", cap: int = MAX_SAMPLES) -> None:
        self.leader = leader
        self.proc_root = proc_root
        self.series = Series(cap)
        self.info: dict[int, ProcInfo] = {}
        self.shm_size: int | None = None
        self.shm_max_used = 0
        self.shm_start_used: int | None = None

    def sample(self, now: float) -> ProcSample:
        table = read_table(self.proc_root)
        pids = descendants(table, self.leader)
        procs: dict[int, tuple[int, int | None, int]] = {}
        for pid in pids:
            st = table[pid]
            known = self.info.get(pid)
            if known is None or known.start_ticks != st.start_ticks:  # new, or a reused pid
                self.info[pid] = known = ProcInfo(pid, st.ppid, st.comm, st.start_ticks, now, now)
            known.last_t, known.comm, known.ppid = now, st.comm, st.ppid
            known.threads = max(known.threads, st.threads)
            procs[pid] = (st.cpu_ticks, read_io(pid, self.proc_root), st.blkio_ticks)
        shm = shm_usage()
        if shm is not None:
            used, self.shm_size = shm
            self.shm_max_used = max(self.shm_max_used, used)
            if self.shm_start_used is None:
                self.shm_start_used = used
        s = ProcSample(
            t=now,
            procs=procs,
            shm_used=shm[0] if shm else None,
            node_cpu=read_cpu_total(),
            disks=read_diskstats(),
            psi_io=read_pressure("io"),
            psi_cpu=read_pressure("cpu"),
        )
        self.series.append(s)
        return s
