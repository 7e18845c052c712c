"""The RDMA fabric from sysfs: InfiniBand/RoCE ports, the PCI paths between GPUs and NICs, ACS on the bridges
between them, the GPUDirect RDMA kernel path and NCCL's configuration (hostcheck.gather.nccl_conf).

Read-only, under the one host root (``Options.host_root``), every file through the one bounded reader; the
``parse_*`` functions are pure. Nothing is written but the counters (through :mod:`hostcheck.gather.state`, by
the caller, once per run).

Sources: the port files (``state``, ``phys_state``, ``rate``, ``link_layer``, ``counters/``, ``hw_counters/``) and
the device files (``fw_ver``, ``board_id``, ``device``), the kernel's Documentation/ABI/stable/sysfs-class-infiniband;
``numa_node`` and the ``/sys/bus/pci/devices/<address>`` links into the bridge hierarchy,
Documentation/ABI/testing/sysfs-bus-pci; ACS (PCI Express extended capability 0x000D, its control register at +6),
the PCI Express Base Specification as pciutils' ``lspci -vvv`` decodes it (``ACSCtl: SrcValid+ ...``, ls-ecaps.c).
A non-root reader gets the first 64 bytes of a device's ``config`` only (drivers/pci/pci-sysfs.c), so ACS is then
"not readable", never "off".

The error counters are the PMA PortCounters fields, whose widths the kernel reads them at
(drivers/infiniband/core/sysfs.c, ``PORT_PMA_ATTR``): ``link_downed`` and ``link_error_recovery`` 8 bits, the
constraint errors 8 bits, ``local_link_integrity_errors`` and ``excessive_buffer_overrun_errors`` 4 bits, the
others 16 bits. PMA counters stop at their maximum (the InfiniBand architecture's PortCounters attribute): a
counter at its maximum is saturated and cannot rise however many events follow.

Where GPUs and NICs sit against each other, in NCCL's words, is hostcheck.gather.rdma_topology's.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field

from hostcheck import infile
from hostcheck.gather.base import (
    HOST_ROOT,
    Unavailable,
    guarded,
    list_dir,
    outside_root,
    parse_counter,
    parse_int,
    read_text,
    under,
)
from hostcheck.gather.hardware import PCI_DEVICES, pci_kind
from hostcheck.gather.nccl_conf import NcclConfig
from hostcheck.gather.state import CounterState

IB_CLASS = "sys/class/infiniband"
NET_CLASS = "sys/class/net"
#: Devices, ports and counters read at most: a node has tens, a hostile tree could have millions. Devices and ports
#: past the cap are counted (up to MAX_LISTED names) and said (RdmaSnapshot.unread), never dropped in silence.
MAX_DEVICES, MAX_PORTS, MAX_COUNTERS = 1024, 16, 256
MAX_LISTED = 1 << 16
BDF_RE = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
ROOT_RE = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")
#: The modules that give the NICs GPU memory (the peer-memory path): nvidia-peermem since R470, nv_peer_mem before.
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")
#: ACS control bits that send peer-to-peer traffic up to the root complex (lspci: SrcValid ReqRedir CmpltRedir
#: UpstreamFwd).
ACS_P2P_BITS = {0x01: "SrcValid", 0x04: "ReqRedir", 0x08: "CmpltRedir", 0x10: "UpstreamFwd"}
ACS_CAP_ID = 0x000D
#: Meta GCM's twelve IB port error counters (gcm/health_checks/checks/check_ib_counters.py, ERROR_COUNTERS): what
#: fabric.E003/E004 judge and the port records carry.
ERROR_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
)
LINK_DOWNED = "link_downed"
#: Seconds in each unit a counter line is stated per (NVIDIA NVSentinel states them per second, minute or hour).
WINDOW_S = {"s": 1.0, "min": 60.0, "h": 3600.0}
#: Each error counter's width in bits as the kernel reads it (drivers/infiniband/core/sysfs.c, PORT_PMA_ATTR).
COUNTER_BITS = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
}


@dataclass(frozen=True)
class RdmaPort:
    """One port of an RDMA device, as the kernel shows it; also what a baseline records of a NIC."""

    device: str  # mlx5_0
    port: int
    state: str = ""  # ACTIVE (from "4: ACTIVE")
    phys_state: str = ""  # LinkUp (from "5: LinkUp")
    rate_gbps: float | None = None  # 400.0 (from "400 Gb/sec (4X NDR)"); None: unreadable
    rate_text: str = ""
    link_layer: str = ""  # InfiniBand / Ethernet
    counters: dict[str, int] = field(default_factory=dict)
    hw_counters: dict[str, int] = field(default_factory=dict)
    #: Why no error counter could be read ("" when one was): the folder missing, or what a file said instead
    #: of a number ("N/A (no PMA)": the device has no performance management agent).
    counters_unread: str = ""

    @property
    def name(self) -> str:
        return f"{self.device} port {self.port}"

    @property
    def short(self) -> str:
        """``mlx5_3:1``, for the few words of a drain reason."""
        return f"{self.device}:{self.port}"


@dataclass(frozen=True)
class RdmaDevice:
    name: str
    pci: str | None = None  # 0000:1a:00.0
    numa_node: int | None = None
    fw_ver: str = ""
    board_id: str = ""
    netdevs: tuple[str, ...] = ()
    ports: tuple[RdmaPort, ...] = ()


@dataclass(frozen=True)
class PciPath:
    """A GPU or NIC and the bridges above it, from its root complex (``pci0000:15``) down."""

    address: str
    kind: str  # "GPU" or "NIC"
    root: str = ""
    bridges: tuple[str, ...] = ()
    numa_node: int | None = None


@dataclass(frozen=True)
class Acs:
    bridge: str
    #: Control bits that redirect peer traffic that are set (names), () when off; None: not readable.
    enabled: tuple[str, ...] | None
    why: str = ""


@dataclass(frozen=True)
class GpuDirect:
    #: The peer-memory module loaded (its name), or "".
    peermem: str = ""
    #: True: NVIDIA's open kernel modules (DMA-BUF can serve); False: the proprietary ones; None: no driver read.
    open_modules: bool | None = None


@dataclass(frozen=True)
class RdmaSnapshot:
    root: str = HOST_ROOT
    #: The RDMA devices, or why /sys/class/infiniband could not be listed (NOT_FOUND: none on this node).
    devices: tuple[RdmaDevice, ...] | Unavailable = ()
    #: PCI paths of the GPUs and of the RDMA devices' PCI functions (a device without a readable path is left out).
    gpus: tuple[PciPath, ...] = ()
    nics: tuple[PciPath, ...] = ()
    #: ACS of every bridge on a GPU's or NIC's path.
    acs: dict[str, Acs] = field(default_factory=dict)
    gpudirect: GpuDirect = field(default_factory=GpuDirect)
    #: Network interfaces and their operstate (up, down, unknown...).
    netifs: dict[str, str] | Unavailable = field(default_factory=dict)
    #: NCCL's configuration: the environment and NCCL's files, in NCCL's order.
    nccl: NcclConfig = field(default_factory=NcclConfig)
    #: What was not read, one sentence each: devices and ports past the caps, a device whose reading failed.
    unread: tuple[str, ...] = ()
    state: CounterState = field(default_factory=CounterState)
    taken_at: float = 0.0

    @property
    def nccl_env(self) -> dict[str, str]:
        """The NCCL_* variables NCCL uses (the first source setting each)."""
        return self.nccl.effective()


# --- pure parsing ---------------------------------------------------------------------------------------


def parse_enum(text: str) -> str:
    """``4: ACTIVE`` -> ``ACTIVE``; ``5: LinkUp`` -> ``LinkUp`` (the kernel prints "<number>: <name>")."""
    t = text.strip()
    m = re.fullmatch(r"[0-9]{1,3}:\s*([A-Za-z_ ]{1,40})", t)
    return m.group(1).strip() if m else t[:40]


def parse_rate(text: str) -> float | None:
    """``400 Gb/sec (4X NDR)`` -> 400.0; ``2.5 Gb/sec (1X SDR)`` -> 2.5; garbage -> None."""
    m = re.match(r"\s*([0-9]{1,5}(?:\.[0-9]{1,3})?) Gb/sec\b", text)
    return float(m.group(1)) if m else None


def parse_numa(text: str) -> int | None:
    return parse_int(text, digits=4)  # -1: no NUMA affinity


def parse_pci_link(target: str, address: str) -> tuple[str, tuple[str, ...]] | None:
    """The root complex and bridges above ``address`` from its /sys/bus/pci/devices link's target
    (``../../../devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:18:00.0``), or None when it is not such a path."""
    parts = [p for p in target.split("/") if p not in ("", ".", "..")]
    roots = [i for i, p in enumerate(parts) if ROOT_RE.fullmatch(p)]
    if not roots or not parts or parts[-1] != address:
        return None
    chain = parts[roots[0] + 1 : -1]
    if not all(BDF_RE.fullmatch(p) for p in chain):
        return None
    return parts[roots[0]], tuple(chain)


def parse_acs(config: bytes) -> tuple[str, ...] | None:
    """The redirecting ACS control bits set in a PCI device's config space (names; () when the device has no
    ACS capability or it is off), or None when the extended space (past 256 bytes) is not in ``config``."""
    if len(config) < 0x104:
        return None
    offset, seen = 0x100, set()
    while 0x100 <= offset <= len(config) - 8 and offset not in seen:
        seen.add(offset)
        (header,) = struct.unpack_from("<I", config, offset)
        if header in (0, 0xFFFFFFFF):
            return ()
        if header & 0xFFFF == ACS_CAP_ID:
            (ctl,) = struct.unpack_from("<H", config, offset + 6)
            return tuple(name for bit, name in ACS_P2P_BITS.items() if ctl & bit)
        offset = (header >> 20) & 0xFFC
    return ()


def nccl_list(value: str) -> tuple[bool, bool, list[tuple[str, int | None]]]:
    """NCCL_IB_HCA / NCCL_SOCKET_IFNAME: (exclude, exact, [(name, port or None)]): a leading ``^`` excludes, then
    a ``=`` asks for exact names instead of prefixes; entries are comma-separated, ``name[:port]`` (NCCL's
    environment variable documentation)."""
    v = value.strip()
    exclude = v.startswith("^")
    v = v[1:] if exclude else v
    exact = v.startswith("=")
    v = v[1:] if exact else v
    out: list[tuple[str, int | None]] = []
    for item in v.split(",")[:64]:
        name, _colon, port = item.strip().partition(":")
        if name:
            out.append((name[:64], parse_int(port, digits=3)))
    return exclude, exact, out


def saturated(counter: str, value: int) -> bool:
    """True when ``counter`` is at the largest value its PMA field holds (it stops there: it cannot rise)."""
    bits = COUNTER_BITS.get(counter)
    return bits is not None and value >= (1 << bits) - 1


def per(delta: int, elapsed_s: float, unit: str) -> float:
    """A counter's rise as a rate per ``unit``, taken over at least one ``unit``: a rise over a shorter interval
    counts as if spread over a whole one, so a short gap between two runs never inflates a burst into a rate."""
    window = WINDOW_S[unit]
    return delta * window / max(elapsed_s, window)


# --- reading --------------------------------------------------------------------------------------------


def _text(path: str, limit: int = 256) -> str:
    t = read_text(path, limit)
    return t.strip() if isinstance(t, str) else ""


def _link_name(path: str) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def _counters(folder: str) -> tuple[dict[str, int], str]:
    """The counters of a folder, and why none of GCM's error counters could be read ("" when one was)."""
    names = list_dir(folder)
    if isinstance(names, Unavailable):
        return {}, names.reason
    out: dict[str, int] = {}
    said = ""
    for n in names[:MAX_COUNTERS]:
        if re.fullmatch(r"[A-Za-z0-9_]{1,64}", n):
            t = read_text(os.path.join(folder, n), 64)
            v = parse_counter(t) if isinstance(t, str) else None
            if v is not None:
                out[n] = v
            elif n in COUNTER_BITS and not said:
                said = f"{n}: {t.strip()[:40]!r}" if isinstance(t, str) else f"{n}: {t.reason}"
    if any(k in out for k in ERROR_COUNTERS):
        return out, ""
    return out, said or "no error counter in counters/"


