"""RDMA fabric checks (fabric.E001-E009): ports, rates, error counters and link-down events since the last run,
NIC firmware, GPU-NIC placement, ACS on the paths between them, the GPUDirect RDMA path and the NCCL variables of
the training environment. Pure functions of the Snapshot; the reading is hostcheck.gather.rdma, the thresholds
hostcheck/data/thresholds.json, the expected fabric ``[fabric]`` in the configuration (docs/fabric.md).

A node without an RDMA device gets skips that say so, never a fail; what could not be read is said, never judged.
"""

from __future__ import annotations

from typing import Any

from hostcheck.checks.gpu import _config
from hostcheck.gather.base import NOT_FOUND, Unavailable
from hostcheck.gather.rdma import (
    APART,
    ERROR_COUNTERS,
    LINK_DOWNED,
    NUMA,
    SWITCH,
    RdmaPort,
    RdmaSnapshot,
    nccl_list,
    pair_gpus,
)
from hostcheck.gather.state import FIRST, RISING
from hostcheck.registry import Outcome, check, errored, failed, passed, plural, skipped, warned

#: GCM's error counters but link_downed, which is judged on its own (fabric.E004).
RISING_ERRORS = tuple(c for c in ERROR_COUNTERS if c != LINK_DOWNED)
UP_STATE, UP_PHYS = "ACTIVE", "LinkUp"
#: NCCL_NET_GDR_LEVEL's values (NCCL's environment variable documentation); integers are its legacy form.
GDR_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS")
PORT_FIX = (
    "check the cable, transceiver and switch port ('ibstat', 'ibv_devinfo -v'; for RoCE 'ip link' and the switch), "
    "reseat or replace the cable; a port that stays down needs the node drained"
)
COUNTER_FIX = (
    "a cable or transceiver is going bad: look at the port's counters over time ('perfquery -x' or the files "
    "under /sys/class/infiniband/<dev>/ports/<n>/counters/), reseat or replace the cable, drain the node if "
    "they keep rising"
)


def _rdma(s: Any) -> RdmaSnapshot | Outcome:
    r = getattr(s, "rdma", None)
    if not isinstance(r, RdmaSnapshot):
        return skipped("RDMA fabric not gathered")
    if isinstance(r.devices, Unavailable):
        if r.devices.kind == NOT_FOUND:
            return skipped(f"no RDMA device on this node ({r.devices.reason})")
        return errored(f"RDMA devices could not be read: {r.devices.reason}")
    if not r.devices:
        return skipped("no RDMA device on this node (/sys/class/infiniband is empty)")
    return r


def _ports(r: RdmaSnapshot) -> list[RdmaPort]:
    return [p for d in r.devices for p in d.ports] if isinstance(r.devices, tuple) else []


def _up(p: RdmaPort) -> bool:
    return p.state == UP_STATE and p.phys_state == UP_PHYS


def _gpu_names(s: Any) -> dict[str, str]:
    """sysfs PCI address -> "GPU <index>" from NVML, where NVML is there."""
    out: dict[str, str] = {}
    for g in getattr(getattr(s, "nvml", None), "gpus", None) or ():
        bus = g.pci_bus_id if isinstance(g.pci_bus_id, str) else ""
        dom, _colon, rest = bus.lower().partition(":")
        if rest and dom and len(dom) <= 8 and all(c in "0123456789abcdef" for c in dom):
            out[f"{int(dom, 16):04x}:{rest}"] = f"GPU {g.index}"
    return out


def _gpu(names: dict[str, str], address: str) -> str:
    return f"{names[address]} ({address})" if address in names else f"GPU {address}"


def _history(r: RdmaSnapshot) -> str:
    st = r.state
    if st.read_error is not None:
        return f"no usable history ({st.read_error.reason}): baseline recorded now"
    if "rdma" not in st.previous:
        return "first run: baseline recorded, rises are judged from the next run"
    return ""


