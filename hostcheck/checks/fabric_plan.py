"""What each RDMA port of a node should be, and where that expectation comes from (pure; the fabric checks use it).

A port's role comes from the PCIe topology (hostcheck.gather.rdma.rails): a rail is a GPU's NIC, any other port is
front-end, storage or in-band. Its expectations come from, in this order, the node type's baseline (the [baseline]
section ``hostcheck baseline --write`` records: each port's rate, link layer, paired GPU and distance) and the
first [fabric] port class it matches (the flat keys are the rails' class), the class winning where both set a
figure. A port no expectation covers is compared with its peers (same link layer, board and role) and never fails
for its rate or link layer alone. Where the node's topology tells nothing (no GPU or NIC path readable) no port is
known to be a rail: a class meant for the rails then covers every port, and what it finds only warns.

Findings are grouped (one line per kind of finding, its ports listed), never one line per port of a large node, and
each check's ``brief`` names the device and the key number in a few words (a Slurm drain reason).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hostcheck.checks.gpu import _config
from hostcheck.config import OTHER, RAIL, Baseline, FabricSettings, PortClass
from hostcheck.gather.base import NOT_FOUND, Unavailable
from hostcheck.gather.rdma import RdmaPort, RdmaSnapshot
from hostcheck.gather.rdma_topology import (
    LEVELS,
    NEAR,
    PHB,
    PIX,
    PXB,
    SYS,
    Pairing,
    missing_rails,
    pair_gpus,
    rails,
)
from hostcheck.registry import Outcome, errored, failed, passed, skipped, warned

UP_STATE, UP_PHYS = "ACTIVE", "LinkUp"
#: NCCL's words for each distance (NCCL's environment variable documentation, NCCL_P2P_LEVEL).
MEANING = {
    PIX: "under one PCIe switch",
    PXB: "through several PCIe switches",
    PHB: "through the CPU's PCIe host bridge",
    SYS: "across the SMP interconnect between NUMA nodes (QPI/UPI)",
}
#: Names listed in one grouped line at most; the rest are counted.
LISTED = 6
MISSING_FIX = (
    "a device that vanished: see whether it is on the PCI bus ('lspci -d 15b3:'), whether mlx5_core bound it "
    "('dmesg | grep mlx5_core', 'ibv_devices') and its firmware ('mlxfwmanager --query'); reseat the card or "
    "its cable to the GPU tray, update the firmware or the driver, or have the card replaced"
)
PORT_FIX = (
    "check the cable, transceiver and switch port ('ibstat', 'ibv_devinfo -v'; for RoCE 'ip link' and the switch), "
    "reseat or replace the cable; a port that stays down needs the node drained"
)


def up(p: RdmaPort) -> bool:
    return p.state == UP_STATE and p.phys_state == UP_PHYS


def ports_of(r: RdmaSnapshot) -> list[RdmaPort]:
    return [p for d in r.devices for p in d.ports] if isinstance(r.devices, tuple) else []


def rdma_of(s: Any) -> RdmaSnapshot | Outcome:
    """The snapshot's RDMA part, or the skip or error that says why there is nothing to judge."""
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


def setup(s: Any) -> Fabric | Outcome:
    """The node's fabric with its roles and expectations, or the skip or error that says why there is none."""
    r = rdma_of(s)
    return r if isinstance(r, Outcome) else fabric(s, r)


def verdict(fails: list[str], warns: list[str], briefs: list[str], ok: str, hint: str, **kw: Any) -> Outcome:
    """Fail with every line where one fails, else warn, else pass; the first finding's brief stands for it."""
    if fails:
        return failed("; ".join(fails + warns), brief=briefs[0], hint=hint, **kw)
    if warns:
        return warned("; ".join(warns), brief=briefs[0], hint=hint, **kw)
    return passed(ok, **kw)


def group(findings: Iterable[tuple[str, str]], listed: int = LISTED) -> list[str]:
    """(what, port) pairs as one line per ``what``: "mlx5_0 port 1, mlx5_1 port 1 (+6 more): state DOWN"."""
    by: dict[str, list[str]] = {}
    for what, port in findings:
        by.setdefault(what, []).append(port)
    out = []
    for what, names in by.items():
        shown = ", ".join(names[:listed]) + (f" (+{len(names) - listed} more)" if len(names) > listed else "")
        out.append(f"{shown}: {what}" if shown else what)
    return out


def gpu_names(s: Any, r: RdmaSnapshot) -> dict[str, str]:
    """PCI address -> "GPU <index>": NVML's index where NVML answered for every GPU on the PCI bus, else the GPU's
    place in PCI address order (nvidia-smi's order)."""
    out: dict[str, str] = {}
    for g in getattr(getattr(s, "nvml", None), "gpus", None) or ():
        bus = g.pci_bus_id if isinstance(g.pci_bus_id, str) else ""
        dom, _colon, rest = bus.lower().partition(":")
        if rest and dom and all(c in "0123456789abcdef" for c in dom) and len(dom) <= 8:
            out[f"{int(dom, 16):04x}:{rest}"] = f"GPU {g.index}"
    if not out or any(g.address not in out for g in r.gpus):
        out = {g.address: f"GPU {i}" for i, g in enumerate(sorted(r.gpus, key=lambda g: g.address))}
    return out


