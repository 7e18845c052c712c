"""OS, kernel, CPU topology, NVIDIA kernel module and XID events from the kernel log."""

from __future__ import annotations

import functools
import glob
import math
import os
import platform
import re
import socket
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from hostcheck.config import default_xid_policy
from hostcheck.gather.base import (
    HOST_ROOT,
    NO_PERMISSION,
    NOT_FOUND,
    OUTPUT_CAP,
    CmdResult,
    Runner,
    Unavailable,
    parse_int,
    read_text,
    run_cmd,
)
from hostcheck.gather.fabric import NO_FABRIC, FabricState, gather_fabric
from hostcheck.gather.gpuinfo import BusId

#: The kernel-log window when the caller names none: the shipped XID policy's window_hours (hostcheck/data/xid.json).
XID_WINDOW_HOURS = default_xid_policy().window_hours
NO_DRIVER = Unavailable(NOT_FOUND, "NVIDIA kernel module not loaded (/proc/driver/nvidia/version missing)")


@dataclass(frozen=True)
class XidEvent:
    pci: str
    xid: int
    text: str


@dataclass(frozen=True)
class SystemSnapshot:
    hostname: str = ""
    os_id: str = ""
    os_version: str = ""
    os_pretty: str = ""
    kernel: str = ""
    arch: str = ""
    hostcheck_python: str = ""
    libc: str = ""
    container: str | None = None
    kernel_build_dir: bool | None = None
    #: Version from /proc/driver/nvidia/version, or why there is none.
    driver_version: str | Unavailable = NO_DRIVER
    logical_cpus: int = 0
    physical_cores: int = 0
    numa_nodes: tuple[tuple[int, ...], ...] = ()
    mem_total_bytes: int = 0
    xid_events: tuple[XidEvent, ...] | Unavailable = ()
    xid_source: str = ""
    #: NVSwitches on the PCI bus and NVIDIA Fabric Manager.
    fabric: FabricState = NO_FABRIC


