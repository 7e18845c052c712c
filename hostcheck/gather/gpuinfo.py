"""What hostcheck knows of the GPUs, whichever way it was read (NVML, or nvidia-smi without nvidia-ml-py)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Union

from hostcheck.gather.base import GPU_LOST, Unavailable

Val = Union[Any, Unavailable]


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_bytes: int | None


#: nvmlNvLinkErrorCounter_t (nvml.h): the data-link error counters read per link, by the names hostcheck keeps.
NVLINK_COUNTERS = (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3))


@dataclass(frozen=True)
class NvLink:
    """One NVLink of a GPU as NVML answers it; each field is a value or why it is missing."""

    link: int
    #: nvmlDeviceGetNvLinkState: True when NVML_FEATURE_ENABLED (the link is up).
    active: Val = None
    #: nvmlDeviceGetNvLinkVersion: an nvmlNvlinkVersion_t (an enum, not the NVLink generation: see NVLINK_VERSIONS).
    version: Val = None
    #: nvmlDeviceGetNvLinkRemotePciInfo, as sysfs writes bus ids (``0000:05:00.0``).
    remote_bus_id: Val = None
    #: nvmlDeviceGetNvLinkRemoteDeviceType: nvmlIntNvLinkDeviceType_t (0 GPU, 1 IBM NPU, 2 NVSwitch, 255 unknown).
    remote_type: Val = None
    #: NVML_FI_DEV_NVLINK_GET_SPEED for this link (scopeId = link): MB/s.
    speed_mbps: Val = None
    #: nvmlDeviceGetNvLinkErrorCounter, since the driver loaded.
    replay: Val = None
    recovery: Val = None
    crc_flit: Val = None
    crc_data: Val = None

    def counters(self) -> dict[str, int]:
        """The error counters NVML answered, by name."""
        return {k: v for k, _nvml_id in NVLINK_COUNTERS if isinstance(v := getattr(self, k), int)}


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
    #: Active NVLink links; 0 = none (PCIe only).
    nvlink_active: Val = None
    #: Every NVLink NVML lists (links 0 to 17), up or not; () on a GPU without NVLink; None when not read.
    nvlinks: Val = None
    processes: Val = ()
    #: NVML fabric probe (Hopper and later): (state, status), NVML_GPU_FABRIC_STATE_* and an NVML return code.
    fabric: Val = None
    #: Consistency inside a node (gpu.E016-E019) and the PCIe replay counter (gpu.E015).
    vbios: Val = None
    power_limit_mw: Val = None
    power_limit_default_mw: Val = None
    #: Application clocks (graphics, memory) in MHz, and the board's defaults.
    app_clocks_mhz: Val = None
    app_clocks_default_mhz: Val = None
    #: (current, pending) MIG mode: 1 enabled, 0 disabled; NOT_SUPPORTED on GPUs without MIG.
    mig_mode: Val = None
    pcie_replays: Val = None
    #: Set when the device handle itself could not be obtained (GPU lost): all other fields are unknown.
    handle_error: Unavailable | None = None

    def __post_init__(self) -> None:
        # The PCI address is typed once, whoever built the record (a gatherer, a test): see BusId.
        if isinstance(self.pci_bus_id, str) and not isinstance(self.pci_bus_id, BusId):
            object.__setattr__(self, "pci_bus_id", BusId(self.pci_bus_id))

    @property
    def lost(self) -> Unavailable | None:
        """The first 'GPU is lost' answer from any call for this GPU: it fell off the bus mid-run."""
        if self.handle_error is not None and self.handle_error.kind == GPU_LOST:
            return self.handle_error
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Unavailable) and v.kind == GPU_LOST:
                return v
        for link in self.nvlinks if isinstance(self.nvlinks, tuple) else ():
            for f in fields(link):
                v = getattr(link, f.name)
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


def as_text(v: Any) -> Any:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


class BusId(str):
    """A GPU's PCI address, parsed once where it is read. The text is the sysfs form, ``0000:3b:00.0`` (what
    /sys/bus/pci and the checks use); :attr:`nvml` is NVML's and dcgm-exporter's, ``00000000:3B:00.0``;
    :attr:`kernel` is the kernel log's, without the function, ``0000:3b:00`` (how an XID line names a GPU).
    Text that is no PCI address is kept (lower case) in all three."""

    nvml: str
    kernel: str

    def __new__(cls, text: Any) -> BusId:
        raw = str(as_text(text)).strip().lower()
        parts = raw.split(":")
        try:
            domain = int(parts[0], 16) if len(parts) == 3 else None
        except ValueError:
            domain = None
        self = super().__new__(cls, raw if domain is None else f"{domain:04x}:{parts[1]}:{parts[2]}")
        self.nvml = raw if domain is None else f"{domain:08X}:{parts[1].upper()}:{parts[2].upper()}"
        self.kernel = str(self).rsplit(".", 1)[0]
        return self


def normalise_bus_id(bus_id: Any) -> BusId:
    """NVML's ``00000000:17:00.0`` (or any PCI address text) -> its :class:`BusId`, ``0000:17:00.0``."""
    return bus_id if isinstance(bus_id, BusId) else BusId(bus_id)
