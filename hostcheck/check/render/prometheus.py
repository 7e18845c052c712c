"""--prometheus PATH: node_exporter textfile collector format (hostcheck.outfile writes it atomically).

The per-GPU series carry dcgm-exporter's labels (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``hostname``) so
that PromQL joins them with DCGM's series; every quantity has its base unit in its name and no series has a ``unit`` label.
The file is rewritten on every run, so the time of the last ready run is read back from the previous file
(:func:`read_last_success`) and carried over while the node is not ready.
"""

from __future__ import annotations

import contextlib
import math
import re
from datetime import datetime

from hostcheck import infile
from hostcheck.check.render import clean_text
from hostcheck.registry import Status
from hostcheck.report import GpuRecord, PortRecord, Report

#: hostcheck_check_status value per status
STATUS_CODE = {Status.PASS: 0, Status.WARN: 1, Status.FAIL: 2, Status.ERROR: 3, Status.SKIP: -1}

LAST_SUCCESS = "hostcheck_last_success_timestamp_seconds"
#: read_last_success reads no more of the old file than this: it is ours, and small.
READ_LIMIT = 1 << 20

#: A check's unit -> (metric name suffix, factor to the base unit). "" is the plain hostcheck_check_value:
#: counts (GPUs, events, pages, threads) have no unit to name. A unit not here also goes there.
UNITS: dict[str, tuple[str, float]] = {
    "TFLOP/s": ("flops_per_second", 1e12),
    "GFLOP/s": ("flops_per_second", 1e9),
    "GB/s": ("bytes_per_second", 1e9),
    "MB/s": ("bytes_per_second", 1e6),
    "Gb/s": ("bits_per_second", 1e9),
    "GiB/s": ("bytes_per_second", 2**30),
    "B": ("bytes", 1),
    "bytes": ("bytes", 1),
    "KiB": ("bytes", 2**10),
    "MiB": ("bytes", 2**20),
    "GiB": ("bytes", 2**30),
    "TiB": ("bytes", 2**40),
    "s": ("seconds", 1),
    "ms": ("seconds", 1e-3),
    "us": ("seconds", 1e-6),
    "%": ("ratio", 0.01),
    "x": ("ratio", 1),
    "C": ("celsius", 1),
    "°C": ("celsius", 1),
    "W": ("watts", 1),
    "img/s": ("images_per_second", 1),
    "seq/s": ("sequences_per_second", 1),
    "GPUs": ("", 1),
    "events": ("", 1),
    "pages": ("", 1),
    "threads/GPU": ("", 1),
}

#: The words for each suffix, in the HELP of hostcheck_check_value_<suffix>.
UNIT_WORDS = {
    "flops_per_second": "floating-point operations per second",
    "bytes_per_second": "bytes per second",
    "bits_per_second": "bits per second (a link's rate)",
    "bytes": "bytes",
    "seconds": "seconds",
    "ratio": "a ratio (1 is 100%, or a speedup of 1x)",
    "celsius": "degrees Celsius",
    "watts": "watts",
    "images_per_second": "images per second",
    "sequences_per_second": "sequences per second",
}

