"""The fabric's error counters at a job's start and end, and which links and ports moved in between.

``hostcheck job`` reads NVML's NVLink error counters (:meth:`hostcheck.gather.nvml.NvmlSampler.nvlink_counters`)
and the RDMA ports' counters under ``<host_root>/sys/class/infiniband`` when the job starts and when it ends; when
the job is communication-bound the verdict names the links and ports whose counters rose. The counter maps are
plain ``name -> count`` dictionaries, so a fuller port gatherer can hand its own maps to :func:`ports_moved`.
"""

from __future__ import annotations

from typing import Any

from hostcheck.gather.rdma import ERROR_COUNTERS, read_devices

#: Links and ports named one by one; the rest are counted.
NAMED = 8


def read_rdma_counters(root: str = "/") -> dict[str, int]:
    """``<device>/<port>/<counter> -> count`` of every RDMA port's error counters under ``root`` (the fabric
    gatherer's reader and counter list: GCM's twelve); {} without any."""
    devices = read_devices(root)
    if not isinstance(devices, tuple):
        return {}
    return {
        f"{d.name}/{p.port}/{name}": p.counters[name]
        for d in devices
        for p in d.ports
        for name in ERROR_COUNTERS
        if name in p.counters
    }


def moved(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The counters that rose between the two maps, with how much (a counter in only one map, or one that went
    down, a reset, is left out)."""
    return {
        k: after[k] - v
        for k, v in sorted(before.items())
        if isinstance(after.get(k), int) and isinstance(v, int) and after[k] > v
    }


def _named(rows: list[str]) -> list[str]:
    return rows[:NAMED] + ([f"and {len(rows) - NAMED} more"] if len(rows) > NAMED else [])


def links_moved(
    before: dict[str, int], after: dict[str, int], index: dict[str, int] | None = None
) -> list[str]:
    """NVLinks whose error counters rose (keys: hostcheck.gather.nvml.nvlink_key), one line per link:
    ``GPU 3 (GPU-...) link 7: +12 replay, +3 crc_flit``; ``index`` maps a UUID to its GPU index."""
    per: dict[tuple[str, int], list[str]] = {}
    for key, delta in moved(before, after).items():
        parts = key.rsplit(".", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        gpu, link, counter = parts
        per.setdefault((gpu, int(link)), []).append(f"+{delta} {counter}")
    rows = []
    for (gpu, link), parts in sorted(
        per.items(), key=lambda kv: ((index or {}).get(kv[0][0], 1 << 30), kv[0])
    ):
        i = (index or {}).get(gpu)
        who = f"GPU {i} ({gpu})" if i is not None else gpu
        rows.append(f"{who} link {link}: {', '.join(parts)}")
    return _named(rows)


def ports_moved(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """RDMA ports whose counters rose (keys ``<device>/<port>/<counter>``), one line per port:
    ``mlx5_0 port 1: +3 symbol_error``."""
    per: dict[tuple[str, str], list[str]] = {}
    for key, delta in moved(before, after).items():
        parts = key.split("/")
        if len(parts) != 3:
            continue
        per.setdefault((parts[0], parts[1]), []).append(f"+{delta} {parts[2]}")
    return _named([f"{dev} port {port}: {', '.join(p)}" for (dev, port), p in sorted(per.items())])


def fabric_moved(fabric: dict[str, Any], gpu_index: dict[str, int]) -> dict[str, Any]:
    """An observation's fabric counters (namespace -> (start, end)) as the links and ports that moved, for the
    analysis's ``comm``; None where a namespace was not read."""
    nvlink, rdma = fabric.get("nvlink"), fabric.get("rdma")
    return {
        "links_moved": links_moved(*nvlink, gpu_index) if nvlink else None,
        "ports_moved": ports_moved(*rdma) if rdma else None,
    }