def read_port(dev_dir: str, device: str, port: int) -> RdmaPort:
    d = os.path.join(dev_dir, "ports", str(port))
    rate = _text(os.path.join(d, "rate"))
    counters, unread = _counters(os.path.join(d, "counters"))
    return RdmaPort(
        device=device,
        port=port,
        state=parse_enum(_text(os.path.join(d, "state"))),
        phys_state=parse_enum(_text(os.path.join(d, "phys_state"))),
        rate_gbps=parse_rate(rate),
        rate_text=rate[:40],
        link_layer=_text(os.path.join(d, "link_layer"))[:20],
        counters=counters,
        hw_counters=_counters(os.path.join(d, "hw_counters"))[0],
        counters_unread=unread,
    )


def _past(what: str, names: list, cap: int) -> list[str]:
    """The sentence for the names of a listing past its cap, or none."""
    if len(names) <= cap:
        return []
    more = "or more " if len(names) >= MAX_LISTED else ""
    return [f"{len(names) - cap} {more}{what} past the first {cap} not read"]


def read_device(base: str, name: str) -> tuple[RdmaDevice, list[str]]:
    """One device under ``base`` (/sys/class/infiniband) and what of it was not read."""
    d = os.path.join(base, name)
    pci = _link_name(os.path.join(d, "device"))
    listed = list_dir(os.path.join(d, "ports"), MAX_LISTED)
    numbers = sorted(n for n in map(parse_int, listed if isinstance(listed, list) else []) if n is not None)
    nets = list_dir(os.path.join(d, "device", "net"))
    device = RdmaDevice(
        name=name,
        pci=pci if pci and BDF_RE.fullmatch(pci) else None,
        numa_node=parse_numa(_text(os.path.join(d, "device", "numa_node"))),
        fw_ver=_text(os.path.join(d, "fw_ver"))[:64],
        board_id=_text(os.path.join(d, "board_id"))[:64],
        netdevs=tuple(n[:32] for n in nets[:16]) if isinstance(nets, list) else (),
        ports=tuple(read_port(d, name, p) for p in numbers[:MAX_PORTS]),
    )
    return device, _past(f"ports of {name}", numbers, MAX_PORTS)


