"""The Report: results + verdict + what was found on the host, the one input of every renderer."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from hostcheck import SCHEMA_VERSION, __version__
from hostcheck.checks.workload.peers import peer_ratios
from hostcheck.gather.base import Unavailable
from hostcheck.gather.gpuinfo import BusId, normalise_bus_id
from hostcheck.gather.rdma import ERROR_COUNTERS, RdmaSnapshot
from hostcheck.gather.rdma_topology import nic_gpus
from hostcheck.gather.suite import finite_number
from hostcheck.gather.workload import WorkloadRun
from hostcheck.registry import Result
from hostcheck.score import Verdict


def _v(x: Any) -> Any:
    return None if isinstance(x, Unavailable) else x


@dataclass(frozen=True)
class GpuRecord:
    """One GPU, named the way dcgm-exporter names it, with what this run read or measured of it.

    Every figure is in base units (bytes, seconds, degrees Celsius, FLOP/s); a figure that could not be read
    is left out rather than given as null, so a reader never mistakes "unknown" for zero.
    """

    index: int
    uuid: str | None = None
    #: NVML's form, ``00000000:3B:00.0`` (dcgm-exporter's ``pci_bus_id`` label), not the sysfs form.
    pci_bus_id: str | None = None
    name: str | None = None
    #: NVML and kernel-log figures: temperature_celsius, memory_total_bytes, xid_events... (see gpu_records)
    quantities: dict[str, float] = field(default_factory=dict)
    #: Workload matmul throughput per dtype ("bf16", "fp16", "tf32", "fp32"), FLOP/s.
    matmul_flops_per_second: dict[str, float] = field(default_factory=dict)
    #: Workload copy bandwidth per kind ("h2d_pinned", "d2h_pageable", "device_copy"...), bytes/s.
    copy_bytes_per_second: dict[str, float] = field(default_factory=dict)
    #: Per NVLink, in link order: "link" and what NVML answered of up, speed_bytes_per_second, version and the
    #: error counters (replay_errors, recovery_errors, crc_flit_errors, crc_data_errors).
    nvlinks: tuple[dict[str, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "name": self.name,
            "quantities": dict(self.quantities),
            "matmul_flops_per_second": dict(self.matmul_flops_per_second),
            "copy_bytes_per_second": dict(self.copy_bytes_per_second),
            "nvlinks": [dict(lk) for lk in self.nvlinks],
        }


@dataclass(frozen=True)
class PortRecord:
    """One RDMA port, named as node_exporter's infiniband collector names it (device, port), with the GPU under
    the same PCIe switch where there is one (dcgm-exporter's gpu and UUID)."""

    device: str
    port: int
    link_layer: str = ""
    state: str = ""
    phys_state: str = ""
    rate_bits_per_second: float | None = None
    #: The error counters since they were last cleared (a counter not readable is absent).
    counters: dict[str, int] = field(default_factory=dict)
    gpu: int | None = None
    uuid: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "port": self.port,
            "link_layer": self.link_layer,
            "state": self.state,
            "phys_state": self.phys_state,
            "rate_bits_per_second": self.rate_bits_per_second,
            "counters": dict(self.counters),
            "gpu": self.gpu,
            "uuid": self.uuid,
        }


@dataclass(frozen=True)
class Report:
    results: tuple[Result, ...]
    verdict: Verdict
    host: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    time: str = ""
    duration_s: float = 0.0
    exit_code: int = 0
    #: Per-GPU figures (gpu_records); empty when NVML gave no GPU or the caller did not ask for them.
    gpus: tuple[GpuRecord, ...] = ()
    #: The profile that ran (hostcheck.profiles): a passive run judges less than a full one.
    profile: str = ""
    #: RDMA ports (port_records); empty without RDMA devices or when the fabric was not gathered.
    ports: tuple[PortRecord, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "hostcheck", "version": __version__},
            "host": self.host,
            "time": self.time,
            "duration_s": round(self.duration_s, 3),
            "versions": self.versions,
            "checks": [r.to_dict() for r in self.results],
            "score": self.verdict.to_dict(),
            "exit_code": self.exit_code,
            "gpus": [g.to_dict() for g in self.gpus],
            "profile": self.profile or None,
            "ports": [p.to_dict() for p in self.ports],
        }


def host_info(snap: Any) -> dict[str, Any]:
    s = snap.system
    host: dict[str, Any] = {}
    if s is not None:
        host = {
            "hostname": s.hostname,
            "os": s.os_pretty,
            "kernel": s.kernel,
            "arch": s.arch,
            "container": s.container,
            "logical_cpus": s.logical_cpus,
            "physical_cores": s.physical_cores,
            "numa_nodes": len(s.numa_nodes),
            "mem_total_bytes": s.mem_total_bytes,
            "nvswitches": len(s.fabric.nvswitches) if isinstance(s.fabric.nvswitches, tuple) else None,
        }
    n = snap.nvml
    if n is not None and n.ok:
        host["gpus"] = [
            {
                "index": g.index,
                "name": _v(g.name),
                "uuid": _v(g.uuid),
                "pci_bus_id": _v(g.pci_bus_id),
                "memory_total_bytes": _v(g.memory_total_bytes),
            }
            for g in n.gpus
        ]
    else:
        host["gpus"] = []
    return host


