"""The RDMA ports' line rates and NUMA nodes, for the measured paths through the NICs (workload.E017, E018).

Read-only and bounded, through the one reader (gather.base.read_text), under the host root so tests and scenarios
can point it at a fixture tree: ``/sys/class/infiniband/<device>/ports/<n>/{rate,state,link_layer}`` and ``<device>/device/numa_node`` (the kernel's
sysfs ABI, Documentation/ABI/stable/sysfs-class-infiniband: ``rate`` reads like "400 Gb/sec (4X NDR)", ``state``
like "4: ACTIVE"). Gathering is separate from parsing: :func:`parse_rate` and :func:`parse_state` are pure.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from hostcheck.gather.base import NOT_FOUND, Unavailable, read_text

SYSFS = "sys/class/infiniband"
#: Devices and ports read at most (a hostile or broken tree cannot make the walk unbounded).
MAX_DEVICES, MAX_PORTS = 64, 8


@dataclass(frozen=True)
class RdmaPort:
    device: str
    port: int
    #: Line rate in Gb/s, or None when the file is missing or unreadable.
    rate_gbps: float | None
    #: "ACTIVE", "DOWN", ... (the word after the number), or None.
    state: str | None
    #: "InfiniBand" or "Ethernet" (RoCE), or None.
    link_layer: str | None
    #: The NUMA node of the device's PCI function (``<device>/device/numa_node``; -1: none), or None.
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


def parse_rate(text: str) -> float | None:
    """'400 Gb/sec (4X NDR)' -> 400.0; anything else -> None."""
    m = re.match(r"\s*(\d{1,6}(?:\.\d{1,3})?)\s*Gb/sec", text or "")
    return float(m.group(1)) if m else None


def parse_state(text: str) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE'; anything else -> None."""
    m = re.match(r"\s*\d{1,2}:\s*([A-Z_]{1,20})\s*$", text or "")
    return m.group(1) if m else None


def _text(path: str) -> str | None:
    got = read_text(path, limit=256)
    return None if isinstance(got, Unavailable) else got.strip()


def _names(folder: str, limit: int) -> list[str] | None:
    try:
        return sorted(os.listdir(folder))[:limit]
    except OSError:
        return None


def gather_rdma_ports(host_root: str = "/") -> tuple[RdmaPort, ...] | Unavailable:
    """Every RDMA port under ``host_root``; Unavailable(NOT_FOUND) when the node has no RDMA device."""
    base = os.path.join(host_root, SYSFS)
    devices = _names(base, MAX_DEVICES)
    if not devices:
        return Unavailable(NOT_FOUND, f"no RDMA device under /{SYSFS}")
    out = []
    for dev in devices:
        numa = _text(os.path.join(base, dev, "device", "numa_node"))
        numa_node = int(numa) if numa is not None and re.fullmatch(r"-?\d{1,4}", numa) else None
        ports_dir = os.path.join(base, dev, "ports")
        for name in _names(ports_dir, MAX_PORTS) or []:
            if not name.isdigit():
                continue
            p = os.path.join(ports_dir, name)
            rate = _text(os.path.join(p, "rate"))
            state = _text(os.path.join(p, "state"))
            out.append(
                RdmaPort(
                    dev,
                    int(name),
                    parse_rate(rate) if rate is not None else None,
                    parse_state(state) if state is not None else None,
                    _text(os.path.join(p, "link_layer")),
                    numa_node,
                )
            )
    return tuple(out) if out else Unavailable(NOT_FOUND, f"no RDMA port under /{SYSFS}")