#: GpuRecord.quantities key -> (metric family, extra labels). A key not here becomes hostcheck_gpu_<key>.
GPU_QUANTITIES: dict[str, tuple[str, dict[str, str]]] = {
    "lost": ("hostcheck_gpu_lost", {}),
    "temperature_celsius": ("hostcheck_gpu_temperature_celsius", {}),
    "slowdown_temperature_celsius": ("hostcheck_gpu_slowdown_temperature_celsius", {}),
    "memory_total_bytes": ("hostcheck_gpu_memory_total_bytes", {}),
    "ecc_enabled": ("hostcheck_gpu_ecc_enabled", {}),
    "ecc_uncorrectable_volatile_errors": ("hostcheck_gpu_ecc_uncorrectable_errors", {"scope": "volatile"}),
    "ecc_uncorrectable_aggregate_errors": ("hostcheck_gpu_ecc_uncorrectable_errors", {"scope": "aggregate"}),
    "retired_pages_double_bit": ("hostcheck_gpu_retired_pages", {"cause": "double_bit_ecc"}),
    "retired_pages_single_bit": ("hostcheck_gpu_retired_pages", {"cause": "single_bit_ecc"}),
    "retired_pages_pending": ("hostcheck_gpu_retired_pages_pending", {}),
    "remapped_rows_correctable": ("hostcheck_gpu_remapped_rows", {"cause": "correctable"}),
    "remapped_rows_uncorrectable": ("hostcheck_gpu_remapped_rows", {"cause": "uncorrectable"}),
    "row_remap_pending": ("hostcheck_gpu_row_remap_pending", {}),
    "row_remap_failed": ("hostcheck_gpu_row_remap_failed", {}),
    "pcie_link_gen_current": ("hostcheck_gpu_pcie_link_generation", {"link": "current"}),
    "pcie_link_gen_max": ("hostcheck_gpu_pcie_link_generation", {"link": "max"}),
    "pcie_link_width_current": ("hostcheck_gpu_pcie_link_width_lanes", {"link": "current"}),
    "pcie_link_width_max": ("hostcheck_gpu_pcie_link_width_lanes", {"link": "max"}),
    "nvlink_active_links": ("hostcheck_gpu_nvlink_active_links", {}),
    "clock_event_reasons": ("hostcheck_gpu_clock_event_reasons", {}),
    "persistence_mode_enabled": ("hostcheck_gpu_persistence_mode_enabled", {}),
    "fabric_state": ("hostcheck_gpu_fabric_state", {}),
    "compute_processes": ("hostcheck_gpu_compute_processes", {}),
    "pcie_replays": ("hostcheck_gpu_pcie_replays", {}),
    "power_limit_watts": ("hostcheck_gpu_power_limit_watts", {}),
    "mig_mode_enabled": ("hostcheck_gpu_mig_mode_enabled", {}),
    "xid_events": ("hostcheck_gpu_xid_events", {}),
    "burn_median_flops_per_second": ("hostcheck_gpu_burn_flops_per_second", {"stat": "median"}),
    "burn_min_flops_per_second": ("hostcheck_gpu_burn_flops_per_second", {"stat": "min"}),
    "burn_result_mismatches": ("hostcheck_gpu_burn_result_mismatches", {}),
    "matmul_bf16_peer_ratio": ("hostcheck_gpu_peer_ratio", {"figure": "matmul_bf16"}),
    "device_copy_peer_ratio": ("hostcheck_gpu_peer_ratio", {"figure": "device_copy"}),
    "h2d_pinned_peer_ratio": ("hostcheck_gpu_peer_ratio", {"figure": "h2d_pinned"}),
    "d2h_pinned_peer_ratio": ("hostcheck_gpu_peer_ratio", {"figure": "d2h_pinned"}),
}

#: GpuRecord.nvlinks key -> (metric family, extra labels): per-link series, dcgm-exporter's GPU labels plus link.
NVLINK_QUANTITIES: dict[str, tuple[str, dict[str, str]]] = {
    "up": ("hostcheck_gpu_nvlink_up", {}),
    "speed_bytes_per_second": ("hostcheck_gpu_nvlink_speed_bytes_per_second", {}),
    "version": ("hostcheck_gpu_nvlink_version", {}),
    "replay_errors": ("hostcheck_gpu_nvlink_errors", {"counter": "replay"}),
    "recovery_errors": ("hostcheck_gpu_nvlink_errors", {"counter": "recovery"}),
    "crc_flit_errors": ("hostcheck_gpu_nvlink_errors", {"counter": "crc_flit"}),
    "crc_data_errors": ("hostcheck_gpu_nvlink_errors", {"counter": "crc_data"}),
}