def versions(snap: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"hostcheck": __version__}
    s = snap.system
    if s is not None:
        out.update(os=s.os_pretty, kernel=s.kernel, hostcheck_python=s.hostcheck_python)
        out["libc"] = s.libc or None
        out["driver_kernel_module"] = _v(s.driver_version)
        out["fabricmanager"] = _v(s.fabric.fm_version)
    n = snap.nvml
    if n is not None:
        out["driver"] = _v(n.driver_version) if n.ok else None
        cuda = _v(n.cuda_driver_version) if n.ok else None
        out["driver_cuda"] = (
            f"{cuda // 1000}.{(cuda % 1000) // 10}" if isinstance(cuda, int) and cuda else None
        )
        out["nvml"] = _v(n.nvml_version) if n.ok else None
        out["nvml_source"] = n.source if n.ok else None
    t = snap.torch
    if t is not None:
        out["training_python"] = t.python
        out["training_python_version"] = t.data.get("python")
        ti = t.torch
        out["torch"] = ti.get("version")
        out["torch_cuda"] = ti.get("cuda")
        out["cudnn"] = ti.get("cudnn")
        out["nccl"] = ti.get("nccl")
    return out


def nvml_bus_id(bus_id: Any) -> str | None:
    """A PCI address in NVML's form, ``00000000:3B:00.0``, which dcgm-exporter uses (see BusId)."""
    if not isinstance(bus_id, str) or not bus_id:
        return None
    return normalise_bus_id(bus_id).nvml


def _item(v: Any, i: int) -> Any:
    return v[i] if isinstance(v, tuple) and len(v) > i else None


def _nvlink_quantities(g: Any) -> tuple[dict[str, float], ...]:
    """Each NVLink's figures, base units (NVML's MB/s are 10^6 bytes/s); a figure NVML did not give is absent."""
    if g.handle_error is not None or not isinstance(g.nvlinks, tuple):
        return ()
    out = []
    for lk in g.nvlinks:
        raw = {
            "up": lk.active,
            "speed_bytes_per_second": finite_number(lk.speed_mbps, bools=False, scale=1_000_000),
            "version": lk.version,
            **{f"{k}_errors": v for k, v in lk.counters().items()},
        }
        out.append(
            {
                "link": lk.link,
                **{k: v for k, v in ((k, finite_number(v)) for k, v in raw.items()) if v is not None},
            }
        )
    return tuple(out)


def _nvml_quantities(g: Any) -> dict[str, float]:
    if g.handle_error is not None:
        # No handle, so every other field is a default, not a reading: that it is lost is what is known.
        return {"lost": int(g.lost is not None)}
    rr = g.remapped_rows
    raw = {
        "temperature_celsius": g.temperature_c,
        "slowdown_temperature_celsius": g.slowdown_temperature_c,
        "memory_total_bytes": g.memory_total_bytes,
        "ecc_enabled": g.ecc_current,
        "ecc_uncorrectable_volatile_errors": g.ecc_uncorrected_volatile,
        "ecc_uncorrectable_aggregate_errors": g.ecc_uncorrected_aggregate,
        "retired_pages_double_bit": g.retired_pages_dbe,
        "retired_pages_single_bit": g.retired_pages_sbe,
        "retired_pages_pending": g.retired_pages_pending,
        "remapped_rows_correctable": _item(rr, 0),
        "remapped_rows_uncorrectable": _item(rr, 1),
        "row_remap_pending": _item(rr, 2),
        "row_remap_failed": _item(rr, 3),
        "pcie_link_gen_current": g.pcie_gen_current,
        "pcie_link_gen_max": g.pcie_gen_max,
        "pcie_link_width_current": g.pcie_width_current,
        "pcie_link_width_max": g.pcie_width_max,
        "nvlink_active_links": g.nvlink_active,
        "clock_event_reasons": g.clock_event_reasons,
        "persistence_mode_enabled": g.persistence_mode,
        "fabric_state": _item(g.fabric, 0),
        "compute_processes": len(g.processes) if isinstance(g.processes, tuple) else None,
        "pcie_replays": g.pcie_replays,
        "power_limit_watts": finite_number(g.power_limit_mw, bools=False, scale=0.001),
        "mig_mode_enabled": _item(g.mig_mode, 0),
        "lost": g.lost is not None,
    }
    out = {k: finite_number(v) for k, v in raw.items()}
    return {k: v for k, v in out.items() if v is not None}


