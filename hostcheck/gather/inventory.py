"""What a node has: CPU, memory, NVMe drives, network ports and their rates, GPUs with their PCIe links and VBIOS,
NUMA layout. ``hostcheck baseline`` records it on a known-good node; the baseline checks compare a node with it.

Every file is read under one root (``Options.host_root``, "/" on a node; a fixture tree in tests) through the one
bounded reader. The GPUs' names and VBIOS come from the NVML snapshot (hostcheck.gather.nvml); their links, as every
other figure here, from sysfs. Parsing is separate from reading: the ``parse_*`` functions are pure.

Sources (kernel documentation): /proc/cpuinfo and /proc/meminfo, Documentation/filesystems/proc.rst; NUMA nodes'
``cpulist``, Documentation/ABI/stable/sysfs-devices-node; NVMe controllers' ``model`` and their namespaces' ``size``
(512-byte sectors, as every block device's), Documentation/ABI/stable/sysfs-block; network ports' ``speed`` (Mb/s,
-1 or unreadable when the link is down) and ``type`` (32: IPoIB), Documentation/ABI/testing/sysfs-class-net;
RDMA ports' ``rate`` ("400 Gb/sec (4X NDR)"), Documentation/ABI/stable/sysfs-class-infiniband; PCIe
``current_link_speed|width`` and ``max_link_speed|width``, Documentation/ABI/testing/sysfs-bus-pci.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from hostcheck.gather.base import ERROR, NOT_FOUND, Unavailable, guarded, list_dir, parse_int, read_text
from hostcheck.gather.hardware import PCI_DEVICES, pci_kind, under
from hostcheck.gather.rdma import MAX_LISTED, RdmaSnapshot, read_devices_noted, read_topology
from hostcheck.gather.rdma_topology import distance, nic_gpus

#: Entries read at most per folder: a node has tens of devices, not thousands. A folder with more is not read
#: (a list cut short would record, or compare, a node that lost what was cut): that part says how many there were.
MAX_ENTRIES = 4096
#: ARPHRD_INFINIBAND (include/uapi/linux/if_arp.h): an IPoIB interface, counted as its RDMA port instead.
ARPHRD_INFINIBAND = "32"
#: A part not gathered (the defaults of NodeInventory).
NOT_READ = Unavailable(NOT_FOUND, "not read")


@dataclass(frozen=True)
class CpuInfo:
    model: str
    sockets: int
    cores: int
    threads: int


@dataclass(frozen=True)
class NvmeDrive:
    name: str  # nvme0
    model: str
    size_bytes: int


@dataclass(frozen=True)
class Port:
    """A network port (``eth0``, speed in Mb/s) or an RDMA port (``mlx5_0:1``, rate in Gb/s); None: down or
    unknown. An RDMA port also has its link layer, and the GPU its NIC serves by PCIe topology with NCCL's word
    for the distance between them ("" where it serves none)."""

    name: str
    rate: float | None
    link_layer: str = ""
    gpu: str = ""
    distance: str = ""


@dataclass(frozen=True)
class PciLink:
    address: str  # 0000:18:00.0
    kind: str  # "GPU" or "NIC" (hostcheck.gather.hardware.pci_kind)
    speed_gts: float | None
    width: int | None
    max_speed_gts: float | None
    max_width: int | None


@dataclass(frozen=True)
class GpuId:
    address: str
    name: str
    vbios: str


@dataclass(frozen=True)
class NodeInventory:
    root: str = "/"
    cpu: CpuInfo | Unavailable = NOT_READ
    memory_bytes: int | Unavailable = NOT_READ
    #: Each NUMA node's CPU list, as the kernel prints it ("0-55,112-167"), by node number.
    numa_cpus: tuple[str, ...] | Unavailable = NOT_READ
    nvme: tuple[NvmeDrive, ...] | Unavailable = NOT_READ
    nics: tuple[Port, ...] | Unavailable = NOT_READ
    rdma: tuple[Port, ...] | Unavailable = NOT_READ
    links: tuple[PciLink, ...] | Unavailable = NOT_READ
    gpus: tuple[GpuId, ...] | Unavailable = NOT_READ


def _text(path: str, limit: int = 256) -> str | None:
    t = read_text(path, limit)
    return t.strip() if isinstance(t, str) else None


def _listed(folder: str) -> list[str] | Unavailable:
    """The names in ``folder``, or why not: more than MAX_ENTRIES of them is not a node's folder."""
    names = list_dir(folder, MAX_LISTED)
    if isinstance(names, list) and len(names) > MAX_ENTRIES:
        more = "or more " if len(names) >= MAX_LISTED else ""
        return Unavailable(
            ERROR, f"{folder} has {len(names)} {more}entries, more than the {MAX_ENTRIES} read: not read"
        )
    return names