HELP = {
    "hostcheck_check_info": "A check's title and category (value 1).",
    "hostcheck_check_status": "Check status: 0 pass, 1 warn, 2 fail, 3 error, -1 skip.",
    "hostcheck_check_value": "The measured value of a check that is a count, or in a unit with no base-unit metric.",
    "hostcheck_score": "Readiness score 0-100 (-1 when nothing could be judged).",
    "hostcheck_ready": "1 when the node is ready at the chosen fail level and minimum score.",
    "hostcheck_checks": "Number of checks per status.",
    "hostcheck_last_run_timestamp_seconds": "When hostcheck last ran (Unix time).",
    LAST_SUCCESS: "When hostcheck last found the node ready (Unix time); carried over while it is not.",
    "hostcheck_info": "Versions found on the node (value 1).",
    "hostcheck_gpu_info": "A GPU as dcgm-exporter labels it, with its model (value 1).",
    "hostcheck_gpu_lost": "1 when NVML said the GPU is lost (fell off the bus); nothing else of it is known.",
    "hostcheck_gpu_temperature_celsius": "GPU temperature (NVML, GPU sensor).",
    "hostcheck_gpu_slowdown_temperature_celsius": "Temperature at which the GPU slows its clocks.",
    "hostcheck_gpu_memory_total_bytes": "GPU memory size.",
    "hostcheck_gpu_ecc_enabled": "1 when ECC is on.",
    "hostcheck_gpu_ecc_uncorrectable_errors": "Uncorrectable ECC errors: since the driver loaded (volatile) "
    "or over the GPU's life (aggregate); a snapshot per run, and clearable, so a gauge.",
    "hostcheck_gpu_retired_pages": "Memory pages retired, by cause (GPUs before Ampere).",
    "hostcheck_gpu_retired_pages_pending": "1 when a page retirement waits for a GPU reset.",
    "hostcheck_gpu_remapped_rows": "Memory rows remapped, by cause (Ampere and later).",
    "hostcheck_gpu_row_remap_pending": "1 when a row remapping waits for a GPU reset.",
    "hostcheck_gpu_row_remap_failed": "1 when a row remapping failed (replace the GPU).",
    "hostcheck_gpu_pcie_link_generation": "PCIe link generation, current and maximum.",
    "hostcheck_gpu_pcie_link_width_lanes": "PCIe link width in lanes, current and maximum.",
    "hostcheck_gpu_nvlink_active_links": "Active NVLink links (0: none, PCIe only).",
    "hostcheck_gpu_nvlink_up": "1 when this NVLink is up (NVML link state; nvlink.E001).",
    "hostcheck_gpu_nvlink_speed_bytes_per_second": "This NVLink's speed (NVML_FI_DEV_NVLINK_GET_SPEED; nvlink.E002).",
    "hostcheck_gpu_nvlink_version": "This NVLink's NVML version enum (nvmlNvlinkVersion_t: 6 is NVLink 4.0).",
    "hostcheck_gpu_nvlink_errors": "NVLink error counter since the driver loaded, by counter: replay, recovery, "
    "crc_flit, crc_data (nvlink.E004 judges the rise per run; sum by UUID to join DCGM's *_ERROR_COUNT_TOTAL).",
    "hostcheck_gpu_clock_event_reasons": "NVML clock event (throttle) reasons bitmask (nvmlClocksEventReason*).",
    "hostcheck_gpu_persistence_mode_enabled": "1 when persistence mode is on.",
    "hostcheck_gpu_fabric_state": "NVML fabric state: 0 not supported, 1 not started, 2 in progress, 3 completed.",
    "hostcheck_gpu_compute_processes": "Compute processes on the GPU other than hostcheck.",
    "hostcheck_gpu_pcie_replays": "PCIe replays since the driver loaded (NVML; gpu.E015 judges the rise per run).",
    "hostcheck_gpu_power_limit_watts": "The GPU's power management limit.",
    "hostcheck_gpu_mig_mode_enabled": "1 when MIG mode is on (current mode).",
    "hostcheck_gpu_xid_events": "XID events of this GPU in the kernel log window hostcheck read.",
    "hostcheck_gpu_burn_flops_per_second": "Burn-in bf16 matmul throughput per window, median and minimum.",
    "hostcheck_gpu_burn_result_mismatches": "Burn-in windows whose repeated product changed (a hardware fault).",
    "hostcheck_fleet_peer_tolerance": "hostcheck fleet: fleet_peer_tolerance, the fraction below the fleet median "
    "that flags a node.",
    "hostcheck_fleet_peer_outliers": "hostcheck fleet: node figures more than the tolerance below their group's "
    "fleet median.",
    "hostcheck_fleet_peer_ratio": "hostcheck fleet: a flagged node's figure over the median of the other nodes "
    "with the same GPU model (and GPU count for all_reduce).",
    "hostcheck_gpu_peer_ratio": "A workload figure over the median of the node's other GPUs (1: like its peers; "
    "below 1 - gpu_peer_tolerance fails).",
    "hostcheck_gpu_matmul_flops_per_second": "Workload matmul throughput, by dtype.",
    "hostcheck_gpu_copy_bytes_per_second": "Workload copy bandwidth: host<->device pinned/pageable, device copy.",
    "hostcheck_rdma_port_info": "An RDMA port (/sys/class/infiniband), its link layer and state; gpu/UUID: the GPU "
    "under its NIC's PCIe switch.",
    "hostcheck_rdma_port_up": "1 when the RDMA port is ACTIVE and its physical state LinkUp.",
    "hostcheck_rdma_port_rate_bits_per_second": "The RDMA port's rate as the kernel reports it.",
    "hostcheck_rdma_port_error_counter": "An RDMA port error counter (GCM's twelve) since it was last cleared.",
}