@check("fabric.E001", "RDMA ports up (count, state, physical state, link layer)", weight=8, needs=("rdma",))
def ports_up(s: Any) -> Outcome:
    r = _rdma(s)
    if isinstance(r, Outcome):
        return r
    want = _config(s).fabric
    ports = _ports(r)
    fails, warns, unread = [], [], []
    for p in ports:
        if not p.state or not p.phys_state:  # not readable: said, never judged
            unread.append(f"{p.name}: state not readable")
        elif not _up(p):
            fails.append(f"{p.name}: state {p.state or '?'}, physical state {p.phys_state or '?'}")
        if want.link_layer and p.link_layer and p.link_layer != want.link_layer:
            fails.append(f"{p.name}: link layer {p.link_layer or '?'}, expected {want.link_layer}")
    if want.expected_ports is not None and len(ports) < want.expected_ports:
        fails.append(f"{plural(len(ports), 'RDMA port')}, expected {want.expected_ports}")
    elif want.expected_ports is not None and len(ports) > want.expected_ports:
        warns.append(f"{plural(len(ports), 'RDMA port')}, more than the {want.expected_ports} expected")
    expected = want.expected_ports if want.expected_ports is not None else None
    if fails:
        return failed(
            "; ".join(fails + warns),
            value=len(ports),
            expected=expected,
            hint=PORT_FIX,
            details=tuple(unread),
        )
    if unread and len(unread) == len(ports):
        return skipped(f"no RDMA port state readable ({plural(len(ports), 'port')})", details=tuple(unread))
    # Devices or ports past the reader's caps, or whose reading failed: the ports judged are not all there are.
    warns += list(r.unread)
    if warns:
        hint = "set [fabric] expected_ports" if not r.unread else PORT_FIX
        return warned("; ".join(warns), value=len(ports), expected=expected, hint=hint, details=tuple(unread))
    layers = sorted({p.link_layer for p in ports if p.link_layer})
    up = len(ports) - len(unread)
    msg = f"{plural(up, 'RDMA port')} ACTIVE/LinkUp ({', '.join(layers) or 'link layer unknown'})"
    if unread:
        msg += f" ({len(unread)} not readable, not judged)"
    return passed(msg, value=len(ports), details=tuple(unread))


@check("fabric.E002", "RDMA port rate", weight=5, needs=("rdma",))
def port_rate(s: Any) -> Outcome:
    r = _rdma(s)
    if isinstance(r, Outcome):
        return r
    want = _config(s).fabric.rate_gbps
    up = [p for p in _ports(r) if _up(p)]
    unread = [f"{p.name}: rate unreadable ({p.rate_text or 'empty'})" for p in up if p.rate_gbps is None]
    rated = [p for p in up if p.rate_gbps is not None]
    if not rated:
        return skipped("no active port with a readable rate", details=tuple(unread))
    details = tuple(f"{p.name}: {p.rate_text}" for p in rated) + tuple(unread)
    if want is not None:
        slow = [p for p in rated if p.rate_gbps < want]
        if slow:
            what = "; ".join(f"{p.name} at {p.rate_gbps:g} Gb/s" for p in slow)
            return failed(
                f"{what}, expected {want:g} Gb/s ([fabric] rate_gbps)",
                value=min(p.rate_gbps for p in slow),
                unit="Gb/s",
                expected=want,
                hint="the link trained below its speed: " + PORT_FIX,
                details=details,
            )
        return passed(
            f"{plural(len(rated), 'active port')} at {want:g} Gb/s or more",
            unit="Gb/s",
            expected=want,
            details=details,
        )
    # Peers: ports of the same NIC model on the same link layer (a front-end NIC of another model is no peer).
    board = {d.name: d.board_id for d in r.devices} if isinstance(r.devices, tuple) else {}
    slow = []
    for group in sorted({(p.link_layer, board.get(p.device, "")) for p in rated}):
        peers = [p for p in rated if (p.link_layer, board.get(p.device, "")) == group]
        top = max(p.rate_gbps for p in peers)
        slow += [(p, top) for p in peers if p.rate_gbps < top]
    if slow:
        what = "; ".join(f"{p.name} at {p.rate_gbps:g} Gb/s, its peers at {top:g}" for p, top in slow)
        return warned(
            f"{what} (no [fabric] rate_gbps set: compared with the node's other ports)",
            hint="the link trained below its peers' speed: "
            + PORT_FIX
            + "; set [fabric] rate_gbps to judge it",
            details=details,
        )
    return passed(
        f"{plural(len(rated), 'active port')}, all at the same rate as their peers (no [fabric] rate_gbps set)",
        details=details,
    )


