"""GPU checks inside one node (gpu.E015-E019): the PCIe replay counter rising, and every GPU on the same VBIOS,
power limit, application clocks and MIG mode. A synchronous job runs at the pace of its slowest GPU, so one GPU
capped or clocked apart from the others slows them all. MIG-aware: a GPU in MIG mode is reported as such and never
judged on what MIG changes. Pure functions of the Snapshot (docs/hardware.md)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from hostcheck.checks.gpu import _config, _missing, _no_gpus, _per_gpu
from hostcheck.gather.base import NOT_SUPPORTED, Unavailable
from hostcheck.gather.hardware import HardwareSnapshot
from hostcheck.gather.nvml import GpuInfo
from hostcheck.gather.state import FIRST, RESET, RISING
from hostcheck.registry import Outcome, Status, check, passed, skipped, warned


def _read(g: GpuInfo, v: Any, what: str) -> tuple[Status, str] | None:
    """As gpu._missing, and None (not read at all: nvidia-smi without nvidia-ml-py) is a skip, never a value."""
    if v is None:
        return Status.SKIP, f"GPU {g.index}: {what} not read"
    return _missing(g, v, what)


def _ok_gpus(s: Any) -> list[GpuInfo]:
    return [g for g in s.nvml.gpus if g.handle_error is None]


def _mig_on(g: GpuInfo) -> bool:
    return isinstance(g.mig_mode, tuple) and g.mig_mode[0] == 1


@check("gpu.E015", "PCIe replays rising (NVML)", weight=3, needs=("nvml", "hardware"))
def pcie_replays(s: Any) -> Outcome:
    hw = getattr(s, "hardware", None)
    if not isinstance(hw, HardwareSnapshot):
        return skipped("host hardware (the counter history) not gathered")
    rate_limit = _config(s).thresholds.pcie_replay_rate_warn_per_min
    elapsed = hw.state.elapsed_s(hw.taken_at)

    def judge(g: GpuInfo) -> tuple[Status, str] | None:
        m = _read(g, g.pcie_replays, "PCIe replay counter")
        if m:
            return m
        if not isinstance(g.uuid, str):
            return Status.SKIP, f"GPU {g.index}: no UUID to keep its counter under"
        t = hw.state.trend("pcie_replay", g.uuid, int(g.pcie_replays))
        if t.kind == FIRST:
            return Status.PASS, f"GPU {g.index}: {t.value} replays (baseline)"
        if t.kind == RESET:
            return (
                Status.PASS,
                f"GPU {g.index}: {t.value}, down from {t.previous} (driver reload; new baseline)",
            )
        if t.kind != RISING:
            return Status.PASS, f"GPU {g.index}: {t.value} replays (unchanged)"
        minutes = max(elapsed or 0.0, 60.0) / 60.0  # a rise within a minute counts as that minute's rate
        rate = t.delta / minutes
        text = f"GPU {g.index}: +{t.delta} PCIe replays since the last run ({rate:.1f}/min)"
        return (Status.WARN if rate > rate_limit else Status.PASS), text

    return _per_gpu(
        s,
        judge,
        "PCIe replay counters not rising faster than DCGM's limit",
        hint=lambda gs: (
            "replays are link-level retries: reseat the GPU or its riser/cable, check "
            "'nvidia-smi -q -d PCIE' and system.E009's AER counters; DCGM's PCIe health watch reports the same"
        ),
        expected=f"<= {rate_limit:g} replays/min",
    )


def _same(s: Any, what: str, value: Any, fmt: Any, hint: str, skip_mig: bool = False) -> Outcome:
    """Every GPU of one model gives the same ``value(g)``; the odd ones out are named."""
    early = _no_gpus(s)
    if early:
        return early
    groups: dict[Any, dict[Any, list[int]]] = defaultdict(lambda: defaultdict(list))
    details, skipped_gpus = [], []
    for g in _ok_gpus(s):
        v = value(g)
        m = _read(g, v, what)
        if m:
            details.append(m[1])
            continue
        if skip_mig and _mig_on(g):
            skipped_gpus.append(g.index)
            continue
        groups[g.name][v].append(g.index)
    if skipped_gpus:
        details.append(f"GPU(s) {', '.join(map(str, skipped_gpus))} in MIG mode: not compared")
    if not groups:
        return skipped(f"{what} not available", details=tuple(details))
    odd = []
    for name, by_value in groups.items():
        if len(by_value) > 1:
            common = max(by_value, key=lambda v: len(by_value[v]))
            for v, idx in by_value.items():
                if v != common:
                    odd.append(
                        f"{name}: GPU {', '.join(map(str, idx))} at {fmt(v)}, the other(s) at {fmt(common)}"
                    )
        for v, idx in by_value.items():
            details.append(f"GPU {', '.join(map(str, idx))}: {fmt(v)}")
    if odd:
        return warned(f"{what} differs: " + "; ".join(odd), hint=hint, details=tuple(details))
    return passed(f"every GPU of a model on the same {what}", details=tuple(details))


@check("gpu.E016", "Same VBIOS on every GPU", weight=2, needs=("nvml",))
def same_vbios(s: Any) -> Outcome:
    return _same(
        s,
        "VBIOS",
        lambda g: g.vbios,
        str,
        "flash every GPU to the same VBIOS with the vendor's firmware bundle (nvidia-smi -q | grep VBIOS to see "
        "them); mixed firmware behaves differently under load",
    )


@check("gpu.E017", "Same power limit on every GPU", weight=3, needs=("nvml",))
def same_power_limit(s: Any) -> Outcome:
    out = _same(
        s,
        "power limit",
        lambda g: g.power_limit_mw,
        lambda mw: f"{mw / 1000:g} W",
        "set one limit on every GPU ('nvidia-smi -i <ids> -pl <watts>'; 'nvidia-smi -q -d POWER' shows the "
        "default); a GPU capped lower slows the whole job",
    )
    off_default = [
        f"GPU {g.index}: {g.power_limit_mw / 1000:g} W, default {g.power_limit_default_mw / 1000:g} W"
        for g in (_ok_gpus(s) if s.nvml is not None and s.nvml.ok else [])
        if isinstance(g.power_limit_mw, int)
        and isinstance(g.power_limit_default_mw, int)
        and g.power_limit_mw != g.power_limit_default_mw
    ]
    if off_default and out.status is Status.PASS:
        return passed(
            out.message + " (not the board's default: set on purpose?)",
            details=out.details + tuple(off_default),
        )
    return out


@check("gpu.E018", "Application clocks at their defaults (or as configured)", weight=2, needs=("nvml",))
def app_clocks(s: Any) -> Outcome:
    want = _config(s).hardware.app_clocks_mhz

    def judge(g: GpuInfo) -> tuple[Status, str] | None:
        if _mig_on(g):
            return Status.SKIP, f"GPU {g.index}: MIG mode on (application clocks not judged)"
        m = _read(g, g.app_clocks_mhz, "application clocks")
        if m:
            return m
        target = want
        if target is None:
            d = _read(g, g.app_clocks_default_mhz, "default application clocks")
            if d:
                return d
            target = g.app_clocks_default_mhz
        cur = tuple(g.app_clocks_mhz)
        if cur != tuple(target):
            basis = "configured" if want else "default"
            return (
                Status.WARN,
                f"GPU {g.index}: application clocks {cur[0]}/{cur[1]} MHz, {basis} {target[0]}/{target[1]} MHz",
            )
        return Status.PASS, f"GPU {g.index}: {cur[0]}/{cur[1]} MHz"

    return _per_gpu(
        s,
        judge,
        "application clocks " + ("as configured" if want else "at the board's defaults"),
        hint=lambda gs: (
            f"reset them with 'nvidia-smi -rac -i {','.join(str(g.index) for g in gs)}' "
            "(or set [hardware] app_clock_graphics_mhz / app_clock_memory_mhz to what the site sets)"
        ),
        expected="graphics/memory MHz " + (f"{want[0]}/{want[1]}" if want else "= default"),
    )


@check("gpu.E019", "MIG mode as expected", weight=3, needs=("nvml",))
def mig_mode(s: Any) -> Outcome:
    early = _no_gpus(s)
    if early:
        return early
    expect = _config(s).hardware.mig
    on, off, pending, details, unknown = [], [], [], [], []
    for g in _ok_gpus(s):
        if isinstance(g.mig_mode, Unavailable) and g.mig_mode.kind == NOT_SUPPORTED:
            off.append(g.index)  # a GPU without MIG is, for this purpose, a GPU with MIG off
            details.append(f"GPU {g.index}: no MIG (not supported)")
            continue
        m = _read(g, g.mig_mode, "MIG mode")
        if m:
            unknown.append(g.index)
            details.append(m[1])
            continue
        cur, pend = g.mig_mode
        (on if cur == 1 else off).append(g.index)
        if pend != cur:
            pending.append(
                f"GPU {g.index}: MIG {'on' if pend else 'off'} pending (takes effect at a GPU reset)"
            )
        details.append(f"GPU {g.index}: MIG {'on' if cur else 'off'}")
    listing = f"MIG on: GPU {', '.join(map(str, on)) or 'none'}"
    hint = (
        "set it on every GPU the same way ('nvidia-smi -mig 0|1 -i <ids>', then reset the GPUs) or change "
        "[hardware] mig to what this node should run"
    )
    if not on and not off:
        return skipped("MIG mode not read on any GPU", details=tuple(details))
    wrong = []
    if expect == "off" and on:
        wrong.append(f"MIG on for GPU {', '.join(map(str, on))}, expected off")
    elif expect == "on" and off:
        wrong.append(f"MIG off for GPU {', '.join(map(str, off))}, expected on")
    elif expect == "same" and on and off:
        wrong.append(
            f"MIG mode differs: on for GPU {', '.join(map(str, on))}, off for {', '.join(map(str, off))}"
        )
    if wrong or pending:
        return warned("; ".join(wrong + pending), hint=hint, details=tuple(details))
    unread = f"; GPU {', '.join(map(str, unknown))}: not read" if unknown else ""
    if on:
        return passed(
            f"{listing}: per-GPU figures there are per MIG instance, and checks do not judge what MIG changes"
            + unread,
            details=tuple(details),
        )
    where = "every GPU" if not unknown else f"GPU {', '.join(map(str, off))}"
    return passed(f"MIG off on {where} (expected: {expect}){unread}", details=tuple(details))
