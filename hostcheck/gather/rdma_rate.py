"""The RDMA ports' line rates and NUMA nodes, for the measured paths through the NICs (workload.E017, E018).

A flat view of what the fabric gatherer reads (:func:`hostcheck.gather.rdma.read_devices`: the one reader of
``/sys/class/infiniband`` under the host root, bounded, through the one bounded file reader): one row per port with
its device's NUMA node, which is what the workload's NIC sections are judged and bound against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hostcheck.gather.base import NOT_FOUND, Unavailable
from hostcheck.gather.rdma import IB_CLASS, parse_enum, read_devices


@dataclass(frozen=True)
class NicPort:
    device: str
    port: int
    #: Line rate in Gb/s, or None when the file is missing or unreadable.
    rate_gbps: float | None
    #: "ACTIVE", "DOWN", ... (the word after the number), or None.
    state: str | None
    #: "InfiniBand" or "Ethernet" (RoCE), or None.
    link_layer: str | None
    #: The NUMA node of the device's PCI function (``<device>/device/numa_node``), or None.
    numa_node: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "port": self.port,
            "rate_gbps": self.rate_gbps,
            "state": self.state,
            "link_layer": self.link_layer,
            "numa_node": self.numa_node,
        }


def parse_state(text: str) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE'; anything that is not the kernel's "<number>: <name>" -> None."""
    word = parse_enum(text or "")
    return word if word and word != (text or "").strip()[:40] else None


def gather_rdma_ports(host_root: str = "/") -> tuple[NicPort, ...] | Unavailable:
    """Every RDMA port under ``host_root``; Unavailable(NOT_FOUND) when the node has no RDMA device."""
    devices = read_devices(host_root)
    if isinstance(devices, Unavailable) or not devices:
        return Unavailable(NOT_FOUND, f"no RDMA device under /{IB_CLASS}")
    out = tuple(
        NicPort(d.name, p.port, p.rate_gbps, p.state or None, p.link_layer or None, d.numa_node)
        for d in devices
        for p in d.ports
    )
    return out if out else Unavailable(NOT_FOUND, f"no RDMA port under /{IB_CLASS}")
