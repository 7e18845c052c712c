"""The RDMA ports' line rates and NUMA nodes, for the measured paths through the NICs (workload.E017, E018).

A flat view of what the fabric gatherer reads (:func:`hostcheck.gather.rdma.read_devices`: the one reader of
``/sys/class/infiniband`` under the host root, bounded, through the one bounded file reader): one row per port with
its device's NUMA node, which is what the workload's NIC sections are judged and bound against, and the GPU its
NIC serves by PCIe topology (:func:`hostcheck.gather.rdma.nic_gpus`, never the order of the names: mlx5_10 sorts
before mlx5_2), as nvidia-smi and CUDA with CUDA_DEVICE_ORDER=PCI_BUS_ID number it (PCI address order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hostcheck.gather.base import NOT_FOUND, Unavailable
from hostcheck.gather.rdma import IB_CLASS, RdmaSnapshot, parse_enum, read_devices, read_topology
from hostcheck.gather.rdma_topology import nic_gpus


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
    #: The GPU the NIC serves by PCIe topology: its index in PCI address order and its PCI address; None when
    #: the NIC serves none or the topology could not be read.
    gpu: int | None = None
    gpu_pci: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "port": self.port,
            "rate_gbps": self.rate_gbps,
            "state": self.state,
            "link_layer": self.link_layer,
            "numa_node": self.numa_node,
            "gpu": self.gpu,
            "gpu_pci": self.gpu_pci,
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
    gpus, nics = read_topology(host_root, devices)
    served = nic_gpus(RdmaSnapshot(root=host_root, devices=devices, gpus=gpus, nics=nics))
    index = {g.address: i for i, g in enumerate(sorted(gpus, key=lambda g: g.address))}
    out = tuple(
        NicPort(
            d.name,
            p.port,
            p.rate_gbps,
            p.state or None,
            p.link_layer or None,
            d.numa_node,
            index.get(served.get(d.name, "")),
            served.get(d.name),
        )
        for d in devices
        for p in d.ports
    )
    return out if out else Unavailable(NOT_FOUND, f"no RDMA port under /{IB_CLASS}")