class Families:
    """Samples grouped by metric family, in first-seen order: the text format wants a family's lines together.
    The one exposition writer: the node's textfile here, the fleet page's series (fleet/peers.py)."""

    def __init__(self) -> None:
        self.families: dict[str, list[str]] = {}

    def add(self, name: str, labels: dict[str, object], value: float | int) -> None:
        text = ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items())
        self.families.setdefault(name, []).append(
            f"{name}{{{text}}} {_num(value)}" if text else f"{name} {_num(value)}"
        )

    def render(self) -> str:
        lines = []
        for name, samples in self.families.items():
            lines += [f"# HELP {name} {_help(name)}", f"# TYPE {name} gauge", *samples]
        return "\n".join(lines) + "\n"


def render_prometheus(report: Report, last_success: float | None = None) -> str:
    """The textfile. ``last_success``: the previous file's hostcheck_last_success_timestamp_seconds, kept when
    this run is not ready (a ready run sets it to its own time)."""
    out = Families()
    for r in report.results:
        out.add("hostcheck_check_info", {"check": r.id, "category": r.category, "title": r.title}, 1)
    for r in report.results:
        out.add("hostcheck_check_status", {"check": r.id, "category": r.category}, STATUS_CODE[r.status])
    for r in report.results:
        if isinstance(r.value, (int, float)) and not isinstance(r.value, bool):
            name, factor = check_value_metric(r.unit)
            value = _scaled(r.value, factor)
            if value is not None:
                out.add(name, {"check": r.id}, value)
    v = report.verdict
    out.add("hostcheck_score", {}, v.score if v.score is not None else -1)
    out.add("hostcheck_ready", {"fail_level": v.fail_level}, int(v.ready))
    for status, n in v.counts.items():
        out.add("hostcheck_checks", {"status": status}, n)
    ran = _epoch(report.time)
    out.add("hostcheck_last_run_timestamp_seconds", {}, ran)
    success = (ran or None) if v.ready else last_success
    if success is not None:
        out.add(LAST_SUCCESS, {}, success)
    versions = {_label_name(k): val for k, val in sorted(report.versions.items()) if val is not None}
    out.add("hostcheck_info", {k: val for k, val in versions.items() if k}, 1)
    host = str(report.host.get("hostname") or "")
    for g in report.gpus:
        # modelName: dcgm-exporter's own spelling (promtool's lint asks for snake_case); kept so that
        # group_left(modelName) finds the same label on both sides of a join.
        out.add("hostcheck_gpu_info", _gpu_labels(g, host, modelName=g.name or ""), 1)
    for g in report.gpus:
        for key, value in g.quantities.items():
            name, extra = GPU_QUANTITIES.get(key, (f"hostcheck_gpu_{_label_name(key)}", {}))
            out.add(name, {**_gpu_labels(g, host), **extra}, value)
        for dtype, value in g.matmul_flops_per_second.items():
            out.add("hostcheck_gpu_matmul_flops_per_second", {**_gpu_labels(g, host), "dtype": dtype}, value)
        for kind, value in g.copy_bytes_per_second.items():
            out.add("hostcheck_gpu_copy_bytes_per_second", {**_gpu_labels(g, host), "copy": kind}, value)
        for lk in g.nvlinks:
            for key, value in lk.items():
                if key in NVLINK_QUANTITIES:
                    name, extra = NVLINK_QUANTITIES[key]
                    out.add(name, {**_gpu_labels(g, host), "link": str(lk["link"]), **extra}, value)
    for p in report.ports:
        labels = _port_labels(p, host)
        out.add("hostcheck_rdma_port_info", {**labels, "link_layer": p.link_layer, "state": p.state}, 1)
        out.add("hostcheck_rdma_port_up", labels, int(p.state == "ACTIVE" and p.phys_state == "LinkUp"))
        if p.rate_bits_per_second is not None:
            out.add("hostcheck_rdma_port_rate_bits_per_second", labels, p.rate_bits_per_second)
        for name, value in p.counters.items():
            out.add("hostcheck_rdma_port_error_counter", {**labels, "counter": name}, value)
    return out.render()


