"""Per-GPU health through NVML (module ``pynvml`` from nvidia-ml-py), every call's failure kept as a value.

``gather_nvml(nvml=...)`` takes the module as a parameter so tests pass a fake one. Every NVLink is read per link
(state, version, remote end, speed, error counters) in the same pass.

Why one module: one NVML session and one mapping of NVML's return codes serve every per-GPU figure, the
NVLinks and the job's sampler included; split, each part would need the session and the mapping passed in. :class:`NvmlSampler` reads
the changing figures (utilisation, memory, PCIe throughput, power, clocks, and on Hopper and later GPUs the GPM
metrics SM activity and SM occupancy) again and again for ``hostcheck job``.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
from dataclasses import dataclass
from typing import Any, Callable

from hostcheck.gather.base import (
    ERROR,
    GPU_LOST,
    NO_PERMISSION,
    NOT_FOUND,
    NOT_INSTALLED,
    NOT_SUPPORTED,
    TIMEOUT,
    Unavailable,
    parse_int,
    read_text,
)
from hostcheck.gather.gpuinfo import (
    NVLINK_COUNTERS,
    GpuInfo,
    GpuProcess,
    NvLink,
    NvmlSnapshot,
    Val,
    as_text,
    normalise_bus_id,
)
from hostcheck.gather.smi import gather_smi

__all__ = [
    "GpuInfo",
    "GpuProcess",
    "GpuSample",
    "NvLink",
    "NvmlSampler",
    "NvmlSnapshot",
    "gather_nvml",
    "normalise_bus_id",
    "nvlink_counters",
    "nvlink_key",
    "nvml_unavailable",
]

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


def load_pynvml() -> Any:
    import pynvml  # nvidia-ml-py; lazy so hostcheck runs without it

    return pynvml


def _smi_fallback() -> NvmlSnapshot:
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
        driver_version=as_text(driver),
        cuda_driver_version=cuda,
        nvml_version=as_text(nvml_v),
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
        numa = parse_int(sysfs, signed=True) if parse_int(sysfs, signed=True) is not None else numa
    dbe = get("nvmlDeviceGetRetiredPages", 1)  # NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    sbe = get("nvmlDeviceGetRetiredPages", 0)
    nvlink_active, nvlinks = _nvlinks(nvml, h)
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
        name=as_text(get("nvmlDeviceGetName")),
        uuid=as_text(get("nvmlDeviceGetUUID")),
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
        nvlink_active=nvlink_active,
        nvlinks=nvlinks,
        processes=procs,
        fabric=_fabric(nvml, h),
        vbios=as_text(get("nvmlDeviceGetVbiosVersion")),
        power_limit_mw=get("nvmlDeviceGetPowerManagementLimit"),
        power_limit_default_mw=get("nvmlDeviceGetPowerManagementDefaultLimit"),
        app_clocks_mhz=_pair(
            get("nvmlDeviceGetApplicationsClock", CLOCK_GRAPHICS),
            get("nvmlDeviceGetApplicationsClock", CLOCK_MEM),
        ),
        app_clocks_default_mhz=_pair(
            get("nvmlDeviceGetDefaultApplicationsClock", CLOCK_GRAPHICS),
            get("nvmlDeviceGetDefaultApplicationsClock", CLOCK_MEM),
        ),
        mig_mode=_mig(get("nvmlDeviceGetMigMode")),
        pcie_replays=get("nvmlDeviceGetPcieReplayCounter"),
    )


#: nvmlClockType_t (nvml.h): NVML_CLOCK_GRAPHICS, NVML_CLOCK_MEM.
CLOCK_GRAPHICS, CLOCK_MEM = 0, 2


def _pair(a: Val, b: Val) -> Val:
    for v in (a, b):
        if isinstance(v, Unavailable):
            return v
    return int(a), int(b)


def _mig(v: Val) -> Val:
    """nvmlDeviceGetMigMode's (current, pending), each NVML_DEVICE_MIG_ENABLE (1) or _DISABLE (0)."""
    if isinstance(v, Unavailable):
        return v
    try:
        return int(v[0]), int(v[1])
    except (TypeError, ValueError, IndexError):
        return Unavailable(ERROR, f"nvmlDeviceGetMigMode answered {str(v)[:40]}")


#: NVML_NVLINK_MAX_LINKS (nvml.h): links are numbered 0 to 17.
NVLINK_MAX_LINKS = 18
#: NVML field NVML_FI_DEV_NVLINK_GET_SPEED (nvml.h): a link's speed in MB/s, the link in the field's scopeId.
FI_NVLINK_GET_SPEED = 164
#: No link runs faster than this (MB/s): a larger answer is not a speed.
NVLINK_MAX_MBPS = 1_000_000