def _rises(r: RdmaSnapshot, names: tuple[str, ...]) -> tuple[dict[str, int], list[str]]:
    """Per port: the increments of ``names`` since the last run; and the per-counter lines."""
    rises: dict[str, int] = {}
    lines = []
    for p in _ports(r):
        for k in names:
            if k not in p.counters:
                continue
            t = r.state.trend("rdma", f"{p.device}:{p.port}.{k}", p.counters[k])
            if t.kind == RISING:
                rises[p.name] = rises.get(p.name, 0) + t.delta
                lines.append(f"{p.name} {k}: +{t.delta} since the last run (now {t.value})")
            elif t.kind == FIRST and t.value:
                lines.append(f"{p.name} {k}: {t.value} since the counters were cleared (baseline)")
    return rises, lines


@check("fabric.E003", "RDMA port error counters rising", weight=5, needs=("rdma",))
def port_errors(s: Any) -> Outcome:
    r = _rdma(s)
    if isinstance(r, Outcome):
        return r
    th = _config(s).thresholds
    rises, lines = _rises(r, RISING_ERRORS)
    note = _history(r)
    details = tuple(lines + ([note] if note else []))
    bad = {n: d for n, d in rises.items() if d >= th.rdma_error_rise_warn}
    if not bad:
        return passed(f"{len(_ports(r))} port(s): no error counter rising", details=details)
    msg = "; ".join(f"{n}: {d} new error(s)" for n, d in sorted(bad.items()))
    worst = max(bad.values())
    kw = dict(
        value=worst, expected=f"fewer than {th.rdma_error_rise_warn}", hint=COUNTER_FIX, details=details
    )
    if worst >= th.rdma_error_rise_fail:
        return failed(msg + f" (fail from {th.rdma_error_rise_fail})", **kw)
    return warned(msg, **kw)


@check("fabric.E004", "RDMA link-down events since the last run", weight=5, needs=("rdma",))
def link_downed(s: Any) -> Outcome:
    r = _rdma(s)
    if isinstance(r, Outcome):
        return r
    limit = _config(s).thresholds.rdma_link_downed_rise_fail
    rises, lines = _rises(r, (LINK_DOWNED,))
    note = _history(r)
    details = tuple(lines + ([note] if note else []))
    bad = {n: d for n, d in rises.items() if d >= limit}
    if bad:
        return failed(
            "; ".join(f"{n}: link went down {d} time(s) since the last run" for n, d in sorted(bad.items())),
            value=max(bad.values()),
            hint="the link flaps: " + COUNTER_FIX,
            details=details,
        )
    return passed(
        f"{len(_ports(r))} port(s): no link-down event since the last run", value=0, details=details
    )


@check("fabric.E005", "NIC firmware the same on every NIC of a model", weight=2, needs=("rdma",))
def firmware(s: Any) -> Outcome:
    r = _rdma(s)
    if isinstance(r, Outcome):
        return r
    by_board: dict[str, dict[str, list[str]]] = {}
    for d in r.devices:
        if d.fw_ver:
            by_board.setdefault(d.board_id or "?", {}).setdefault(d.fw_ver, []).append(d.name)
    drift = []
    for board, versions in sorted(by_board.items()):
        if len(versions) > 1:
            common = max(versions, key=lambda v: len(versions[v]))
            odd = [f"{', '.join(n)} at {v}" for v, n in sorted(versions.items()) if v != common]
            drift.append(f"{'; '.join(odd)} (the other {board} NICs at {common})")
    if drift:
        return warned(
            "firmware drift: " + "; ".join(drift),
            hint="flash every NIC of a model to the same firmware ('mlxfwmanager --query', then the site's image)",
        )
    if not by_board:
        return skipped("no NIC firmware version readable (fw_ver)")
    return passed("; ".join(f"{board}: {next(iter(v))}" for board, v in sorted(by_board.items())))