def _port_labels(p: PortRecord, host: str) -> dict[str, object]:
    """node_exporter's infiniband collector's labels (device, port), and dcgm-exporter's gpu and UUID of the GPU
    under the same PCIe switch, so a port's series join with that GPU's."""
    labels: dict[str, object] = {"device": p.device, "port": str(p.port)}
    if p.gpu is not None:
        labels["gpu"] = str(p.gpu)
        labels["UUID"] = p.uuid or ""
    if host:
        labels["hostname"] = host
    return labels


def check_value_metric(unit: str | None) -> tuple[str, float]:
    """(metric name, factor to its base unit) of a check value in ``unit``; unknown units are plain values."""
    suffix, factor = UNITS.get((unit or "").strip(), ("", 1))
    return (f"hostcheck_check_value_{suffix}" if suffix else "hostcheck_check_value"), factor


def read_last_success(path: str) -> float | None:
    """hostcheck_last_success_timestamp_seconds from the textfile at ``path``, or None: no file, not a regular
    file (a FIFO is never opened: a read would block or steal a reader's data), unreadable, or no valid value."""
    try:  # the one reader; the textfile folder is the collector's, so a link there is not followed
        data = infile.read_bytes(path, READ_LIMIT, follow=False, truncate=True)
    except infile.ReadError:
        return None
    for line in data.decode("utf-8", "replace").splitlines():
        m = re.fullmatch(rf"{LAST_SUCCESS}(?:\{{\}})?[ \t]+(\S+)(?:[ \t]+-?\d+)?[ \t]*", line)
        if m:
            with contextlib.suppress(ValueError):
                value = float(m.group(1))
                if math.isfinite(value) and value > 0:
                    return value
    return None


def _gpu_labels(g: GpuRecord, host: str, **extra: object) -> dict[str, object]:
    """dcgm-exporter's labels, names, forms and order (NVIDIA/dcgm-exporter, internal/pkg/rendermetrics/
    render_metrics.go; device is "nvidia<gpu>", internal/pkg/collector/gpu_collector.go): gpu is the index as
    text, pci_bus_id NVML's 00000000:3B:00.0, hostname the node's (left out when unknown, as there)."""
    labels: dict[str, object] = {
        "gpu": str(g.index),
        "UUID": g.uuid or "",
        "pci_bus_id": g.pci_bus_id or "",
        "device": f"nvidia{g.index}",
        **extra,
    }
    if host:
        labels["hostname"] = host
    return labels


def _help(name: str) -> str:
    if name in HELP:
        text = HELP[name]
    elif name.startswith("hostcheck_check_value_"):
        words = UNIT_WORDS.get(name[len("hostcheck_check_value_") :], name[len("hostcheck_check_value_") :])
        text = f"The measured value of a check, in {words} (converted from the check's unit)."
    else:
        text = f"hostcheck GPU figure {name[len('hostcheck_gpu_') :]}."
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _esc(v: object) -> str:
    # Text-format escapes, after clean_text (lone surrogates and control characters: as in the JUnit file).
    return clean_text(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _label_name(key: object) -> str:
    """A key as a label or metric name part ([a-zA-Z_][a-zA-Z0-9_]*; leading "_" dropped, "__" is reserved);
    "" when nothing is left."""
    name = re.sub(r"[^a-zA-Z0-9_]", "_", str(key)).lstrip("_")
    return "k_" + name if name[:1].isdigit() else name


def _scaled(v: float | int, factor: float) -> float | int | None:
    """``v`` in the base unit; an int stays exact (bytes). None for an int beyond any float: no honest sample."""
    try:
        float(v)
        return v if factor == 1 else v * factor
    except OverflowError:
        return None


def _num(v: float | int) -> str:
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _epoch(iso: str) -> int:
    try:
        return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())
    except (ValueError, OverflowError, OSError):  # not a time, or one the platform cannot convert
        return 0
