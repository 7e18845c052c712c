"""The [baseline] section from a node's inventory: plain values (str, int, float, lists of them and of small tables)
in the order ``hostcheck.config.Baseline`` reads them, and what could not be recorded, with why."""

from __future__ import annotations

from typing import Any

from hostcheck.config import LINK_LAYERS, ConfigError, parse
from hostcheck.gather.base import Unavailable
from hostcheck.gather.inventory import NodeInventory


def _rate(v: float | None) -> int | float:
    """A rate as TOML will hold it: whole numbers as integers; 0 where the port was down (only presence compared)."""
    if v is None:
        return 0
    return int(v) if float(v).is_integer() else float(v)


def section(inv: NodeInventory, host: str = "", when: str = "") -> tuple[dict[str, Any], list[str]]:
    """(the section as a dict, lines naming what was left out and why)."""
    out: dict[str, Any] = {}
    left_out: list[str] = []
    if host:
        out["recorded_on"] = host
    if when:
        out["recorded_at"] = when

    def missing(what: str, u: Unavailable) -> None:
        left_out.append(f"{what}: not recorded ({u.reason})")

    if isinstance(inv.cpu, Unavailable):
        missing("CPU", inv.cpu)
    else:
        if inv.cpu.model:
            out["cpu_model"] = inv.cpu.model
        out["cpu_sockets"], out["cpu_cores"] = inv.cpu.sockets, inv.cpu.cores
        out["cpu_threads"] = inv.cpu.threads
    if isinstance(inv.memory_bytes, Unavailable):
        missing("memory", inv.memory_bytes)
    else:
        out["memory_bytes"] = inv.memory_bytes
    if isinstance(inv.numa_cpus, Unavailable):
        missing("NUMA layout", inv.numa_cpus)
    else:
        out["numa_cpus"] = list(inv.numa_cpus)
    if isinstance(inv.nvme, Unavailable):
        missing("NVMe drives", inv.nvme)
    else:
        out["nvme"] = [{"model": d.model, "size_bytes": d.size_bytes} for d in inv.nvme]
    for key, unit, ports in (("nics", "speed_mbps", inv.nics), ("rdma", "rate_gbps", inv.rdma)):
        if isinstance(ports, Unavailable):
            missing(f"{key} ports", ports)
            continue
        out[key] = [{"name": p.name, unit: _rate(p.rate)} for p in ports]
        if (
            key == "rdma"
        ):  # the fabric checks' expectations per port: its link layer, its GPU and their distance
            for row, p in zip(out[key], ports):
                row.update(link_layer=p.link_layer if p.link_layer in LINK_LAYERS else "")
                row.update(gpu=p.gpu, distance=p.distance)
        left_out += [
            f"{p.name}: no rate (down, or virtual), recorded without one" for p in ports if p.rate is None
        ]
    if isinstance(inv.gpus, Unavailable):
        missing("GPUs", inv.gpus)
    else:
        out["gpus"] = [{"address": g.address, "name": g.name, "vbios": g.vbios} for g in inv.gpus]
    if isinstance(inv.links, Unavailable):
        missing("PCIe links", inv.links)
    else:
        out["pcie"] = [
            {
                "address": link.address,
                "kind": link.kind,
                "speed_gts": float(link.speed_gts or 0),
                "width": link.width or 0,
                "max_speed_gts": float(link.max_speed_gts or 0),
                "max_width": link.max_width or 0,
            }
            for link in inv.links
        ]
    # An empty list is "none recorded", which compares nothing: leave it out and say so.
    for key in ("nvme", "nics", "rdma", "gpus", "pcie"):
        if key in out and not out[key]:
            del out[key]
            left_out.append(f"{key}: none found, not recorded")
    # What the configuration reader would refuse (a list longer than it holds, a model name with a NUL in it) would
    # make the whole file one hostcheck refuses: that key is left out, said, and the rest kept. The reader's own
    # rules decide (hostcheck.config), key by key.
    for key in list(out):
        try:
            parse({"baseline": {key: out[key]}}, "the section")
        except ConfigError as exc:
            left_out.append(f"{key}: not recorded ({exc.key}: {exc.reason})")
            del out[key]
    return out, left_out