@check("fabric.E006", "Every GPU paired with a NIC (PCIe switch, else NUMA node)", weight=3, needs=("rdma",))
def placement(s: Any) -> Outcome:
    r = _rdma(s)
    if isinstance(r, Outcome):
        return r
    if not r.gpus:
        return skipped("no GPU with a readable PCI path on this node")
    if not r.nics:
        return skipped("no RDMA NIC with a readable PCI path on this node")
    names = _gpu_names(s)
    pairs = pair_gpus(r)
    details = tuple(f"{_gpu(names, p.gpu)}: {p.nic or 'no NIC'} ({p.level})" for p in pairs)
    far = [p for p in pairs if p.level != SWITCH]
    if far:
        what = "; ".join(
            f"{_gpu(names, p.gpu)}: nearest NIC {p.nic} "
            + ("on its NUMA node, not under its PCIe switch" if p.level == NUMA else "on another NUMA node")
            for p in far
        )
        return warned(
            what,
            hint="GPUDirect RDMA needs the GPU and NIC under one PCIe root complex, best one switch: move the NIC "
            "to the GPU's riser/slot as the board's manual shows, or check the BIOS's PCIe bifurcation",
            details=details,
        )
    return passed(f"{plural(len(pairs), 'GPU')}, each with a NIC under its PCIe switch", details=details)


@check("fabric.E007", "ACS off on the GPU-NIC PCIe paths", weight=5, needs=("rdma",))
def acs_off(s: Any) -> Outcome:
    r = _rdma(s)
    if isinstance(r, Outcome):
        return r
    pairs = [p for p in pair_gpus(r) if p.nic and p.level != APART]
    if not pairs:
        return skipped("no GPU-NIC pair on this node")
    names = _gpu_names(s)
    on, unread = [], set()
    for p in pairs:
        for b in p.bridges:
            acs = r.acs.get(b)
            if acs is None or acs.enabled is None:
                unread.add(f"{b}: {acs.why if acs else 'not read'}")
            elif acs.enabled:
                on.append(
                    f"bridge {b} between {_gpu(names, p.gpu)} and {p.nic}: ACSCtl {'+ '.join(acs.enabled)}+"
                )
    if on:
        return failed(
            "; ".join(dict.fromkeys(on)),
            hint="ACS redirects GPU-NIC traffic through the CPU's root complex: disable it in the BIOS (ACS / "
            "PCIe isolation) or at boot ('setpci -s <bridge> ECAP_ACS+0x6.w=0000'), as NCCL's troubleshooting "
            "guide says",
        )
    if unread:
        return skipped(
            f"ACS not readable on {plural(len(unread), 'bridge')} (run as root)",
            details=tuple(sorted(unread)),
        )
    return passed(f"ACS off on every bridge between {plural(len(pairs), 'GPU')} and the NICs")


@check("fabric.E008", "GPUDirect RDMA path (nvidia-peermem or DMA-BUF)", weight=5, needs=("rdma",))
def gpudirect(s: Any) -> Outcome:
    r = _rdma(s)
    if isinstance(r, Outcome):
        return r
    if not r.gpus:
        return skipped("no GPU with a readable PCI path on this node: GPUDirect RDMA not judged")
    gd = r.gpudirect
    if gd.peermem:
        return passed(f"{gd.peermem} loaded: the NICs reach GPU memory (peer memory)")
    if gd.open_modules:
        return passed("NVIDIA's open kernel modules: GPU memory registers with the NICs through DMA-BUF")
    if gd.open_modules is None:
        return skipped("NVIDIA kernel module not loaded: GPUDirect RDMA not judged")
    return failed(
        f"no GPUDirect RDMA path: neither nvidia-peermem loaded nor the open kernel modules (DMA-BUF) with "
        f"{plural(len(r.gpus), 'GPU')} and {plural(len(r.devices), 'RDMA device')}: NCCL stages every transfer "
        "through host memory",
        hint="install NVIDIA's open kernel modules (DMA-BUF, NVIDIA's recommendation) or load nvidia-peermem "
        "('modprobe nvidia-peermem', and list it in /etc/modules-load.d)",
    )