def read_devices_noted(root: str) -> tuple[tuple[RdmaDevice, ...] | Unavailable, tuple[str, ...]]:
    """The RDMA devices under ``root`` (the first MAX_DEVICES by name), and what was not read: the devices and
    ports past the caps, each device whose reading failed (left out; the others are read)."""
    base = under(root, IB_CLASS)
    names = list_dir(base, MAX_LISTED)
    if isinstance(names, Unavailable):
        return names, ()
    names = [n for n in names if re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", n)]
    out, unread = [], _past("RDMA devices", names, MAX_DEVICES)
    for name in names[:MAX_DEVICES]:
        got = guarded(name, lambda name=name: read_device(base, name))
        if isinstance(got, Unavailable):
            unread.append(got.reason)
            continue
        out.append(got[0])
        unread += got[1]
    return tuple(out), tuple(unread)


def read_devices(root: str) -> tuple[RdmaDevice, ...] | Unavailable:
    """The RDMA devices under ``root`` (:func:`read_devices_noted` without its notes)."""
    return read_devices_noted(root)[0]


def read_path(root: str, address: str, kind: str) -> PciPath | None:
    link = os.path.join(under(root, PCI_DEVICES), address)
    try:
        target = os.readlink(link)
    except OSError:
        return None
    parsed = parse_pci_link(target, address)
    if parsed is None:
        return None
    return PciPath(address, kind, parsed[0], parsed[1], parse_numa(_text(os.path.join(link, "numa_node"))))


def read_gpu_paths(root: str) -> tuple[PciPath, ...]:
    base = under(root, PCI_DEVICES)
    names = list_dir(base)
    out = []
    for dev in (names if isinstance(names, list) else [])[:4096]:
        if BDF_RE.fullmatch(dev) and pci_kind(os.path.join(base, dev)) == "GPU":
            path = read_path(root, dev, "GPU")
            if path is not None:
                out.append(path)
    return tuple(out)


def read_acs(root: str, bridge: str) -> Acs:
    path = os.path.join(under(root, PCI_DEVICES), bridge, "config")
    escape = outside_root(path)
    if escape:
        return Acs(bridge, None, escape)
    try:
        data = infile.read_bytes(path, 4096, truncate=True)
    except infile.ReadError as exc:
        return Acs(bridge, None, f"config space not readable: {exc}")
    bits = parse_acs(data)
    if bits is None:
        return Acs(bridge, None, f"only {len(data)} bytes of config space readable (ACS needs root)")
    return Acs(bridge, bits)


def read_gpudirect(root: str) -> GpuDirect:
    loaded = next((m for m in PEERMEM_MODULES if os.path.isdir(under(root, f"sys/module/{m}"))), "")
    version = read_text(under(root, "proc/driver/nvidia/version"), 4096)
    # The open modules' banner: "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05 ...".
    open_modules = ("Open Kernel Module" in version) if isinstance(version, str) else None
    return GpuDirect(peermem=loaded, open_modules=open_modules)


def read_netifs(root: str) -> dict[str, str] | Unavailable:
    base = under(root, NET_CLASS)
    names = list_dir(base)
    if isinstance(names, Unavailable):
        return names
    return {n[:32]: _text(os.path.join(base, n, "operstate"), 32) or "unknown" for n in names[:256]}


def counters_of(snap: RdmaSnapshot) -> dict[str, dict[str, int]]:
    """This run's port counters, as the state file keeps them (namespace ``rdma``: ``<device>:<port>.<name>``)."""
    if not isinstance(snap.devices, tuple):
        return {}
    return {
        "rdma": {
            f"{p.device}:{p.port}.{k}": v
            for d in snap.devices
            for p in d.ports
            for k, v in p.counters.items()
        }
    }


def read_topology(
    root: str, devices: tuple[RdmaDevice, ...] | Unavailable
) -> tuple[tuple[PciPath, ...], tuple[PciPath, ...]]:
    """The PCI paths of the GPUs and of the RDMA devices' functions (none without an RDMA device)."""
    if not isinstance(devices, tuple) or not devices:
        return (), ()
    nics = []
    for d in devices:
        path = read_path(root, d.pci, "NIC") if d.pci else None
        if path is not None:
            nics.append(path)
    return read_gpu_paths(root), tuple(nics)


def gather_rdma(
    root: str = HOST_ROOT,
    state: CounterState | None = None,
    nccl: NcclConfig | None = None,
    now: float = 0.0,
) -> RdmaSnapshot:
    """Read everything, judge nothing. ``state``: the counters of the last run, loaded once by the caller (who also
    saves this run's, :func:`counters_of`, once with every other namespace); ``nccl``: NCCL's configuration
    (hostcheck.gather.nccl_conf.read_nccl_config, read by the caller under the same root)."""
    devices, unread = read_devices_noted(root)
    gpus, nics = read_topology(root, devices)
    bridges = sorted({b for p in (*gpus, *nics) for b in p.bridges})
    return RdmaSnapshot(
        root=root,
        devices=devices,
        gpus=gpus,
        nics=nics,
        acs={b: read_acs(root, b) for b in bridges[:256]},
        gpudirect=read_gpudirect(root),
        netifs=read_netifs(root),
        nccl=nccl or NcclConfig(),
        unread=unread,
        state=state or CounterState(),
        taken_at=now,
    )
