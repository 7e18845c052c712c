"""NVSwitch fabric: the NVSwitches on the PCI bus and NVIDIA Fabric Manager (version, service).

On an NVSwitch board (HGX/DGX 8-GPU) CUDA cannot start until Fabric Manager has programmed the switches,
and Fabric Manager refuses to start unless its version equals the driver's. The per-GPU fabric state comes
from NVML (``GpuInfo.fabric``); this module reads the host side.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass

from hostcheck.gather.base import (
    HOST_ROOT,
    NOT_FOUND,
    NOT_INSTALLED,
    CmdResult,
    Runner,
    Unavailable,
    read_text,
    run_cmd,
    under,
)

#: The PCI devices under the one host root (``Options.host_root``).
PCI_DEVICES = "sys/bus/pci/devices"
NVIDIA_VENDOR = "0x10de"
#: PCI class "bridge, other": how NVSwitches present themselves (GPUs are 0x0302 / 0x0300).
NVSWITCH_CLASS_PREFIX = "0x0680"
FM_BINARY = "nv-fabricmanager"
FM_SERVICE = "nvidia-fabricmanager"


@dataclass(frozen=True)
class FabricState:
    #: PCI addresses of the NVSwitches, or why the PCI bus could not be read.
    nvswitches: tuple[str, ...] | Unavailable = ()
    #: ``nv-fabricmanager --version``; None when Fabric Manager is not installed.
    fm_version: str | Unavailable | None = None
    #: systemctl is-enabled / is-active of nvidia-fabricmanager ("" when not asked: nothing to manage).
    fm_enabled: str = ""
    fm_active: str = ""


NO_FABRIC = FabricState()


def find_nvswitches(pci_root: str) -> tuple[str, ...] | Unavailable:
    try:
        entries = sorted(os.listdir(pci_root))
    except OSError as exc:
        return Unavailable(NOT_FOUND, f"{pci_root} not readable ({exc.strerror or exc})")
    found = []
    for dev in entries:
        vendor = read_text(os.path.join(pci_root, dev, "vendor"), 64)
        cls = read_text(os.path.join(pci_root, dev, "class"), 64)
        if (
            isinstance(vendor, str)
            and isinstance(cls, str)
            and vendor.strip().lower() == NVIDIA_VENDOR
            and cls.strip().lower().startswith(NVSWITCH_CLASS_PREFIX)
        ):
            found.append(dev)
    return tuple(found)


def parse_fm_version(text: str) -> str | None:
    """``Fabric Manager version is : 580.95.05`` -> ``580.95.05``."""
    m = re.search(r"version\s+is\s*:\s*(\d+\.\d+(?:\.\d+)?)", text, re.IGNORECASE)
    if m is None:
        m = re.search(r"\b(\d{3}\.\d+\.\d+)\b", text)
    return m.group(1) if m else None


def gather_fabric(
    runner: Runner = run_cmd, pci_root: str | None = None, root: str = HOST_ROOT
) -> FabricState:
    """``pci_root``: the PCI device folder itself (tests); else ``<root>/sys/bus/pci/devices``."""
    switches = find_nvswitches(pci_root or under(root, PCI_DEVICES))
    has_switch = isinstance(switches, tuple) and bool(switches)
    installed = shutil.which(FM_BINARY) is not None if runner is run_cmd else True
    if not has_switch and not installed:
        return FabricState(nvswitches=switches)  # nothing to manage: no command run
    v = runner([FM_BINARY, "--version"], 10)
    version: str | Unavailable | None
    if isinstance(v, Unavailable):
        version = None if v.kind == NOT_INSTALLED else v
    else:
        version = parse_fm_version(v.stdout + "\n" + v.stderr) or Unavailable(
            NOT_FOUND, f"unparsable '{FM_BINARY} --version' output (exit {v.rc})"
        )
    states = []
    for verb in ("is-enabled", "is-active"):
        r = runner(["systemctl", verb, FM_SERVICE], 5)
        states.append((r.stdout.strip() or "unknown") if isinstance(r, CmdResult) else "unknown")
    return FabricState(nvswitches=switches, fm_version=version, fm_enabled=states[0], fm_active=states[1])