def _matches(name: str, entries: list[tuple[str, int | None]], exact: bool) -> list[tuple[str, int | None]]:
    return [(n, port) for n, port in entries if (name == n if exact else name.startswith(n))]


@check(
    "fabric.E009",
    "NCCL variables name RDMA devices and interfaces that exist and are up",
    weight=3,
    needs=("rdma",),
)
def nccl_devices(s: Any) -> Outcome:
    r = _rdma(s)
    if isinstance(r, Outcome):
        return r
    env = r.nccl_env
    where = f" ({r.env_file})" if r.env_file else ""
    fails, warns, seen = [], [], []
    ports = _ports(r)
    hca = env.get("NCCL_IB_HCA")
    if hca is not None:
        seen.append(f"NCCL_IB_HCA={hca}")
        exclude, exact, entries = nccl_list(hca)
        if exclude:
            left = [p for p in ports if not _matches(p.device, entries, exact) and _up(p)]
            if not left:
                fails.append(f"NCCL_IB_HCA={hca} excludes every active RDMA port")
        for name, port in [] if exclude else entries:
            hits = [
                p
                for p in ports
                if _matches(p.device, [(name, port)], exact) and (port is None or p.port == port)
            ]
            if not hits:
                fails.append(f"NCCL_IB_HCA names {name}{f':{port}' if port else ''}, which does not exist")
            elif not any(_up(p) for p in hits):
                fails.append(
                    f"NCCL_IB_HCA names {name}: " + ", ".join(f"{p.name} {p.state or '?'}" for p in hits)
                )
    ifname = env.get("NCCL_SOCKET_IFNAME")
    if ifname is not None and isinstance(r.netifs, dict):
        seen.append(f"NCCL_SOCKET_IFNAME={ifname}")
        exclude, exact, entries = nccl_list(ifname)
        for name, _port in [] if exclude else entries:
            hits = {n: st for n, st in r.netifs.items() if (n == name if exact else n.startswith(name))}
            if not hits:
                fails.append(f"NCCL_SOCKET_IFNAME names {name}, which matches no network interface")
            elif not any(st in ("up", "unknown") for st in hits.values()):
                fails.append(
                    f"NCCL_SOCKET_IFNAME names {name}: " + ", ".join(f"{n} {st}" for n, st in hits.items())
                )
    gdr = env.get("NCCL_NET_GDR_LEVEL")
    if gdr is not None:
        seen.append(f"NCCL_NET_GDR_LEVEL={gdr}")
        if gdr.strip().upper() not in GDR_LEVELS and not gdr.strip().isdigit():
            warns.append(f"NCCL_NET_GDR_LEVEL={gdr} is not one of {', '.join(GDR_LEVELS)}")
    if env.get("NCCL_IB_DISABLE", "").strip() == "1" and any(_up(p) for p in ports):
        warns.append("NCCL_IB_DISABLE=1: NCCL will not use the active RDMA ports (sockets only)")
    hint = (
        f"fix the training environment{where}: name devices from 'ls /sys/class/infiniband' with an active port "
        "('ibstat') and interfaces from 'ip link' (NCCL's environment variable documentation)"
    )
    if fails:
        return failed("; ".join(fails + warns) + where, hint=hint)
    if warns:
        return warned("; ".join(warns) + where, hint=hint)
    if not seen:
        return passed(f"no NCCL device variable set{where}: NCCL chooses the devices itself")
    return passed("; ".join(seen) + where + ": every named device exists and is up")