def _int(text: str | None) -> int | None:
    return parse_int(text, signed=True)


# --- CPU, memory, NUMA ------------------------------------------------------------------------------------


def parse_cpuinfo(text: str) -> CpuInfo | None:
    """Model, sockets, cores and threads from /proc/cpuinfo, counted as LBNL NHC's check_hw_cpuinfo counts them:
    sockets are distinct ``physical id``s, cores distinct (physical id, core id) pairs, threads ``processor``
    entries. Without topology fields (some VMs, other architectures) each processor is its own socket and core."""
    threads, model = 0, ""
    sockets: set[str] = set()
    cores: set[tuple[str, str]] = set()
    phys = ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "processor":
            threads += 1
            phys = ""
        elif key == "model name" and not model:
            model = value[:200]
        elif key == "physical id":
            phys = value
            sockets.add(value)
        elif key == "core id":
            cores.add((phys, value))
    if not threads:
        return None
    if not sockets:
        return CpuInfo(model, threads, threads, threads)
    return CpuInfo(model, len(sockets), len(cores) or threads, threads)


def parse_meminfo(text: str) -> int | None:
    m = re.search(r"^MemTotal:\s+([0-9]{1,15}) kB\s*$", text, re.MULTILINE)
    return int(m.group(1)) * 1024 if m else None


def read_cpu(root: str) -> CpuInfo | Unavailable:
    text = read_text(under(root, "proc/cpuinfo"), 1 << 22)
    if isinstance(text, Unavailable):
        return text
    return parse_cpuinfo(text) or Unavailable(NOT_FOUND, "no processor in /proc/cpuinfo")


def read_memory(root: str) -> int | Unavailable:
    text = read_text(under(root, "proc/meminfo"), 1 << 16)
    if isinstance(text, Unavailable):
        return text
    return parse_meminfo(text) or Unavailable(NOT_FOUND, "no MemTotal in /proc/meminfo")


def read_numa(root: str) -> tuple[str, ...] | Unavailable:
    base = under(root, "sys/devices/system/node")
    names = _listed(base)
    if isinstance(names, Unavailable):
        return names
    nodes = sorted((int(n[4:]), n) for n in names if re.fullmatch(r"node[0-9]{1,4}", n))
    out = []
    for _number, n in nodes:
        cpus = _text(os.path.join(base, n, "cpulist"), 4096)
        if cpus is None or not re.fullmatch(r"[0-9,\-]*", cpus):
            return Unavailable(NOT_FOUND, f"{n}/cpulist unreadable")
        out.append(cpus)
    return tuple(out)


# --- NVMe, network and RDMA ports -------------------------------------------------------------------------


def read_nvme(root: str) -> tuple[NvmeDrive, ...] | Unavailable:
    base = under(root, "sys/class/nvme")
    names = _listed(base)
    if isinstance(names, Unavailable):
        # No NVMe driver loaded, or a node without NVMe: none.
        return () if names.kind == NOT_FOUND else names
    out = []
    for name in names:
        if not re.fullmatch(r"nvme[0-9]{1,4}", name):
            continue
        d = os.path.join(base, name)
        model = _text(os.path.join(d, "model")) or ""
        sectors = 0
        entries = _listed(d)
        for ns in entries if isinstance(entries, list) else []:
            # A namespace: nvme0n1, or nvme0c0n1 under native multipath.
            if re.fullmatch(rf"{name}(?:c[0-9]{{1,4}})?n[0-9]{{1,4}}", ns):
                sectors += max(0, _int(_text(os.path.join(d, ns, "size"))) or 0)
        out.append(NvmeDrive(name, model, sectors * 512))
    return tuple(out)


def read_nics(root: str) -> tuple[Port, ...] | Unavailable:
    """Physical network ports (those with a ``device``: not lo, bridges, bonds or veths) and their speed in Mb/s.
    IPoIB interfaces are left out: their port is counted under RDMA. (The fabric gatherer reads more of each
    port; this small reader can move there.)"""
    base = under(root, "sys/class/net")
    names = _listed(base)
    if isinstance(names, Unavailable):
        return names
    out = []
    for name in names:
        d = os.path.join(base, name)
        if not os.path.exists(os.path.join(d, "device")):
            continue
        if _text(os.path.join(d, "type")) == ARPHRD_INFINIBAND:
            continue
        speed = _int(_text(os.path.join(d, "speed")))
        out.append(Port(name, float(speed) if speed is not None and speed > 0 else None))
    return tuple(out)


