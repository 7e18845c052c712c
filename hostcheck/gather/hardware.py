"""Host hardware faults: EDAC memory-controller counts, machine checks, tasks stuck in D state, PCIe AER counters.

Every file is read under one root (``Options.host_root``, "/" on a node; tests and scenarios point it at a fixture
tree) through the one bounded reader, and each counter is compared with the last run's through
:mod:`hostcheck.gather.state`. Parsing is separate from reading: the ``parse_*`` functions are pure.

Sources (kernel documentation): EDAC ``ce_count``/``ue_count`` per memory controller,
Documentation/ABI/testing/sysfs-devices-edac and Documentation/admin-guide/ras.rst; AER
``aer_dev_correctable|nonfatal|fatal``, Documentation/ABI/testing/sysfs-bus-pci-devices-aer; task state and start
time, /proc/<pid>/stat in Documentation/filesystems/proc.rst; the hung-task detector's "blocked for more than"
message, kernel/hung_task.c; rasdaemon's ``ras-mc-ctl --summary``, util/ras-mc-ctl.in in mchehab/rasdaemon.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass, field

from hostcheck.gather.base import (
    HOST_ROOT,
    NOT_FOUND,
    NOT_INSTALLED,
    Runner,
    Unavailable,
    guarded,
    list_dir,
    parse_counter,
    parse_int,
    read_text,
    run_cmd,
    under,
)
from hostcheck.gather.state import DEFAULT_STATE_FILE, CounterState, load_state, save_state
from hostcheck.gather.system import read_kernel_log

EDAC_MC = "sys/devices/system/edac/mc"
PCI_DEVICES = "sys/bus/pci/devices"
NVIDIA_VENDOR = "0x10de"
#: PCI classes whose AER counters are read: NVIDIA display/3D controllers (GPUs), network controllers (Ethernet,
#: InfiniBand 0x0207) and InfiniBand serial-bus controllers (0x0c06).
GPU_CLASSES = ("0x0300", "0x0302")
NIC_CLASSES = ("0x02", "0x0c06")
AER_FILES = {"correctable": "aer_dev_correctable", "nonfatal": "aer_dev_nonfatal", "fatal": "aer_dev_fatal"}
AER_TOTALS = {"correctable": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL", "fatal": "TOTAL_ERR_FATAL"}
#: Tasks read at most (a node has a few thousand): /proc is bounded like any other input.
MAX_TASKS = 200_000


@dataclass(frozen=True)
class MemoryController:
    name: str  # mc0
    ce: int | Unavailable
    ue: int | Unavailable


@dataclass(frozen=True)
class PciAer:
    address: str  # 0000:18:00.0
    kind: str  # "GPU" or "NIC"
    #: correctable / nonfatal / fatal -> TOTAL_ERR_* since boot; Unavailable without AER support.
    totals: dict[str, int] | Unavailable


@dataclass(frozen=True)
class BlockedTask:
    pid: int
    tid: int
    comm: str
    #: Start time in clock ticks since boot (/proc stat field 22): a pid reused since is another task.
    start: int
    #: Context switches so far: unchanged between two looks means the task never ran in between.
    switches: int


@dataclass(frozen=True)
class HardwareSnapshot:
    root: str = HOST_ROOT
    edac: tuple[MemoryController, ...] | Unavailable = ()
    aer: tuple[PciAer, ...] | Unavailable = ()
    #: Tasks in D state now.
    blocked: tuple[BlockedTask, ...] | Unavailable = ()
    #: Kernel-log lines: machine-check reports and the hung-task detector's, in the window.
    mce_lines: tuple[str, ...] | Unavailable = ()
    hung_lines: tuple[str, ...] | Unavailable = ()
    #: Kernel-log lines of EDAC's uncorrected memory errors in the window (read even where EDAC's sysfs is not).
    edac_ue_lines: tuple[str, ...] | Unavailable = ()
    log_source: str = ""
    #: rasdaemon: MCE record kinds and counts from ``ras-mc-ctl --summary``; None when rasdaemon is absent.
    ras_mce: dict[str, int] | Unavailable | None = None
    #: NVML's PCIe replay counter per GPU (uuid -> count), as handed over from the NVML snapshot.
    replays: dict[str, int] = field(default_factory=dict)
    #: NVML's NVLink error counters, "<GPU UUID>.<link>.<counter>" -> count (nvlink.E004 judges the rise).
    nvlink: dict[str, int] = field(default_factory=dict)
    state: CounterState = field(default_factory=CounterState)
    taken_at: float = 0.0


# --- EDAC -----------------------------------------------------------------------------------------------


def read_edac(root: str) -> tuple[MemoryController, ...] | Unavailable:
    base = under(root, EDAC_MC)
    names = list_dir(base)
    if isinstance(names, Unavailable):
        if names.kind == NOT_FOUND:
            return Unavailable(NOT_FOUND, f"no EDAC driver loaded ({base} does not exist)")
        return names
    out = []
    for name in names:
        if not re.fullmatch(r"mc[0-9]{1,4}", name):
            continue
        counts: list[int | Unavailable] = []
        for f in ("ce_count", "ue_count"):
            text = read_text(os.path.join(base, name, f), 64)
            n = parse_counter(text)
            why = text if isinstance(text, Unavailable) else Unavailable(NOT_FOUND, f"{name}/{f} not a count")
            counts.append(n if n is not None else why)
        out.append(MemoryController(name, counts[0], counts[1]))
    return tuple(out)


# --- PCIe AER -------------------------------------------------------------------------------------------


def parse_aer(text: str, which: str) -> int | None:
    """The TOTAL_ERR_* line of one aer_dev_* file (the last line, per the kernel's ABI document)."""
    m = re.search(rf"^{AER_TOTALS[which]}\s+([0-9]{{1,19}})\s*$", text, re.MULTILINE)
    return int(m.group(1)) if m else None


def pci_kind(dev_dir: str) -> str | None:
    """A PCI device's kind: GPU (NVIDIA display or 3D controller), NIC (network or InfiniBand) or None."""
    cls = read_text(os.path.join(dev_dir, "class"), 64)
    vendor = read_text(os.path.join(dev_dir, "vendor"), 64)
    if not isinstance(cls, str):
        return None
    cls = cls.strip().lower()
    if isinstance(vendor, str) and vendor.strip().lower() == NVIDIA_VENDOR and cls[:6] in GPU_CLASSES:
        return "GPU"
    if cls.startswith(NIC_CLASSES):
        return "NIC"
    return None


def read_aer(root: str) -> tuple[PciAer, ...] | Unavailable:
    base = under(root, PCI_DEVICES)
    names = list_dir(base)
    if isinstance(names, Unavailable):
        return names
    out = []
    for dev in names[:4096]:
        d = os.path.join(base, dev)
        kind = pci_kind(d)
        if kind is None:
            continue
        totals: dict[str, int] = {}
        missing: Unavailable | None = None
        for which, fname in AER_FILES.items():
            text = read_text(os.path.join(d, fname), 4096)
            n = parse_aer(text, which) if isinstance(text, str) else None
            if n is None:
                missing = (
                    text if isinstance(text, Unavailable) else Unavailable(NOT_FOUND, f"{fname} unparsable")
                )
                break
            totals[which] = n
        if missing is not None and missing.kind == NOT_FOUND:
            missing = Unavailable(NOT_FOUND, "device or kernel without AER reporting (no aer_dev_* files)")
        out.append(PciAer(dev, kind, missing if missing is not None else totals))
    return tuple(out)


# --- tasks in D state -----------------------------------------------------------------------------------


def parse_stat(text: str) -> tuple[str, str, int] | None:
    """(comm, state, start ticks) from a /proc/<pid>/stat line; comm may hold spaces and parentheses."""
    head, sep, tail = text.rpartition(")")
    if not sep or "(" not in head:
        return None
    fields = tail.split()
    start = parse_int(fields[19]) if len(fields) >= 20 else None
    if start is None:
        return None
    return head.split("(", 1)[1][:64], fields[0], start


def parse_switches(status: str) -> int | None:
    total = 0
    found = 0
    for m in re.finditer(r"^(?:non)?voluntary_ctxt_switches:\s+([0-9]{1,19})\s*$", status, re.MULTILINE):
        total += int(m.group(1))
        found += 1
    return total if found == 2 else None


def read_blocked(root: str) -> tuple[BlockedTask, ...] | Unavailable:
    proc = under(root, "proc")
    pids = list_dir(proc)
    if isinstance(pids, Unavailable):
        return pids
    tasks: list[tuple[str, str, str]] = []  # (pid, tid, folder), at most MAX_TASKS
    for pid in pids:
        if parse_int(pid) is None:
            continue
        tids = list_dir(os.path.join(proc, pid, "task"))
        if isinstance(
            tids, Unavailable
        ):  # a process gone meanwhile, or a tree without task/: its main thread
            tasks.append((pid, pid, os.path.join(proc, pid)))
        else:
            tasks += [(pid, t, os.path.join(proc, pid, "task", t)) for t in tids if parse_int(t) is not None]
        if len(tasks) >= MAX_TASKS:
            break
    out, read = [], 0
    for pid, tid, task in tasks[:MAX_TASKS]:
        stat = read_text(os.path.join(task, "stat"), 4096)
        parsed = parse_stat(stat) if isinstance(stat, str) else None
        read += parsed is not None
        if parsed is None or parsed[1] != "D":
            continue
        status = read_text(os.path.join(task, "status"), 1 << 16)
        switches = parse_switches(status) if isinstance(status, str) else None
        if switches is not None:
            out.append(BlockedTask(int(pid), int(tid), parsed[0], parsed[2], switches))
    if not read:  # no task read is no task looked at: never "none blocked"
        return Unavailable(NOT_FOUND, f"no task's stat readable under {proc}")
    return tuple(out)


def blocked_key(t: BlockedTask) -> str:
    return f"{t.tid}@{t.start}"


def blocked_since(state: CounterState, t: BlockedTask) -> float | None:
    """Since when ``t`` has been in D state without running, as far as the runs before saw: the first run that
    found it with today's context-switch count (kept as ``<key>.since``); None when this run is the first."""
    prev = state.previous.get("dstate", {})
    if prev.get(blocked_key(t)) != t.switches:
        return None
    since = prev.get(blocked_key(t) + ".since")
    return float(since) if since is not None else state.previous_at


# --- machine checks and hung tasks in the kernel log ----------------------------------------------------

#: arch/x86/kernel/cpu/mce: every report is prefixed HW_ERR, "[Hardware Error]: "; "Machine check events logged"
#: is the corrected-error notice, "Machine Check" / "MCE" lines the decoded records.
_MCE_RE = re.compile(r"\[Hardware Error\]:.*(?:Machine [Cc]heck|\bMCE\b|machine check)")
#: kernel/hung_task.c: "INFO: task <comm>:<pid> blocked for more than <n> seconds."
_HUNG_RE = re.compile(r"task (\S.{0,40}?):(\d+) blocked for more than (\d+) seconds")


def parse_kernel_log(text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    mce, hung = [], []
    for line in text.splitlines():
        if _MCE_RE.search(line):
            mce.append(line.strip()[:200])
        elif _HUNG_RE.search(line):
            hung.append(line.strip()[:200])
    return tuple(mce[-50:]), tuple(hung[-50:])


#: drivers/edac/edac_mc.c, edac_ue_error(): edac_mc_printk(mci, KERN_WARNING, "%d UE %s%son %s (...)"), printed
#: as "EDAC MC3: 1 UE memory read error on CPU_SrcID#1_MC#1_Chan#2_DIMM#0 (...)".
_EDAC_UE_RE = re.compile(r"\bEDAC MC(\d{1,4}): (\d{1,12}) UE\b")


def parse_edac_ue(text: str) -> tuple[str, ...]:
    """The kernel log's EDAC uncorrected-error lines (the last 50), a count of at least one each."""
    found = [
        ln.strip()[:200] for ln in text.splitlines() if (m := _EDAC_UE_RE.search(ln)) and int(m.group(2))
    ]
    return tuple(found[-50:])


def parse_ras_summary(text: str) -> dict[str, int]:
    """``MCE records summary:`` then one ``\\t<count> <message> errors`` line per kind (ras-mc-ctl --summary);
    "No MCE errors." gives {}."""
    out: dict[str, int] = {}
    inside = False
    for line in text.splitlines():
        if line.startswith("MCE records summary"):
            inside = True
            continue
        m = re.match(r"^\s+([0-9]{1,12}) (.{0,120}?) errors\s*$", line) if inside else None
        if m:
            out[m.group(2)] = out.get(m.group(2), 0) + int(m.group(1))
        elif line.strip():
            inside = False
    return out


def read_ras(runner: Runner) -> dict[str, int] | Unavailable | None:
    r = runner(["ras-mc-ctl", "--summary"], 10)
    if isinstance(r, Unavailable):
        return None if r.kind == NOT_INSTALLED else r
    if r.rc != 0:
        return Unavailable(NOT_FOUND, f"ras-mc-ctl --summary exit {r.rc}: {r.stderr.strip()[:120]}")
    return parse_ras_summary(r.stdout)


# --- the whole snapshot ---------------------------------------------------------------------------------


def counters_of(snap: HardwareSnapshot) -> dict[str, dict[str, int]]:
    """This run's counters by namespace, as the state file keeps them."""
    out: dict[str, dict[str, int]] = {}
    if isinstance(snap.edac, tuple):
        out["edac"] = {}
        for mc in snap.edac:
            for k in ("ce", "ue"):
                v = getattr(mc, k)
                if isinstance(v, int):
                    out["edac"][f"{mc.name}.{k}"] = v
    if isinstance(snap.aer, tuple):
        out["aer"] = {
            f"{d.address}.{k}": v for d in snap.aer if isinstance(d.totals, dict) for k, v in d.totals.items()
        }
    if isinstance(snap.blocked, tuple):
        out["dstate"] = {}
        for t in snap.blocked:
            since = blocked_since(snap.state, t)
            out["dstate"][blocked_key(t)] = t.switches
            out["dstate"][blocked_key(t) + ".since"] = int(since if since is not None else snap.taken_at)
    if snap.replays:
        out["pcie_replay"] = dict(snap.replays)
    if snap.nvlink:
        out["nvlink"] = dict(snap.nvlink)
    return out


def gather_hardware(
    root: str = HOST_ROOT,
    state_file: str = DEFAULT_STATE_FILE,
    runner: Runner = run_cmd,
    log_hours: float = 2.0,
    replays: dict[str, int] | None = None,
    now: float | None = None,
    state: CounterState | None = None,
    nvlink: dict[str, int] | None = None,
) -> HardwareSnapshot:
    """Read everything, compare nothing (the checks do). ``state``: the last run's counters, loaded once by
    hostcheck.gather.gather, which saves this run's once with every other namespace; without it (a caller of its
    own) the state file is loaded here and this run's counters kept."""
    taken_at = time.time() if now is None else now
    got = guarded("the kernel log", lambda: read_kernel_log(runner, log_hours))
    log, source = got if isinstance(got, tuple) else (got, "none")
    lines = guarded("the kernel log", lambda: parse_kernel_log(log)) if isinstance(log, str) else log
    mce, hung = lines if isinstance(lines, tuple) else (lines, lines)
    ue = guarded("the kernel log's EDAC lines", lambda: parse_edac_ue(log)) if isinstance(log, str) else log
    # Each part on its own: one that cannot be read (or that no parser foresaw) is that part's Unavailable.
    snap = HardwareSnapshot(
        root=root,
        edac=guarded("EDAC", lambda: read_edac(root)),
        aer=guarded("PCIe AER", lambda: read_aer(root)),
        blocked=guarded("the tasks in D state", lambda: read_blocked(root)),
        mce_lines=mce,
        hung_lines=hung,
        edac_ue_lines=ue,
        log_source=source,
        ras_mce=guarded("ras-mc-ctl --summary", lambda: read_ras(runner)),
        replays=dict(replays or {}),
        nvlink=dict(nvlink or {}),
        state=state if state is not None else load_state(state_file),
        taken_at=taken_at,
    )
    if state is not None:
        return snap
    return dataclasses.replace(snap, state=save_state(snap.state, counters_of(snap), taken_at))