def _workload_figures(
    run: WorkloadRun, nvml_by_bus: dict[str, int]
) -> dict[int, dict[str, dict[str, float]]]:
    """NVML index -> {"quantities" | "matmul" | "copy": {name: value in base units}} from the run's devices.

    A CUDA device is NVML's GPU at the same PCI address where the env probe read one (CUDA's order differs
    from NVML's under CUDA_DEVICE_ORDER=FASTEST_FIRST or CUDA_VISIBLE_DEVICES); else the same index."""
    out: dict[int, dict[str, dict[str, float]]] = {}
    for d in run.devices:
        bus = d.pci_bus_id.lower() if d.pci_bus_id else None
        i = nvml_by_bus.get(bus, d.index) if bus else d.index
        slot = out.setdefault(i, {"quantities": {}, "matmul": {}, "copy": {}})
        slot["matmul"].update(d.matmul_flops_per_second)
        slot["copy"].update(d.copy_bytes_per_second)
        slot["quantities"].update(d.quantities)
    return out


#: (part, figure, quantity): each GPU's figure over the median of its node's other GPUs (workload.E001-E008).
PEER_FIGURES = (
    ("matmul", "bf16", "matmul_bf16_peer_ratio"),
    ("copy", "device_copy", "device_copy_peer_ratio"),
    ("copy", "h2d_pinned", "h2d_pinned_peer_ratio"),
    ("copy", "d2h_pinned", "d2h_pinned_peer_ratio"),
)


def _peer_quantities(measured: dict[int, dict[str, dict[str, float]]]) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for part, key, name in PEER_FIGURES:
        values = {i: f[part][key] for i, f in measured.items() if key in f.get(part, {})}
        for i, r in peer_ratios(values).items():
            out.setdefault(i, {})[name] = round(r, 4)
    return out


def gpu_records(snap: Any) -> tuple[GpuRecord, ...]:
    """Per-GPU figures of a snapshot: NVML's, XID events by PCI address, and the workload's per-device
    measurements. Only a GPU NVML (or nvidia-smi) listed gets a record: without its UUID nothing can join."""
    n = snap.nvml
    if n is None or not n.ok:
        return ()
    sysm = snap.system
    xids = sysm.xid_events if sysm is not None and isinstance(sysm.xid_events, tuple) else None
    nvml_by_bus = {g.pci_bus_id.lower(): g.index for g in n.gpus if isinstance(g.pci_bus_id, str)}
    run = snap.workload
    measured = _workload_figures(run, nvml_by_bus) if isinstance(run, WorkloadRun) else {}
    peers = _peer_quantities(measured)
    out = []
    for g in sorted(n.gpus, key=lambda g: g.index):
        q = _nvml_quantities(g)
        bus = g.pci_bus_id if isinstance(g.pci_bus_id, BusId) else None
        if bus and xids is not None:
            # The kernel logs "PCI:0000:3b:00", without the function: the match gpu.E011 makes.
            q["xid_events"] = sum(1 for e in xids if e.pci == bus.kernel)
        w = measured.get(g.index, {})
        q.update(w.get("quantities", {}))
        q.update(peers.get(g.index, {}))
        out.append(
            GpuRecord(
                index=g.index,
                uuid=g.uuid if isinstance(g.uuid, str) else None,
                pci_bus_id=bus.nvml if bus else None,
                name=g.name if isinstance(g.name, str) else None,
                quantities=q,
                matmul_flops_per_second=w.get("matmul", {}),
                copy_bytes_per_second=w.get("copy", {}),
                nvlinks=_nvlink_quantities(g),
            )
        )
    return tuple(out)


def port_records(snap: Any) -> tuple[PortRecord, ...]:
    """Every RDMA port of a snapshot, with the NVML index and UUID of the GPU its NIC serves by PCIe topology (the
    GPU whose own NIC it is, within PXB: hostcheck.gather.rdma.nic_gpus)."""
    r = getattr(snap, "rdma", None)
    if not isinstance(r, RdmaSnapshot) or not isinstance(r.devices, tuple):
        return ()
    n = getattr(snap, "nvml", None)
    by_bus = {}
    for g in getattr(n, "gpus", None) or ():
        if isinstance(g.pci_bus_id, str):
            by_bus[nvml_bus_id(g.pci_bus_id)] = (g.index, g.uuid if isinstance(g.uuid, str) else None)
    paired: dict[str, tuple[int, str | None]] = {}
    for nic, gpu_address in nic_gpus(r, near_only=True).items():
        gpu = by_bus.get(nvml_bus_id(gpu_address))
        if gpu is not None:
            paired[nic] = gpu
    out = []
    for d in r.devices:
        for port in d.ports:
            gpu = paired.get(d.name)
            out.append(
                PortRecord(
                    device=d.name,
                    port=port.port,
                    link_layer=port.link_layer,
                    state=port.state,
                    phys_state=port.phys_state,
                    rate_bits_per_second=port.rate_gbps * 1e9 if port.rate_gbps is not None else None,
                    counters={k: port.counters[k] for k in ERROR_COUNTERS if k in port.counters},
                    gpu=gpu[0] if gpu else None,
                    uuid=gpu[1] if gpu else None,
                )
            )
    return tuple(out)


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