def read_rdma(root: str) -> tuple[Port, ...] | Unavailable:
    """Every RDMA port (``<device>:<port>``) and its rate in Gb/s (None unless ACTIVE), as NHC's check_hw_ib reads
    them, through the fabric gatherer's reader of /sys/class/infiniband; with its link layer and the GPU its NIC
    serves (hostcheck.gather.rdma.nic_gpus, the fabric checks' pairing) and their distance."""
    devices, unread = read_devices_noted(root)
    if isinstance(devices, Unavailable):
        return () if devices.kind == NOT_FOUND else devices  # no RDMA driver: no ports
    if unread:  # a list of ports with some left out would be recorded, or compared, as the node's
        return Unavailable(ERROR, "; ".join(unread))
    gpus, nics = read_topology(root, devices)
    snap = RdmaSnapshot(root=root, devices=devices, gpus=gpus, nics=nics)
    served = nic_gpus(snap)
    paths = {p.address: p for p in (*gpus, *nics)}
    level: dict[str, str] = {}
    for d in devices:
        g, n = paths.get(served.get(d.name, "")), paths.get(d.pci or "")
        if g is not None and n is not None:
            level[d.name] = distance(g, n)[0]
    # A port that is not ACTIVE ("1: DOWN", "2: INIT") carries no traffic whatever its rate says.
    return tuple(
        Port(
            f"{d.name}:{p.port}",
            p.rate_gbps if p.state in ("", "ACTIVE") else None,
            p.link_layer,
            served.get(d.name, ""),
            level.get(d.name, ""),
        )
        for d in devices
        for p in d.ports
    )


# --- PCIe links and GPUs ----------------------------------------------------------------------------------


def parse_link_speed(text: str | None) -> float | None:
    """``32.0 GT/s PCIe`` (or ``32 GT/s``) -> 32.0; "Unknown" -> None."""
    m = re.match(r"\s*([0-9]{1,3}(?:\.[0-9]{1,2})?) GT/s", text or "")
    return float(m.group(1)) if m else None


def read_links(root: str) -> tuple[PciLink, ...] | Unavailable:
    """The PCIe link of every GPU and NIC function (the devices system.E009 reads AER counters of)."""
    base = under(root, PCI_DEVICES)
    names = _listed(base)
    if isinstance(names, Unavailable):
        return names
    out = []
    for addr in names:
        d = os.path.join(base, addr)
        kind = pci_kind(d)
        if kind is None:
            continue

        def width(f: str, d: str = d) -> int | None:
            w = _int(_text(os.path.join(d, f)))
            return w if w is not None and w > 0 else None

        out.append(
            PciLink(
                addr,
                kind,
                parse_link_speed(_text(os.path.join(d, "current_link_speed"))),
                width("current_link_width"),
                parse_link_speed(_text(os.path.join(d, "max_link_speed"))),
                width("max_link_width"),
            )
        )
    return tuple(out)


def gpus_of(nvml: Any) -> tuple[GpuId, ...] | Unavailable:
    """Each GPU's PCI address, name and VBIOS from the NVML snapshot."""
    if nvml is None:
        return Unavailable(NOT_FOUND, "NVML not gathered")
    if not nvml.ok:
        return nvml.error
    out = []
    for g in nvml.gpus:
        if g.handle_error is not None or not isinstance(g.pci_bus_id, str):
            continue
        name = g.name if isinstance(g.name, str) else ""
        vbios = g.vbios if isinstance(g.vbios, str) else ""
        out.append(GpuId(g.pci_bus_id, name, vbios))
    return tuple(out)


def gather_inventory(root: str = "/", nvml: Any = None) -> NodeInventory:
    """Read everything, judge nothing (the baseline checks do). Each part on its own: one that cannot be read, or
    that raises on input no parser foresaw, is that part's Unavailable and the rest is still read."""
    return NodeInventory(
        root=root,
        cpu=guarded("the CPUs", lambda: read_cpu(root)),
        memory_bytes=guarded("the memory", lambda: read_memory(root)),
        numa_cpus=guarded("the NUMA nodes", lambda: read_numa(root)),
        nvme=guarded("the NVMe drives", lambda: read_nvme(root)),
        nics=guarded("the network ports", lambda: read_nics(root)),
        rdma=guarded("the RDMA ports", lambda: read_rdma(root)),
        links=guarded("the PCIe links", lambda: read_links(root)),
        gpus=guarded("the GPUs", lambda: gpus_of(nvml)),
    )
