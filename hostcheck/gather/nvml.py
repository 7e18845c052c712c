"""Per-GPU health through NVML (module ``pynvml`` from nvidia-ml-py), every call's failure kept as a value.

``gather_nvml(nvml=...)`` takes the module as a parameter so tests pass a fake one.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from dataclasses import dataclass, fields
from typing import Any, Callable, Union

from hostcheck.gather.base import (
    ERROR,
    GPU_LOST,
    NO_PERMISSION,
    NOT_FOUND,
    NOT_INSTALLED,
    NOT_SUPPORTED,
    TIMEOUT,
    Unavailable,
    read_text,
)

# NVML return codes (nvml.h) -> (kind, words)
_NVML_ERRORS = {
    1: (ERROR, "NVML not initialised"),
    3: (NOT_SUPPORTED, "not supported on this GPU"),
    4: (NO_PERMISSION, "insufficient permissions (run as root)"),
    6: (NOT_FOUND, "not found"),
    9: (NOT_INSTALLED, "NVIDIA driver not loaded"),
    10: (TIMEOUT, "NVML timeout"),
    12: (NOT_INSTALLED, "NVML library libnvidia-ml.so.1 not found (no NVIDIA driver installed)"),
    13: (NOT_SUPPORTED, "function not in this driver's NVML"),
    14: (ERROR, "corrupted infoROM"),
    15: (GPU_LOST, "GPU is lost (fell off the bus)"),
    16: (GPU_LOST, "GPU requires a reset"),
    18: (ERROR, "driver/library version mismatch (kernel module and libnvidia-ml differ)"),
    28: (GPU_LOST, "GPU not found"),
    999: (ERROR, "unknown NVML error"),
}

# nvmlGpuFabricState_t
FABRIC_NOT_SUPPORTED, FABRIC_NOT_STARTED, FABRIC_IN_PROGRESS, FABRIC_COMPLETED = 0, 1, 2, 3
FABRIC_STATE_NAMES = {0: "not supported", 1: "not started", 2: "in progress", 3: "completed"}

# Clock event (throttle) reason bits, nvml.h
CLOCK_SW_POWER_CAP = 0x4
CLOCK_HW_SLOWDOWN = 0x8
CLOCK_SW_THERMAL = 0x20
CLOCK_HW_THERMAL = 0x40
CLOCK_HW_POWER_BRAKE = 0x80
CLOCK_REASON_NAMES = {
    CLOCK_SW_POWER_CAP: "sw_power_cap",
    CLOCK_HW_SLOWDOWN: "hw_slowdown",
    CLOCK_SW_THERMAL: "sw_thermal_slowdown",
    CLOCK_HW_THERMAL: "hw_thermal_slowdown",
    CLOCK_HW_POWER_BRAKE: "hw_power_brake_slowdown",
}

Val = Union[Any, Unavailable]


def nvml_return_words(code: int) -> str:
    """An NVML return code (e.g. a fabric probe's status) in words."""
    if code == 0:
        return "success"
    return _NVML_ERRORS[code][1] if code in _NVML_ERRORS else f"NVML return code {code}"


def nvml_unavailable(exc: BaseException) -> Unavailable:
    code = getattr(exc, "value", None)
    if isinstance(code, int) and code in _NVML_ERRORS:
        kind, words = _NVML_ERRORS[code]
        return Unavailable(kind, words)
    return Unavailable(ERROR, f"{type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_bytes: int | None


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: Val = None
    uuid: Val = None
    pci_bus_id: Val = None
    compute_capability: Val = None  # (major, minor)
    memory_total_bytes: Val = None
    ecc_current: Val = None
    ecc_pending: Val = None
    ecc_uncorrected_volatile: Val = None
    ecc_uncorrected_aggregate: Val = None
    remapped_rows: Val = None  # (correctable, uncorrectable, pending: bool, failure: bool)
    retired_pages_dbe: Val = None
    retired_pages_sbe: Val = None
    retired_pages_pending: Val = None
    pcie_gen_current: Val = None
    pcie_gen_max: Val = None
    pcie_width_current: Val = None
    pcie_width_max: Val = None
    clock_event_reasons: Val = None
    temperature_c: Val = None
    slowdown_temperature_c: Val = None
    persistence_mode: Val = None
    numa_node: Val = None
    processes: Val = ()
    #: NVML fabric probe (Hopper and later): (state, status), NVML_GPU_FABRIC_STATE_* and an NVML return code.
    fabric: Val = None
    #: Set when the device handle itself could not be obtained (GPU lost): all other fields are unknown.
    handle_error: Unavailable | None = None

    @property
    def lost(self) -> Unavailable | None:
        """The first 'GPU is lost' answer from any call for this GPU: it fell off the bus mid-run."""
        if self.handle_error is not None and self.handle_error.kind == GPU_LOST:
            return self.handle_error
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Unavailable) and v.kind == GPU_LOST:
                return v
        return None


@dataclass(frozen=True)
class NvmlSnapshot:
    #: None when NVML initialised; otherwise why not (not installed, no driver, mismatch...).
    error: Unavailable | None = None
    driver_version: Val = None
    cuda_driver_version: Val = None  # e.g. 13000 for CUDA 13.0
    nvml_version: Val = None
    device_count: Val = 0
    gpus: tuple[GpuInfo, ...] = ()
    #: "nvml" (nvidia-ml-py) or "nvidia-smi" (the fallback when nvidia-ml-py is not installed)
    source: str = "nvml"

    @property
    def ok(self) -> bool:
        return self.error is None


def _s(v: Any) -> Any:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def normalise_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:17:00.0`` -> sysfs/kernel-log style ``0000:17:00.0`` (lower case)."""
    bus_id = _s(bus_id).strip().lower()
    parts = bus_id.split(":")
    if len(parts) == 3:
        try:
            return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
        except ValueError:
            return bus_id
    return bus_id


def load_pynvml() -> Any:
    import pynvml  # nvidia-ml-py; lazy so hostcheck runs without it

    return pynvml


def _smi_fallback() -> NvmlSnapshot:
    from hostcheck.gather.smi import gather_smi

    return gather_smi()


def gather_nvml(
    nvml: Any = None,
    loader: Callable[[], Any] = load_pynvml,
    proc_name: Callable[[int], str] | None = None,
    fallback: Callable[[], NvmlSnapshot] | None = _smi_fallback,
) -> NvmlSnapshot:
    """Per-GPU data through nvidia-ml-py; without it, through nvidia-smi (``fallback``)."""
    if nvml is None:
        try:
            nvml = loader()
        except ImportError:
            missing = "Python package nvidia-ml-py (module pynvml) not installed"
            if fallback is not None:
                snap = fallback()
                if snap.ok or "not found" not in snap.error.reason:
                    return snap
                missing += f" and {snap.error.reason}"
            return NvmlSnapshot(error=Unavailable(NOT_INSTALLED, missing))
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return NvmlSnapshot(error=nvml_unavailable(exc))
    try:
        return _gather_initialised(nvml, proc_name or _proc_name)
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _call(fn: Callable[..., Any], *args: Any) -> Val:
    try:
        return fn(*args)
    except Exception as exc:
        return nvml_unavailable(exc)


def _proc_name(pid: int) -> str:
    comm = read_text(f"/proc/{pid}/comm")
    return comm.strip() if isinstance(comm, str) else "?"


def _gather_initialised(nvml: Any, proc_name: Callable[[int], str]) -> NvmlSnapshot:
    driver = _call(nvml.nvmlSystemGetDriverVersion)
    cuda = _call(nvml.nvmlSystemGetCudaDriverVersion)
    nvml_v = _call(nvml.nvmlSystemGetNVMLVersion)
    count = _call(nvml.nvmlDeviceGetCount)
    gpus = []
    if isinstance(count, int):
        for i in range(count):
            gpus.append(_gather_gpu(nvml, i, proc_name))
    return NvmlSnapshot(
        error=None,
        driver_version=_s(driver),
        cuda_driver_version=cuda,
        nvml_version=_s(nvml_v),
        device_count=count,
        gpus=tuple(gpus),
    )


def _gather_gpu(nvml: Any, i: int, proc_name: Callable[[int], str]) -> GpuInfo:
    h = _call(nvml.nvmlDeviceGetHandleByIndex, i)
    if isinstance(h, Unavailable):
        return GpuInfo(index=i, handle_error=h)

    def get(name: str, *args: Any) -> Val:
        fn = getattr(nvml, name, None)
        if fn is None:
            return Unavailable(NOT_SUPPORTED, f"{name} not in this nvidia-ml-py")
        return _call(fn, h, *args)

    pci = get("nvmlDeviceGetPciInfo")
    bus_id: Val = pci if isinstance(pci, Unavailable) else normalise_bus_id(getattr(pci, "busId", ""))
    ecc = get("nvmlDeviceGetEccMode")
    ecc_cur: Val = ecc if isinstance(ecc, Unavailable) else bool(ecc[0])
    ecc_pend: Val = ecc if isinstance(ecc, Unavailable) else bool(ecc[1])
    rr = get("nvmlDeviceGetRemappedRows")
    remapped: Val = rr if isinstance(rr, Unavailable) else (int(rr[0]), int(rr[1]), bool(rr[2]), bool(rr[3]))
    cc = get("nvmlDeviceGetCudaComputeCapability")
    cap: Val = cc if isinstance(cc, Unavailable) else (int(cc[0]), int(cc[1]))
    mem = get("nvmlDeviceGetMemoryInfo")
    mem_total: Val = mem if isinstance(mem, Unavailable) else int(mem.total)
    reasons = get("nvmlDeviceGetCurrentClocksEventReasons")
    if isinstance(reasons, Unavailable) and reasons.kind == NOT_SUPPORTED:
        reasons = get("nvmlDeviceGetCurrentClocksThrottleReasons")
    pm = get("nvmlDeviceGetPersistenceMode")
    numa = get("nvmlDeviceGetNumaNodeId")
    if isinstance(numa, Unavailable) and isinstance(bus_id, str):
        sysfs = read_text(f"/sys/bus/pci/devices/{bus_id}/numa_node")
        numa = int(sysfs.strip()) if isinstance(sysfs, str) and sysfs.strip().lstrip("-").isdigit() else numa
    dbe = get("nvmlDeviceGetRetiredPages", 1)  # NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    sbe = get("nvmlDeviceGetRetiredPages", 0)
    procs_raw = get("nvmlDeviceGetComputeRunningProcesses")
    procs: Val
    if isinstance(procs_raw, Unavailable):
        procs = procs_raw
    else:
        procs = tuple(
            GpuProcess(
                pid=int(p.pid),
                name=proc_name(int(p.pid)),
                used_bytes=getattr(p, "usedGpuMemory", None),
            )
            for p in procs_raw
            if int(p.pid) != os.getpid()  # hostcheck itself is not a foreign process
        )
    return GpuInfo(
        index=i,
        name=_s(get("nvmlDeviceGetName")),
        uuid=_s(get("nvmlDeviceGetUUID")),
        pci_bus_id=bus_id,
        compute_capability=cap,
        memory_total_bytes=mem_total,
        ecc_current=ecc_cur,
        ecc_pending=ecc_pend,
        ecc_uncorrected_volatile=get("nvmlDeviceGetTotalEccErrors", 1, 0),  # UNCORRECTED, VOLATILE
        ecc_uncorrected_aggregate=get("nvmlDeviceGetTotalEccErrors", 1, 1),  # UNCORRECTED, AGGREGATE
        remapped_rows=remapped,
        retired_pages_dbe=dbe if isinstance(dbe, Unavailable) else len(dbe),
        retired_pages_sbe=sbe if isinstance(sbe, Unavailable) else len(sbe),
        retired_pages_pending=_bool(get("nvmlDeviceGetRetiredPagesPendingStatus")),
        pcie_gen_current=get("nvmlDeviceGetCurrPcieLinkGeneration"),
        pcie_gen_max=get("nvmlDeviceGetMaxPcieLinkGeneration"),
        pcie_width_current=get("nvmlDeviceGetCurrPcieLinkWidth"),
        pcie_width_max=get("nvmlDeviceGetMaxPcieLinkWidth"),
        clock_event_reasons=reasons,
        temperature_c=get("nvmlDeviceGetTemperature", 0),  # NVML_TEMPERATURE_GPU
        slowdown_temperature_c=get("nvmlDeviceGetTemperatureThreshold", 1),  # THRESHOLD_SLOWDOWN
        persistence_mode=_bool(pm),
        numa_node=numa,
        processes=procs,
        fabric=_fabric(nvml, h),
    )


def _fabric(nvml: Any, h: Any) -> Val:
    """(state, status) from nvmlDeviceGetGpuFabricInfo, which fills a struct passed by reference."""
    struct = getattr(nvml, "c_nvmlGpuFabricInfo_t", None)
    fn = getattr(nvml, "nvmlDeviceGetGpuFabricInfo", None)
    if struct is None or fn is None:
        return Unavailable(NOT_SUPPORTED, "nvmlDeviceGetGpuFabricInfo not in this nvidia-ml-py")
    try:
        info = struct()
        fn(h, ctypes.byref(info))
    except Exception as exc:
        return nvml_unavailable(exc)
    return int(info.state), int(info.status)


def _bool(v: Val) -> Val:
    return v if isinstance(v, Unavailable) else bool(v)