def parse_os_release(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip().strip('"').strip("'")
    return out


def parse_driver_version(text: str) -> str | None:
    m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+([0-9]{1,6}\.[0-9]{1,6}(?:\.[0-9]{1,6})?)", text)
    return m.group(1) if m else None


#: CPUs in a list at most (Linux's NR_CPUS tops out at 8192): a range of a billion is not a node's.
MAX_CPUS = 1 << 16


def parse_cpulist(text: str) -> tuple[int, ...]:
    """The kernel's CPU list ("0-55,112-167") as CPU numbers; a part that is not a number or a range of them is
    left out."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        a, dash, b = part.partition("-")
        lo, hi = parse_int(a, digits=5), parse_int(b, digits=5) if dash else parse_int(a, digits=5)
        if lo is None or hi is None or hi < lo:
            continue
        cpus.extend(range(lo, min(hi, lo + MAX_CPUS - len(cpus) - 1) + 1))
        if len(cpus) >= MAX_CPUS:
            break
    return tuple(cpus)


_XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): ([0-9]{1,6}),?\s*(.*)")
#: A GPU that fell off the bus, said by the driver without an Xid line: the probe's "NVRM: The NVIDIA GPU
#: 0000:b3:00.0 / (PCI ID: ...) installed in this system has / fallen off the bus and is not responding to
#: commands." (NVIDIA/open-gpu-kernel-modules, src/nvidia/arch/nvalloc/unix/src/osapi.c, NV_ERR_GPU_IS_LOST; one
#: message over three lines) and RM's "NVRM: GPU 0000:a1:00.0: GPU has fallen off the bus.". NVIDIA's NVSentinel
#: and leptonai/gpud report both as Xid 79.
_FALLEN_START = re.compile(
    r"NVRM: (?:The NVIDIA GPU|GPU) ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.\d)?\b"
)
_FALLEN = "fallen off the bus"
#: Lines the three-line message may span after its first.
_FALLEN_SPAN = 3
FALLEN_OFF_XID = 79
_ISO_RE = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})[,.]?\d*(?:([+-])(\d{2}):?(\d{2}))?", re.ASCII
)


#: Kernel-log lines asked of journalctl at most: a flood of messages cannot make a run read without end.
KERNEL_LOG_LINES = 50_000


def within_window(text: str, hours: float, now: datetime | None = None) -> list[str]:
    """The lines of ``text`` not older than ``hours``: a line with an ISO timestamp before the cutoff is dropped, a
    line without one (or with an impossible one) is kept. The fields are read as numbers, not through strptime: a
    journal of 50,000 lines (KERNEL_LOG_LINES) is read on every run."""
    cutoff = (now or datetime.now(timezone.utc)) - timedelta(hours=hours)
    zones: dict[tuple[str, str, str], timezone] = {}
    kept = []
    for line in text.splitlines():
        t = _ISO_RE.match(line)
        if t:
            y, mo, d, h, mi, sec, sign, zh, zm = t.groups()
            key = (sign or "+", zh or "00", zm or "00")
            try:
                tz = zones.get(key)
                if tz is None:
                    offset = timedelta(hours=int(key[1]), minutes=int(key[2]))
                    tz = zones[key] = timezone(-offset if key[0] == "-" else offset)
                if datetime(int(y), int(mo), int(d), int(h), int(mi), int(sec), tzinfo=tz) < cutoff:
                    continue
            except ValueError:
                pass
        kept.append(line)
    return kept


def parse_xid_lines(
    text: str, now: datetime | None = None, hours: float = XID_WINDOW_HOURS
) -> list[XidEvent]:
    """XID events from kernel log lines; lines with an ISO timestamp older than ``hours`` are dropped. A GPU the
    driver says fell off the bus, with no Xid 79 line of its own, is an Xid 79 event too."""
    events = []
    lines = within_window(text, hours, now)
    fallen: list[str] = []
    for i, line in enumerate(lines):
        m = _XID_RE.search(line)
        if m:
            events.append(
                XidEvent(pci=m.group(1).lower(), xid=int(m.group(2)), text=m.group(3).strip()[:160])
            )
            continue
        f = _FALLEN_START.search(line)
        if f and any(_FALLEN in ln for ln in lines[i : i + _FALLEN_SPAN]):
            bus = BusId(f.group(1)).kernel
            if bus not in fallen:
                fallen.append(bus)
    logged = {e.pci for e in events if e.xid == FALLEN_OFF_XID}
    for bus in fallen:
        if bus not in logged:
            said = "GPU has fallen off the bus (the driver's message, no Xid line)"
            events.append(XidEvent(pci=bus, xid=FALLEN_OFF_XID, text=said))
    return events


def read_kernel_log(
    runner: Runner = run_cmd, hours: float = XID_WINDOW_HOURS
) -> tuple[str | Unavailable, str]:
    """The kernel log of the last ``hours`` and where it came from: journalctl -k (journald applies the window,
    at most KERNEL_LOG_LINES lines), else dmesg cut to the same window. The one reader of the kernel log: the XIDs
    (here) and the machine checks and hung tasks (gather.hardware) both come from it. A log past the output cap is
    read to its end and its last OUTPUT_CAP bytes kept (the newest lines): the source says so."""
    # The newest lines are the ones that matter: keep the end of a flood, not its start (run_cmd, or a runner
    # that hands its keywords to it, such as the run's run_once).
    if runner is run_cmd or getattr(runner, "keeps_tail", False):
        runner = functools.partial(runner, tail=True)
    # Whole minutes, rounded up: a window under a minute would otherwise ask journald for none.
    minutes = max(1, math.ceil(hours * 60))
    argv = ["journalctl", "-k", "--no-pager", "-q", "-o", "short-iso", "-n", str(KERNEL_LOG_LINES)]
    j = runner([*argv, "--since", f"-{minutes}min"], 15)
    journal_ok = isinstance(j, CmdResult) and j.rc == 0 and "No journal files" not in j.stderr
    if journal_ok and j.stdout.strip():
        return j.stdout, f"journalctl -k, last {hours:g} h" + _cut(j)
    d = runner(["dmesg", "--time-format", "iso"], 15)
    if isinstance(d, CmdResult) and d.rc == 0:
        return "\n".join(within_window(d.stdout, hours)), f"dmesg, last {hours:g} h" + _cut(d)
    if journal_ok:  # journald answered with an empty window and dmesg is not readable
        return "", f"journalctl -k, last {hours:g} h"
    why = d.reason if isinstance(d, Unavailable) else (d.stderr.strip()[:120] or f"dmesg exit {d.rc}")
    return Unavailable(NO_PERMISSION, f"kernel log not readable ({why}); run as root"), "none"


def _cut(r: CmdResult) -> str:
    return f" (cut: only its last {OUTPUT_CAP >> 20} MiB read)" if r.cut else ""


def read_xids(
    runner: Runner = run_cmd, hours: float = XID_WINDOW_HOURS
) -> tuple[tuple[XidEvent, ...] | Unavailable, str]:
    """XIDs in the kernel log of the last ``hours`` (read_kernel_log)."""
    text, source = read_kernel_log(runner, hours)
    if isinstance(text, Unavailable):
        return text, source
    return tuple(parse_xid_lines(text, hours=hours)), source


def _physical_cores(cpus: list[int]) -> int:
    cores = set()
    for cpu in cpus:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        pkg = read_text(f"{base}/physical_package_id")
        core = read_text(f"{base}/core_id")
        if isinstance(pkg, Unavailable) or isinstance(core, Unavailable):
            return len(cpus)
        cores.add((pkg.strip(), core.strip()))
    return len(cores) or len(cpus)


def _container() -> str | None:
    if os.path.exists("/run/.containerenv"):
        return "podman"
    if os.path.exists("/.dockerenv"):
        return "docker"
    env = read_text("/proc/1/environ")
    if isinstance(env, str) and "container=" in env:
        return env.split("container=", 1)[1].split("\0", 1)[0] or "container"
    return None


def gather_system(
    runner: Runner = run_cmd,
    read_kernel_log: bool = True,
    xid_window_hours: float = XID_WINDOW_HOURS,
    root: str = HOST_ROOT,
) -> SystemSnapshot:
    """The system facts; XID events from the last ``xid_window_hours`` (the configuration's XID policy)."""
    osr_text = read_text("/etc/os-release")
    osr = parse_os_release(osr_text) if isinstance(osr_text, str) else {}
    uname = platform.uname()
    online = read_text("/sys/devices/system/cpu/online")
    cpus = list(parse_cpulist(online)) if isinstance(online, str) else list(range(os.cpu_count() or 1))
    numa = []
    nodes = glob.glob("/sys/devices/system/node/node[0-9]*")
    for _n, node in sorted((n, p) for p in nodes if (n := parse_int(p.rsplit("node", 1)[1])) is not None):
        cl = read_text(f"{node}/cpulist")
        if isinstance(cl, str):
            numa.append(parse_cpulist(cl))
    mem = 0
    meminfo = read_text("/proc/meminfo")
    if isinstance(meminfo, str):
        m = re.search(r"MemTotal:\s+([0-9]{1,15}) kB", meminfo)
        mem = int(m.group(1)) * 1024 if m else 0
    drv_text = read_text("/proc/driver/nvidia/version")
    driver: str | Unavailable
    if isinstance(drv_text, str):
        driver = parse_driver_version(drv_text) or Unavailable(
            NOT_FOUND, "unparsable /proc/driver/nvidia/version"
        )
    else:
        driver = Unavailable(
            NOT_FOUND, "NVIDIA kernel module not loaded (/proc/driver/nvidia/version missing)"
        )
    xids: tuple[XidEvent, ...] | Unavailable = ()
    source = "not read"
    if read_kernel_log:
        xids, source = read_xids(runner, hours=xid_window_hours)
    return SystemSnapshot(
        hostname=socket.gethostname(),
        os_id=osr.get("ID", ""),
        os_version=osr.get("VERSION_ID", ""),
        os_pretty=osr.get("PRETTY_NAME", uname.system),
        kernel=uname.release,
        arch=uname.machine,
        hostcheck_python=platform.python_version() + f" ({sys.executable})",
        libc=" ".join(x for x in platform.libc_ver() if x),
        container=_container(),
        kernel_build_dir=os.path.isdir(f"/lib/modules/{uname.release}/build"),
        driver_version=driver,
        logical_cpus=len(cpus),
        physical_cores=_physical_cores(cpus),
        numa_nodes=tuple(numa),
        mem_total_bytes=mem,
        xid_events=xids,
        xid_source=source,
        fabric=gather_fabric(runner, root=root),
    )