@dataclass(frozen=True)
class Want:
    """What one port should be, and whence."""

    up: bool = False
    rate_gbps: float | None = None
    link_layer: str | None = None
    #: The baseline's paired GPU and NCCL distance for this port's device ("" where it records none).
    gpu: str = ""
    distance: str = ""
    #: Where the figures come from: "the baseline", "[fabric] class 'rails'", both joined.
    source: str = ""
    #: True where the figures apply only because the topology could not tell a rail (then they only warn).
    unsure: bool = False


@dataclass(frozen=True)
class Fabric:
    """A node's RDMA ports with their roles and expectations, for one check's judging."""

    r: RdmaSnapshot
    settings: FabricSettings
    baseline: Baseline | None
    pairs: tuple[Pairing, ...]
    #: Rail devices; None where the topology tells nothing.
    rail_set: frozenset[str] | None
    names: dict[str, str]
    want: dict[tuple[str, int], Want] = field(default_factory=dict)
    klass: dict[tuple[str, int], PortClass] = field(default_factory=dict)

    @property
    def ports(self) -> list[RdmaPort]:
        return ports_of(self.r)

    def role(self, device: str) -> str | None:
        return None if self.rail_set is None else (RAIL if device in self.rail_set else OTHER)

    def gpu(self, address: str) -> str:
        name = self.names.get(address)
        return f"{name} ({address})" if name else f"GPU {address}"

    def gpu_short(self, address: str) -> str:
        return self.names.get(address) or f"GPU {address}"

    def rail_of(self, device: str) -> str:
        """ " (rail of GPU 3)" for a GPU's own NIC, else ""."""
        for p in self.pairs:
            if p.nic == device and not p.shared:
                return f" (rail of {self.gpu_short(p.gpu)})"
        return ""

    def baseline_rows(self) -> dict[str, tuple[str, float, str, str, str]]:
        return {row[0]: row for row in (self.baseline.rdma or ())} if self.baseline else {}


def fabric(s: Any, r: RdmaSnapshot) -> Fabric:
    cfg = _config(s)
    pairs = pair_gpus(r)
    rail_set = rails(r, pairs)
    f = Fabric(r, cfg.fabric, cfg.baseline, pairs, rail_set, gpu_names(s, r))
    rows = f.baseline_rows()
    classes = cfg.fabric.classes()
    for p in f.ports:
        key = (p.device, p.port)
        row = rows.get(f"{p.device}:{p.port}")
        role = f.role(p.device)
        k = next((c for c in classes if c.matches(p.device, role)), None)
        if row is None and k is None:
            continue
        rate = layer = None
        sources = []
        gpu = distance = ""
        if row is not None:
            _name, b_rate, b_layer, gpu, distance = row
            rate, layer = (b_rate or None), (b_layer or None)
            sources.append("the baseline")
        if k is not None:
            f.klass[key] = k
            rate = k.rate_gbps if k.rate_gbps is not None else rate
            layer = k.link_layer if k.link_layer is not None else layer
            sources.append(f"[fabric] class '{k.name}'")
        unsure = row is None and k is not None and k.role == RAIL and role is None
        # A port the baseline recorded down (rate 0) may stay down; a class covers ports that must be up.
        must_be_up = (row is not None and bool(row[1])) or k is not None
        f.want[key] = Want(must_be_up, rate, layer, gpu, distance, " and ".join(sources), unsure)
    return f


def missing_rail_lines(f: Fabric) -> list[tuple[str, Pairing]]:
    """Each GPU whose rail is missing, as "GPU 3 (0000:5d:00.0) has no NIC of its own within PXB"."""
    out = []
    for p in missing_rails(f.pairs):
        near = f"its nearest, {p.nic}, is {p.level} and serves another GPU" if p.nic else "no NIC at all"
        out.append((f"{f.gpu(p.gpu)} has no NIC of its own within PXB ({near})", p))
    return out


def distance_words(f: Fabric, p: Pairing) -> str:
    """ "GPU 3 (0000:5d:00.0) and mlx5_3 (0000:5f:00.0): SYS, across the SMP interconnect ... (NUMA node 0, 1)"."""
    numa = {g.address: g.numa_node for g in (*f.r.gpus, *f.r.nics)}
    where = ""
    if p.level == SYS:
        where = f" (the GPU on NUMA node {numa.get(p.gpu)}, the NIC on {numa.get(p.nic_address)})"
    return f"{f.gpu(p.gpu)} and {p.nic} ({p.nic_address}): {p.level}, {MEANING.get(p.level, '?')}{where}"


def within(level: str, limit: str) -> bool:
    return LEVELS.index(level) <= LEVELS.index(limit)


__all__ = [
    "MISSING_FIX",
    "NEAR",
    "PIX",
    "PORT_FIX",
    "PXB",
    "Fabric",
    "Want",
    "distance_words",
    "fabric",
    "group",
    "missing_rail_lines",
    "ports_of",
    "rdma_of",
    "setup",
    "up",
    "verdict",
    "within",
]