def _nvlinks(nvml: Any, h: Any) -> tuple[Val, Val]:
    """(active links, every link) from one pass over the links. A link is up when nvmlDeviceGetNvLinkState says
    NVML_FEATURE_ENABLED (1). NOT_SUPPORTED for link 0 means the GPU has none (0 and (): a PCIe-only GPU); another
    error there leaves the links unknown (the count 0, or the error when the GPU is lost); no answer for a later
    link ends the list."""
    fn = getattr(nvml, "nvmlDeviceGetNvLinkState", None)
    if fn is None:
        why = Unavailable(NOT_SUPPORTED, "nvmlDeviceGetNvLinkState not in this nvidia-ml-py")
        return why, why
    states: list[tuple[int, bool]] = []
    for link in range(NVLINK_MAX_LINKS):
        state = _call(fn, h, link)
        if isinstance(state, Unavailable):
            if link == 0 and state.kind == GPU_LOST:
                return state, state
            if link == 0 and state.kind != NOT_SUPPORTED:
                return 0, state  # the count has always read 0 here; the links say why they are unknown
            break
        states.append((link, int(state) == 1))
    speeds = _nvlink_speeds(nvml, h, [link for link, _up in states])
    links = tuple(_nvlink(nvml, h, link, up, speeds[link]) for link, up in states)
    return sum(up for _link, up in states), links


def nvlink_key(uuid: str, link: int, counter: str) -> str:
    """How an NVLink error counter is named in the counter state (namespace "nvlink") and the job doctor."""
    return f"{uuid}.{link}.{counter}"


def nvlink_counters(gpus: Any) -> dict[str, int]:
    """Every NVLink error counter NVML answered, by :func:`nvlink_key`; GPUs without a UUID are left out."""
    out: dict[str, int] = {}
    for g in gpus:
        if not isinstance(g.uuid, str) or not isinstance(g.nvlinks, tuple):
            continue
        for lk in g.nvlinks:
            for name, value in lk.counters().items():
                out[nvlink_key(g.uuid, lk.link, name)] = value
    return out


def _nvlink(nvml: Any, h: Any, link: int, up: bool, speed: Val) -> NvLink:
    def get(name: str, *args: Any) -> Val:
        fn = getattr(nvml, name, None)
        if fn is None:
            return Unavailable(NOT_SUPPORTED, f"{name} not in this nvidia-ml-py")
        return _call(fn, h, link, *args)

    remote = get("nvmlDeviceGetNvLinkRemotePciInfo")
    counters = {k: _count(get("nvmlDeviceGetNvLinkErrorCounter", code)) for k, code in NVLINK_COUNTERS}
    return NvLink(
        link=link,
        active=up,
        version=_count(get("nvmlDeviceGetNvLinkVersion")),
        remote_bus_id=remote
        if isinstance(remote, Unavailable)
        else normalise_bus_id(getattr(remote, "busId", "")),
        remote_type=_count(get("nvmlDeviceGetNvLinkRemoteDeviceType")),
        speed_mbps=speed,
        **counters,
    )


def _count(v: Val) -> Val:
    """A non-negative integer answer, or why there is none."""
    if isinstance(v, Unavailable):
        return v
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        return Unavailable(ERROR, f"NVML answered {str(v)[:40]}")
    return v


def _nvlink_speeds(nvml: Any, h: Any, links: list[int]) -> dict[int, Val]:
    """Each link's NVML_FI_DEV_NVLINK_GET_SPEED in one nvmlDeviceGetFieldValues call ((field, scope) pairs)."""
    fn = getattr(nvml, "nvmlDeviceGetFieldValues", None)
    if fn is None:
        return dict.fromkeys(
            links, Unavailable(NOT_SUPPORTED, "nvmlDeviceGetFieldValues not in this nvidia-ml-py")
        )
    if not links:
        return {}
    try:
        values = list(fn(h, [(FI_NVLINK_GET_SPEED, link) for link in links]))
    except TypeError:  # an nvidia-ml-py that takes no (field, scope) pairs
        return dict.fromkeys(links, Unavailable(NOT_SUPPORTED, "this nvidia-ml-py takes no scoped field ids"))
    except Exception as exc:
        return dict.fromkeys(links, nvml_unavailable(exc))
    out: dict[int, Val] = {}
    for i, link in enumerate(links):
        v = values[i] if i < len(values) else None
        ret = getattr(v, "nvmlReturn", None)
        if ret != 0:
            code = ret if isinstance(ret, int) else 999
            kind, words = _NVML_ERRORS.get(code, (ERROR, f"NVML return code {code}"))
            out[link] = Unavailable(kind, f"NVLink speed: {words}")
            continue
        mbps = getattr(getattr(v, "value", None), "uiVal", None)
        ok = isinstance(mbps, int) and not isinstance(mbps, bool) and 0 <= mbps <= NVLINK_MAX_MBPS
        out[link] = mbps if ok else Unavailable(ERROR, f"NVLink speed: NVML answered {str(mbps)[:40]}")
    return out


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


