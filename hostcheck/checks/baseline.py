"""A node against the baseline of its type (baseline.E001-E007): the [baseline] section of the configuration, which
``hostcheck baseline`` records on a known-good node and the roles deploy per inventory group. Pure functions of the
Snapshot; the reading is hostcheck.gather.inventory, the memory tolerance hostcheck/data/thresholds.json
(docs/baseline.md). Each fault is reported by one check: a device missing by the check of its kind (E003 NVMe, E004
network ports, E005 GPUs; the RDMA ports the baseline records by fabric.E001, E002 and E006, which take each port's
expectations from it), never again by the link check (E006).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from hostcheck.checks.gpu import _config
from hostcheck.config import DEFAULT_PATH, Baseline
from hostcheck.gather.base import NO_PERMISSION, NOT_FOUND, Unavailable
from hostcheck.gather.inventory import NodeInventory, Port
from hostcheck.registry import Outcome, check, errored, failed, passed, plural, skipped, warned

MAKE_ONE = (
    "on a known-good node of this type run 'hostcheck baseline --write {path}' (or set gpunode_health_baseline "
    "for its inventory group: docs/baseline.md)"
)
REPLACED = (
    "if the part was replaced on purpose, record the node type again with 'hostcheck baseline' on a known-good "
    "node (docs/baseline.md); otherwise drain the node and have the part looked at"
)
GiB = 1 << 30


def _setup(
    s: Any, what: str, recorded: Callable[[Baseline], Any]
) -> tuple[NodeInventory, Baseline, Any] | Outcome:
    """The inventory, the baseline and the recorded part, or the skip that says why there is nothing to compare."""
    cfg = _config(s)
    if cfg.baseline is None:
        path = cfg.path or DEFAULT_PATH
        return skipped(f"no [baseline] section in {path}", hint=MAKE_ONE.format(path=path))
    inv = getattr(s, "inventory", None)
    if not isinstance(inv, NodeInventory):
        return skipped("the node's inventory was not gathered")
    part = recorded(cfg.baseline)
    if part is None or part == ():
        return skipped(f"the baseline records no {what}")
    return inv, cfg.baseline, part


def _unavailable(what: str, u: Unavailable) -> Outcome:
    if u.kind == NOT_FOUND:
        return skipped(f"{what}: {u.reason}")
    hint = "run hostcheck as root" if u.kind == NO_PERMISSION else None
    return errored(f"{what} could not be read: {u.reason}", hint=hint)


def _verdict(
    fails: list[str], warns: list[str], ok: str, details: list[str], hint: str = REPLACED
) -> Outcome:
    if fails:
        return failed("; ".join(fails + warns), hint=hint, details=tuple(details))
    if warns:
        return warned("; ".join(warns), hint=hint, details=tuple(details))
    return passed(ok, details=tuple(details))


def _any(*values: Any) -> bool | None:
    """True when the baseline records any of these, else None (nothing to compare)."""
    return True if any(v is not None for v in values) else None


@check("baseline.E001", "CPU as in the baseline", weight=3, needs=("inventory",))
def cpu(s: Any) -> Outcome:
    got = _setup(s, "CPU", lambda b: _any(b.cpu_model, b.cpu_sockets, b.cpu_cores, b.cpu_threads))
    if isinstance(got, Outcome):
        return got
    inv, b, _part = got
    if isinstance(inv.cpu, Unavailable):
        return _unavailable("/proc/cpuinfo", inv.cpu)
    fails, warns = [], []
    for what, want, have in (
        ("sockets", b.cpu_sockets, inv.cpu.sockets),
        ("cores", b.cpu_cores, inv.cpu.cores),
        ("threads", b.cpu_threads, inv.cpu.threads),
    ):
        if want is not None and want != have:
            fails.append(f"{have} CPU {what}, the baseline has {want}")
    if b.cpu_model is not None and b.cpu_model != inv.cpu.model:
        warns.append(f"CPU model {inv.cpu.model!r}, the baseline has {b.cpu_model!r}")
    c = inv.cpu
    ok = (
        f"{c.model or 'CPU'}: {plural(c.sockets, 'socket')}, {plural(c.cores, 'core')}, "
        f"{plural(c.threads, 'thread')}, as in the baseline"
    )
    hint = "a missing socket or cores switched off in the firmware (SMT, core count): " + REPLACED
    return _verdict(fails, warns, ok, [], hint)


@check("baseline.E002", "Memory size as in the baseline", weight=8, needs=("inventory",))
def memory(s: Any) -> Outcome:
    got = _setup(s, "memory size", lambda b: b.memory_bytes)
    if isinstance(got, Outcome):
        return got
    inv, _b, want = got
    if isinstance(inv.memory_bytes, Unavailable):
        return _unavailable("/proc/meminfo", inv.memory_bytes)
    tol = _config(s).thresholds.baseline_memory_tolerance
    have = inv.memory_bytes
    off = (have - want) / want
    text = f"{have / GiB:.1f} GiB, the baseline {want / GiB:.1f} GiB ({off:+.1%})"
    kw = {"value": have, "unit": "bytes", "expected": f"{want} +/- {tol:.0%}"}
    if abs(off) > tol:
        return failed(
            f"memory {text}: more than {tol:.0%} away",
            hint="a dead or unseated DIMM (see 'dmidecode -t memory', the BMC's event log and system.E006), or a "
            "node of another type: " + REPLACED,
            **kw,
        )
    return passed(f"memory {text}, within {tol:.0%}", **kw)


@check("baseline.E003", "NVMe drives as in the baseline", weight=5, needs=("inventory",))
def nvme(s: Any) -> Outcome:
    got = _setup(s, "NVMe drives", lambda b: b.nvme)
    if isinstance(got, Outcome):
        return got
    inv, _b, want = got
    if isinstance(inv.nvme, Unavailable):
        return _unavailable("/sys/class/nvme", inv.nvme)
    have = Counter((d.model, d.size_bytes) for d in inv.nvme)
    wanted = Counter(want)
    details = [f"{d.name}: {d.model} {d.size_bytes / 1e9:.0f} GB" for d in inv.nvme]
    fails, warns = [], []
    if len(inv.nvme) < len(want):
        fails.append(f"{plural(len(inv.nvme), 'NVMe drive')}, the baseline has {len(want)}")
    elif len(inv.nvme) > len(want):
        warns.append(f"{plural(len(inv.nvme), 'NVMe drive')}, the baseline has {len(want)}")
    missing = wanted - have
    extra = have - wanted
    if missing and not fails:
        # Same count, other drives: a replacement of another model or size.
        found = ", ".join(f"{m} ({b / 1e9:.0f} GB)" for m, b in extra.elements())
        gone = ", ".join(f"{m} ({b / 1e9:.0f} GB)" for m, b in missing.elements())
        warns.append(f"found {found} where the baseline has {gone}")
    elif missing:
        details.append("missing: " + ", ".join(f"{m} ({b / 1e9:.0f} GB)" for m, b in missing.elements()))
    ok = f"{plural(len(inv.nvme), 'NVMe drive')}, models and sizes as in the baseline"
    hint = "a drive that dropped off the bus (see 'nvme list' and the kernel log) or was removed: " + REPLACED
    return _verdict(fails, warns, ok, details, hint)


def _ports(
    kind: str, unit: str, have: tuple[Port, ...], want: tuple[tuple[str, float], ...]
) -> tuple[list, list]:
    by_name = {p.name: p for p in have}
    fails, warns = [], []
    for name, rate in want:
        p = by_name.pop(name, None)
        if p is None:
            fails.append(f"{kind} {name} missing")
        elif rate and p.rate is None:
            fails.append(f"{kind} {name} down (the baseline has {rate:g} {unit})")
        elif rate and p.rate is not None and p.rate < rate:
            fails.append(f"{kind} {name} at {p.rate:g} {unit}, the baseline has {rate:g}")
        elif rate and p.rate is not None and p.rate > rate:
            warns.append(f"{kind} {name} at {p.rate:g} {unit}, the baseline has {rate:g}")
    for name in sorted(by_name):
        warns.append(f"{kind} {name} not in the baseline")
    return fails, warns


@check("baseline.E004", "Network ports at their baseline speeds", weight=5, needs=("inventory",))
def ports(s: Any) -> Outcome:
    rdma = "; its RDMA ports are judged by fabric.E001, E002 and E006 (one check per fault)"
    got = _setup(s, "network ports", lambda b: b.nics)
    if isinstance(got, Outcome):
        b = _config(s).baseline
        return skipped(got.message + rdma, hint=got.hint) if b is not None and b.rdma else got
    inv, b, want = got
    if isinstance(inv.nics, Unavailable):
        return _unavailable("ports", inv.nics)
    fails, warns = _ports("port", "Mb/s", inv.nics, want)
    details = [f"{p.name}: {'down' if p.rate is None else f'{p.rate:g} Mb/s'}" for p in inv.nics]
    if b.rdma:
        details.append("RDMA ports: judged against this baseline by fabric.E001, E002 and E006")
    hint = (
        "a port down or trained at a lower speed: check the cable and transceiver ('ethtool <port>', 'ip link'), "
        "then " + REPLACED
    )
    return _verdict(fails, warns, f"{plural(len(want), 'port')} up at their baseline speeds", details, hint)


@check("baseline.E005", "GPUs and their VBIOS as in the baseline", weight=5, needs=("inventory", "nvml"))
def gpus(s: Any) -> Outcome:
    got = _setup(s, "GPUs", lambda b: b.gpus)
    if isinstance(got, Outcome):
        return got
    inv, _b, want = got
    if isinstance(inv.gpus, Unavailable):
        return skipped(f"GPUs not read: {inv.gpus.reason} (see gpu.E001)")
    by_addr = {g.address: g for g in inv.gpus}
    fails, warns = [], []
    for addr, name, vbios in want:
        g = by_addr.pop(addr, None)
        if g is None:
            fails.append(f"no GPU at {addr} (the baseline has a {name})")
        elif g.name != name:
            fails.append(f"GPU {addr} is a {g.name}, the baseline has a {name}")
        elif vbios and g.vbios != vbios:
            warns.append(f"GPU {addr} on VBIOS {g.vbios or 'unknown'}, the baseline has {vbios}")
    for addr in sorted(by_addr):
        warns.append(f"GPU {addr} ({by_addr[addr].name}) not in the baseline")
    details = [f"{g.address}: {g.name}, VBIOS {g.vbios}" for g in inv.gpus]
    hint = (
        "flash the GPU to the baseline's VBIOS with the vendor's firmware bundle, or, for a missing GPU, see "
        "gpu.E001/E002 and the kernel log; " + REPLACED
    )
    return _verdict(
        fails, warns, f"{plural(len(want), 'GPU')} at the baseline's addresses, on its VBIOS", details, hint
    )


@check("baseline.E006", "PCIe links of the GPUs and NICs as in the baseline", weight=5, needs=("inventory",))
def pcie(s: Any) -> Outcome:
    got = _setup(s, "PCIe links", lambda b: b.pcie)
    if isinstance(got, Outcome):
        return got
    inv, _b, want = got
    if isinstance(inv.links, Unavailable):
        return _unavailable("PCI devices", inv.links)
    by_addr = {link.address: link for link in inv.links}
    fails, warns, details = [], [], []
    judged = 0
    for addr, kind, speed, width, max_speed, max_width in want:
        link = by_addr.get(addr)
        if link is None:  # reported by the check of its kind (baseline.E004, E005), not twice
            details.append(f"{kind} {addr}: not on the PCI bus, not judged here")
            continue
        judged += 1
        name = f"{kind} {addr}"
        details.append(
            f"{name}: {_speed(link.speed_gts)} x{link.width or '?'} "
            f"(max {_speed(link.max_speed_gts)} x{link.max_width or '?'})"
        )
        if width and (link.width or 0) < width:
            fails.append(f"{name} at x{link.width or '?'}, the baseline has x{width}")
        if max_width and (link.max_width or 0) < max_width:
            fails.append(f"{name} capable of x{link.max_width or '?'}, the baseline has x{max_width}")
        if max_speed and (link.max_speed_gts or 0) < max_speed:
            fails.append(
                f"{name} capable of {_speed(link.max_speed_gts)}, the baseline has {_speed(max_speed)}"
            )
        elif speed and (link.speed_gts or 0) < min(speed, max_speed or speed):
            # GPUs lower their link speed when idle: below the baseline's speed is only a warning.
            warns.append(
                f"{name} at {_speed(link.speed_gts)}, the baseline has {_speed(speed)} "
                "(idle power saving, or a degraded link)"
            )
    if not judged:
        return skipped("none of the baseline's PCIe devices is on the PCI bus", details=tuple(details))
    hint = (
        "a narrower or slower link means a badly seated card, riser or cable: reseat it, check "
        "'lspci -vvv -s <address>' (LnkSta) under load and the BIOS PCIe settings; " + REPLACED
    )
    ok = f"{plural(judged, 'PCIe link')} at the baseline's width and speed"
    return _verdict(fails, warns, ok, details, hint)


def _speed(gts: float | None) -> str:
    return f"{gts:g} GT/s" if gts else "unknown speed"


@check("baseline.E007", "NUMA layout as in the baseline", weight=2, needs=("inventory",))
def numa(s: Any) -> Outcome:
    got = _setup(s, "NUMA layout", lambda b: b.numa_cpus)
    if isinstance(got, Outcome):
        return got
    inv, _b, want = got
    if isinstance(inv.numa_cpus, Unavailable):
        return _unavailable("NUMA nodes", inv.numa_cpus)
    have = inv.numa_cpus
    details = [f"node{i}: CPUs {c}" for i, c in enumerate(have)]
    if len(have) != len(want):
        return warned(
            f"{plural(len(have), 'NUMA node')}, the baseline has {len(want)}",
            hint="a firmware setting changed the NUMA layout (NPS on AMD, SNC on Intel), or a socket is "
            "missing (baseline.E001); set it back in the BIOS, or record the node type again with 'hostcheck baseline'",
            details=tuple(details),
        )
    odd = [f"node{i}: CPUs {h}, the baseline has {w}" for i, (h, w) in enumerate(zip(have, want)) if h != w]
    if odd:
        return warned(
            "; ".join(odd),
            hint="CPUs offline or a firmware setting changed (SMT, NPS/SNC): 'lscpu', the BIOS, "
            "or record the node type again with 'hostcheck baseline'",
            details=tuple(details),
        )
    return passed(f"{plural(len(have), 'NUMA node')} with the baseline's CPUs", details=tuple(details))