# nvmlPcieUtilCounter_t and nvmlClockType_t (nvml.h)
PCIE_TX, PCIE_RX = 0, 1
CLOCK_SM = 1
# nvmlGpmMetricId_t (NVML API reference, GPM Enums): NVML_GPM_METRIC_SM_UTIL "percentage of SMs that were busy"
# (SM activity) and NVML_GPM_METRIC_SM_OCCUPANCY "percentage of warps that were active vs theoretical maximum",
# both 0.0 - 100.0; NVML_GPM_METRICS_GET_VERSION and NVML_GPM_SUPPORT_VERSION are 1.
GPM_SM_UTIL, GPM_SM_OCCUPANCY = 2, 3
GPM_VERSION = 1


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one moment; None where NVML did not answer."""

    index: int
    util_pct: float | None = None
    mem_util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    pcie_tx_kbs: int | None = None
    pcie_rx_kbs: int | None = None
    power_w: float | None = None
    sm_clock_mhz: int | None = None
    #: GPM (Hopper and later) over the interval since the previous sample: SM activity and occupancy, percent.
    sm_active_pct: float | None = None
    sm_occupancy_pct: float | None = None


class NvmlSampler:
    """The changing figures of every GPU, read again and again through one NVML session (``hostcheck job``).

    ``error`` says why there is nothing to sample (no nvidia-ml-py, no driver); :meth:`sample` then returns ().
    nvmlDeviceGetPcieThroughput measures over 20 ms per call, so callers ask for it less often.

    GPM: where nvmlGpmQueryDeviceSupport says a GPU supports it, each sample reads a GPM sample into one of two
    buffers (nvmlGpmSampleAlloc) and, from the second sample on, computes SM activity and occupancy between the
    two with nvmlGpmMetricsGet (NVML asks for more than 100 ms between them). A GPU without GPM, or whose GPM
    call fails, has None there: the caller falls back to utilisation and says so."""

    def __init__(self, nvml: Any = None, loader: Callable[[], Any] = load_pynvml) -> None:
        self.error: Unavailable | None = None
        self.handles: list[Any] = []
        self._nvml = nvml
        try:
            if self._nvml is None:
                self._nvml = loader()
            self._nvml.nvmlInit()
        except ImportError:
            self.error = Unavailable(
                NOT_INSTALLED, "Python package nvidia-ml-py (module pynvml) not installed"
            )
            return
        except Exception as exc:
            self.error = nvml_unavailable(exc)
            return
        count = _call(self._nvml.nvmlDeviceGetCount)
        if isinstance(count, Unavailable):
            self.error = count
            return
        for i in range(count):
            h = _call(self._nvml.nvmlDeviceGetHandleByIndex, i)
            self.handles.append(None if isinstance(h, Unavailable) else h)
        #: Per GPU: [previous GPM sample, spare buffer] where GPM is supported, else None.
        self.gpm: list[list[Any] | None] = [self._gpm_buffers(h) for h in self.handles]

    def _gpm_buffers(self, h: Any) -> list[Any] | None:
        nv = self._nvml
        if h is None or not all(
            hasattr(nv, f)
            for f in (
                "nvmlGpmQueryDeviceSupport",
                "nvmlGpmSampleAlloc",
                "nvmlGpmSampleGet",
                "nvmlGpmSampleFree",
                "nvmlGpmMetricsGet",
            )
        ):
            return None
        support = _call(nv.nvmlGpmQueryDeviceSupport, h)
        if isinstance(support, Unavailable) or not getattr(support, "isSupportedDevice", 0):
            return None
        a, b = _call(nv.nvmlGpmSampleAlloc), _call(nv.nvmlGpmSampleAlloc)
        if isinstance(a, Unavailable) or isinstance(b, Unavailable):
            for buf in (a, b):
                if not isinstance(buf, Unavailable):
                    _call(nv.nvmlGpmSampleFree, buf)
            return None
        return [None, a, b]

    def _gpm(self, i: int, h: Any) -> tuple[float | None, float | None]:
        """SM activity and occupancy (percent) since the previous call for GPU ``i``; (None, None) without."""
        bufs = self.gpm[i] if i < len(self.gpm) else None
        if bufs is None:
            return None, None
        nv = self._nvml
        prev = bufs[0]
        cur = bufs[2] if prev is bufs[1] else bufs[1]  # the buffer that does not hold the previous sample
        if isinstance(_call(nv.nvmlGpmSampleGet, h, cur), Unavailable):
            bufs[0] = None
            return None, None
        bufs[0] = cur
        if prev is None:
            return None, None
        struct = getattr(nv, "c_nvmlGpmMetricsGet_t", None)
        if struct is None:
            return None, None
        try:
            get = struct()
            get.version = getattr(nv, "NVML_GPM_METRICS_GET_VERSION", GPM_VERSION)
            get.numMetrics = 2
            get.sample1, get.sample2 = prev, cur
            get.metrics[0].metricId = getattr(nv, "NVML_GPM_METRIC_SM_UTIL", GPM_SM_UTIL)
            get.metrics[1].metricId = getattr(nv, "NVML_GPM_METRIC_SM_OCCUPANCY", GPM_SM_OCCUPANCY)
            nv.nvmlGpmMetricsGet(get)
        except Exception:
            return None, None
        return _gpm_value(get.metrics[0]), _gpm_value(get.metrics[1])

    def _get(self, name: str, h: Any, *args: Any) -> Any:
        fn = getattr(self._nvml, name, None)
        if fn is None or h is None:
            return None
        v = _call(fn, h, *args)
        return None if isinstance(v, Unavailable) else v

    def sample(self, pcie: bool = True) -> tuple[GpuSample, ...]:
        if self.error is not None:
            return ()
        out = []
        for i, h in enumerate(self.handles):
            util = self._get("nvmlDeviceGetUtilizationRates", h)
            mem = self._get("nvmlDeviceGetMemoryInfo", h)
            power = self._get("nvmlDeviceGetPowerUsage", h)
            sm_active, sm_occupancy = self._gpm(i, h)
            out.append(
                GpuSample(
                    index=i,
                    util_pct=getattr(util, "gpu", None),
                    mem_util_pct=getattr(util, "memory", None),
                    mem_used_bytes=getattr(mem, "used", None),
                    mem_total_bytes=getattr(mem, "total", None),
                    pcie_tx_kbs=self._get("nvmlDeviceGetPcieThroughput", h, PCIE_TX) if pcie else None,
                    pcie_rx_kbs=self._get("nvmlDeviceGetPcieThroughput", h, PCIE_RX) if pcie else None,
                    power_w=power / 1000.0 if isinstance(power, (int, float)) else None,
                    sm_clock_mhz=self._get("nvmlDeviceGetClockInfo", h, CLOCK_SM),
                    sm_active_pct=sm_active,
                    sm_occupancy_pct=sm_occupancy,
                )
            )
        return tuple(out)

    def nvlink_counters(self) -> tuple[dict[str, int], dict[str, int]]:
        """Every NVLink error counter now (keys: :func:`nvlink_key`) and each GPU's UUID -> index; ({}, {})
        without NVML. ``hostcheck job`` reads them at the job's start and end (hostcheck.job.links)."""
        if self.error is not None:
            return {}, {}
        gpus = []
        for i, h in enumerate(self.handles):
            uuid = as_text(self._get("nvmlDeviceGetUUID", h))
            if h is not None and isinstance(uuid, str):
                gpus.append(GpuInfo(index=i, uuid=uuid, nvlinks=_nvlinks(self._nvml, h)[1]))
        return nvlink_counters(gpus), {g.uuid: g.index for g in gpus}

    def processes(self) -> dict[int, tuple[int, ...]]:
        """GPU index -> the pids running compute work on it (as the host numbers them)."""
        if self.error is not None:
            return {}
        out = {}
        for i, h in enumerate(self.handles):
            procs = self._get("nvmlDeviceGetComputeRunningProcesses", h) or []
            out[i] = tuple(int(p.pid) for p in procs)
        return out

    def close(self) -> None:
        if self.error is None:
            for bufs in getattr(self, "gpm", ()):
                for buf in (bufs or [None])[1:]:
                    _call(self._nvml.nvmlGpmSampleFree, buf)
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()


def _gpm_value(metric: Any) -> float | None:
    """One nvmlGpmMetric_t's value: None where its own nvmlReturn is an error or the value is not a percent."""
    if getattr(metric, "nvmlReturn", 0):
        return None
    v = getattr(metric, "value", None)
    if not isinstance(v, (int, float)) or not math.isfinite(v) or not 0.0 <= v <= 100.0:
        return None
    return float(v)
