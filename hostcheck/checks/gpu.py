"""GPU checks: driver and NVML, count, ECC, row remapping, retired pages, PCIe, clocks, temperature,
persistence, XID errors, foreign processes, NVSwitch fabric. Pure functions of the Snapshot.

A GPU that is lost (its NVML handle could not be had, or any call answered "lost" or "requires reset") is said
once, by gpu.E002, with the fix (reset, then reseat); every other per-GPU check leaves it out and says so, so a
lost GPU never gets a temperature, ECC or cooling verdict it was never read for.

Why one module: every check here judges NVML's per-GPU answers through the same few helpers (``_per_gpu``, which
leaves lost GPUs out, ``_missing``, ``gpu_name``) that the NVLink and consistency checks import too; split by
topic, each part would import them back from a third module for a dozen lines each."""

from __future__ import annotations

from typing import Any, Callable

from hostcheck import fixes, platform
from hostcheck.config import Config
from hostcheck.gather.base import GPU_LOST, NO_PERMISSION, NOT_INSTALLED, NOT_SUPPORTED, Unavailable
from hostcheck.gather.fabric import FM_SERVICE
from hostcheck.gather.gpuinfo import BusId
from hostcheck.gather.nvml import (
    CLOCK_HW_POWER_BRAKE,
    CLOCK_HW_SLOWDOWN,
    CLOCK_HW_THERMAL,
    CLOCK_REASON_NAMES,
    CLOCK_SW_POWER_CAP,
    CLOCK_SW_THERMAL,
    FABRIC_COMPLETED,
    FABRIC_IN_PROGRESS,
    FABRIC_NOT_STARTED,
    FABRIC_STATE_NAMES,
    GpuInfo,
    nvml_return_words,
)
from hostcheck.registry import Outcome, Status, check, errored, failed, passed, skipped, warned


def _config(s: Any) -> Config:
    """The snapshot's configuration (thresholds, XID policy); the defaults when a snapshot carries none."""
    cfg = getattr(getattr(s, "options", None), "config", None)
    return cfg if isinstance(cfg, Config) else Config()


def _no_gpus(s: Any) -> Outcome | None:
    """A skip outcome when there is nothing to look at per GPU (gpu.E001/E002 report why)."""
    n = s.nvml
    if n is None:
        return skipped("NVML not gathered")
    if not n.ok:
        return skipped(f"NVML unavailable: {n.error.reason} (see gpu.E001)")
    if not n.gpus:
        return skipped("no GPU found (see gpu.E002)")
    return None


def _per_gpu(
    s: Any,
    judge: Callable[[GpuInfo], tuple[Status, str] | None],
    ok_message: str,
    hint: Callable[[list[GpuInfo]], str] | None = None,
    **kw: Any,
) -> Outcome:
    """Judge each GPU; the worst status wins; unsupported fields everywhere -> skip."""
    early = _no_gpus(s)
    if early:
        return early
    verdicts: list[tuple[GpuInfo, Status, str]] = []
    for g in s.nvml.gpus:
        gone = lost(g)
        if gone is not None:
            # One check says a GPU is lost (gpu.E002, with the fix); the others have nothing of it to judge.
            v: tuple[Status, str] | None = (
                Status.SKIP,
                f"{gpu_name(g)}: not judged, the GPU is lost (gpu.E002)",
            )
        else:
            v = judge(g)
        if v is not None:
            verdicts.append((g, v[0], v[1]))
    details = tuple(text for _g, _st, text in verdicts)
    judged = [(g, st, text) for g, st, text in verdicts if st != Status.SKIP]
    if not judged:
        first = details[0].split(": ", 1)[-1] if details else "not supported"
        return skipped(f"{first} on {'these GPUs' if len(details) > 1 else 'this GPU'}", details=details)
    bad = [(g, st, text) for g, st, text in judged if st != Status.PASS]
    if not bad:
        return passed(ok_message, details=details, **kw)
    worst = max((st for _g, st, _t in bad), key=lambda st: (st.severity, st == Status.FAIL))
    msg = "; ".join(text for _g, _st, text in bad)
    return Outcome(worst, msg, hint=hint([g for g, _s, _t in bad]) if hint else None, details=details, **kw)


def lost(g: GpuInfo) -> Unavailable | None:
    """Why a GPU is lost (its handle could not be had, or any call answered 'lost' or 'requires reset'), or None."""
    return g.handle_error if g.handle_error is not None else g.lost


def gpu_name(g: GpuInfo) -> str:
    """'GPU 3 (0000:b3:00.0)': the index and, where it was read, the PCI address."""
    return f"GPU {g.index} ({g.pci_bus_id})" if isinstance(g.pci_bus_id, str) else f"GPU {g.index}"


def mig_on(g: GpuInfo) -> bool:
    """MIG mode is enabled now on this GPU (nvmlDeviceGetMigMode's current mode)."""
    return isinstance(g.mig_mode, tuple) and bool(g.mig_mode[0])


def _missing(g: GpuInfo, v: Any, what: str) -> tuple[Status, str] | None:
    if isinstance(v, Unavailable):
        if v.kind == NOT_SUPPORTED:
            return Status.SKIP, f"GPU {g.index}: {what} not supported"
        if v.kind == NO_PERMISSION:
            return Status.SKIP, f"GPU {g.index}: {what} not readable without root (run hostcheck as root)"
        if v.kind == GPU_LOST:
            return Status.SKIP, f"{gpu_name(g)}: not judged, the GPU is lost (gpu.E002)"
        return Status.ERROR, f"GPU {g.index}: {what}: {v.reason}"
    return None


def _idx(gs: list[GpuInfo]) -> str:
    return ",".join(str(g.index) for g in gs) or "N"


@check("gpu.E001", "NVIDIA driver and NVML", weight=10, needs=("nvml", "system", "facts"))
def driver_and_nvml(s: Any) -> Outcome:
    n = s.nvml
    kmod = s.system.driver_version if s.system else None
    if n.ok and not isinstance(n.driver_version, str):
        # NVML answered, but no GPU it could reach told the driver's version (every GPU lost: gpu.E002 says).
        said = f"kernel module {kmod}" if isinstance(kmod, str) else "driver version unknown"
        return skipped(f"{said}; {n.source} answered but no GPU gave the driver version (see gpu.E002)")
    if n.ok:
        msg = f"driver {n.driver_version}, CUDA driver API {_cuda_str(n.cuda_driver_version)}"
        if n.source != "nvml":
            msg += f" (read through {n.source}: nvidia-ml-py is not installed)"
        if isinstance(kmod, str) and isinstance(n.driver_version, str) and kmod != n.driver_version:
            return failed(
                f"kernel module {kmod} but NVML library {n.driver_version}",
                value=n.driver_version,
                expected=kmod,
                hint=fixes.DRIVER_MISMATCH,
            )
        want = s.facts.get("gpunode_driver", "version") if s.facts is not None else None
        if want and isinstance(n.driver_version, str) and str(want) != n.driver_version:
            same_branch = str(want).partition(".")[0] == n.driver_version.partition(".")[0]
            out = warned if same_branch else failed
            return out(
                f"{msg}, but gpunode_driver installed {want}: the driver changed since provisioning",
                value=n.driver_version,
                expected=str(want),
                hint="an upgrade outside the roles changed the driver: "
                + fixes.role_fix("gpunode_driver_hold: true", fixes.DRIVER, "driver"),
            )
        return passed(msg, value=n.driver_version, expected=str(want) if want else None)
    err = n.error
    if "nvidia-ml-py" in err.reason:
        if isinstance(kmod, str):
            return errored(
                f"NVIDIA driver {kmod} is loaded but {err.reason}: GPU health cannot be read",
                value=kmod,
                hint=fixes.NVML_PY,
            )
        return failed(
            f"no NVIDIA driver loaded ({kmod.reason if kmod else 'unknown'}) and {err.reason}",
            hint=fixes.driver_install(s.system.os_id, s.system.os_version),
        )
    if "mismatch" in err.reason:
        return failed(f"NVML: {err.reason}", hint=fixes.DRIVER_MISMATCH)
    if err.kind == NOT_INSTALLED:
        return failed(
            f"no NVIDIA driver: {err.reason}", hint=fixes.driver_install(s.system.os_id, s.system.os_version)
        )
    hint = "check dmesg for NVRM errors (Xid 79: a GPU fell off the bus)"
    if err.kind == NO_PERMISSION:
        hint = "run hostcheck as root; " + hint
    return errored(f"NVML could not start: {err.reason}", hint=hint)


def _cuda_str(v: Any) -> str:
    if isinstance(v, int) and v > 0:
        return f"{v // 1000}.{(v % 1000) // 10}"
    return "unknown"


#: The fix for a lost GPU: NVIDIA's recovery for a GPU that needs a reset or fell off the bus (Xid 79).
LOST_HINT = (
    "drain the node; reset the GPU with nothing running on it ('nvidia-smi -r -i {idx}') or reboot; a GPU that "
    "is still lost after that, or that fell off the bus (dmesg: Xid 79), needs reseating or RMA; lspci -d 10de: "
    "shows whether it is still on the PCI bus"
)


@check("gpu.E002", "GPU count", weight=10, needs=("nvml", "system", "facts"))
def gpu_count(s: Any) -> Outcome:
    expected = s.options.expect_gpus
    source = "--expect-gpus"
    if expected is None and s.facts.has("gpunode_driver", "expected_gpu_count"):
        expected = int(s.facts.get("gpunode_driver", "expected_gpu_count"))
        source = "gpunode_driver.fact expected_gpu_count"
    n = s.nvml
    listed = len(n.gpus) if n.ok else 0
    count = max(n.device_count if n.ok and isinstance(n.device_count, int) else 0, listed)
    gone = [(g, lost(g)) for g in n.gpus if lost(g) is not None] if n.ok else []
    healthy = count - len(gone)
    why = "" if n.ok else f" (NVML: {n.error.reason})"
    if gone:
        # A lost GPU is named with why, whatever count was expected: it needs a reset, not a driver install.
        said = "; ".join(f"{gpu_name(g)}: {u.reason}" for g, u in gone)
        first = gone[0][0]
        brief = f"{gpu_name(first)} lost" + (f" (+{len(gone) - 1} more)" if len(gone) > 1 else "")
        of = f" of {expected} expected ({source})" if expected is not None else ""
        return failed(
            f"{len(gone)} GPU(s) lost: {said}; {healthy} GPU(s) answer{of}",
            value=healthy,
            unit="GPUs",
            expected=expected if expected is not None else ">= 1",
            hint=LOST_HINT.format(idx=",".join(str(g.index) for g, _u in gone)),
            brief=brief,
        )
    if expected is None:
        if healthy == 0:
            return failed(
                f"no GPU found{why}; this is a GPU node checker",
                value=0,
                unit="GPUs",
                expected=">= 1",
                hint=(
                    "fix gpu.E001 first; then "
                    if not n.ok
                    else fixes.driver_install(s.system.os_id, s.system.os_version) + "; "
                )
                + fixes.EXPECTED_GPUS,
            )
        return passed(
            f"{healthy} GPU(s) found; expected count unknown",
            value=healthy,
            unit="GPUs",
            hint=fixes.EXPECTED_GPUS,
        )
    if healthy < expected:
        return failed(
            f"{healthy} of {expected} GPUs visible ({source}){why}",
            value=healthy,
            unit="GPUs",
            expected=expected,
            hint="a GPU is missing or fell off the bus: check dmesg for Xid 79 and lspci -d 10de:, reseat or "
            "RMA it; if the driver is missing: " + fixes.driver_install(s.system.os_id, s.system.os_version),
        )
    if healthy > expected:
        return warned(
            f"{healthy} GPUs visible but {expected} expected ({source})",
            value=healthy,
            unit="GPUs",
            expected=expected,
            hint=fixes.EXPECTED_GPUS,
        )
    return passed(f"{healthy} GPU(s), as expected", value=healthy, unit="GPUs", expected=expected)


@check("gpu.E003", "ECC mode", weight=3, needs=("nvml",))
def ecc_mode(s: Any) -> Outcome:
    def judge(g: GpuInfo) -> tuple[Status, str] | None:
        m = _missing(g, g.ecc_current, "ECC mode")
        if m:
            return m
        if not g.ecc_current:
            return Status.WARN, f"GPU {g.index}: ECC disabled"
        if g.ecc_pending is False:
            return Status.WARN, f"GPU {g.index}: ECC will be disabled at next reboot"
        return Status.PASS, f"GPU {g.index}: ECC on"

    return _per_gpu(
        s,
        judge,
        "ECC enabled on all GPUs",
        hint=lambda gs: f"nvidia-smi -i {_idx(gs)} -e 1, then reboot",
        expected="enabled",
    )


@check("gpu.E004", "Uncorrectable ECC errors", weight=10, needs=("nvml",))
def ecc_errors(s: Any) -> Outcome:
    def judge(g: GpuInfo) -> tuple[Status, str] | None:
        m = _missing(g, g.ecc_uncorrected_volatile, "ECC error counters")
        if m:
            return m
        vol = g.ecc_uncorrected_volatile
        agg = g.ecc_uncorrected_aggregate if isinstance(g.ecc_uncorrected_aggregate, int) else 0
        if vol > 0:
            return Status.FAIL, f"GPU {g.index}: {vol} uncorrectable ECC errors since the last reset"
        if agg > 0:
            return Status.WARN, f"GPU {g.index}: {agg} uncorrectable ECC errors in its lifetime (none now)"
        return Status.PASS, f"GPU {g.index}: 0"

    return _per_gpu(
        s,
        judge,
        "no uncorrectable ECC errors",
        hint=lambda gs: fixes.GPU_DRAIN.format(idx=_idx(gs)),
        expected=0,
    )


#: NVML API reference, nvmlDeviceGetRemappedRows: "On MIG-enabled GPUs with active instances, querying the number
#: of remapped rows is not supported"; nvidia-smi then prints [N/A].
MIG_REMAP = (
    "not readable while MIG is on (NVML does not report remapped rows of a MIG GPU with active instances)"
)


@check("gpu.E005", "Row remapping (pending / failed)", weight=10, needs=("nvml",))
def row_remap(s: Any) -> Outcome:
    def judge(g: GpuInfo) -> tuple[Status, str] | None:
        rr = g.remapped_rows
        if isinstance(rr, Unavailable) and rr.kind == NOT_SUPPORTED and mig_on(g):
            return Status.SKIP, f"GPU {g.index}: row remapping {MIG_REMAP}; not judged"
        m = _missing(g, rr, "row remapping")
        if m:
            return m
        try:
            _corr, unc, pending, failure = rr
        except (TypeError, ValueError):
            unc = pending = failure = None
        if not all(isinstance(v, (int, bool)) for v in (unc, pending, failure)):
            return Status.ERROR, f"GPU {g.index}: row remapping state unreadable ({str(rr)[:60]}); not judged"
        if failure:
            return Status.FAIL, f"GPU {g.index}: row remapping FAILED (no spare rows left)"
        if pending:
            reset = (
                "a reset of the whole GPU (its MIG instances destroyed first)" if mig_on(g) else "a GPU reset"
            )
            return Status.FAIL, f"GPU {g.index}: row remap pending ({unc} uncorrectable rows); needs {reset}"
        return Status.PASS, f"GPU {g.index}: none pending"

    def hint(gs: list[GpuInfo]) -> str:
        mig = [g for g in gs if mig_on(g)]
        first = (
            f"MIG is on for GPU {_idx(mig)}: destroy its instances ('nvidia-smi mig -dci -i N', then "
            "'nvidia-smi mig -dgi -i N'); "
            if mig
            else ""
        )
        return (
            f"{first}drain the node and reset the GPU (nvidia-smi -r -i {_idx(gs)}) or reboot to apply the remap; "
            "a failed remap means RMA"
        )

    return _per_gpu(s, judge, "no row remap pending or failed", hint=hint, expected="pending 0, failed 0")


@check("gpu.E006", "Retired pages", weight=5, needs=("nvml",))
def retired_pages(s: Any) -> Outcome:
    limit = _config(s).thresholds.retired_pages_fail

    def judge(g: GpuInfo) -> tuple[Status, str] | None:
        m = _missing(g, g.retired_pages_dbe, "page retirement (GPUs since Ampere use row remapping)")
        if m:
            return m
        total = g.retired_pages_dbe + (g.retired_pages_sbe if isinstance(g.retired_pages_sbe, int) else 0)
        if g.retired_pages_pending is True:
            return Status.FAIL, f"GPU {g.index}: page retirement pending; needs a reboot"
        if total >= limit:
            return Status.FAIL, f"GPU {g.index}: {total} retired pages (RMA threshold {limit})"
        if total > 0:
            return Status.WARN, f"GPU {g.index}: {total} retired pages"
        return Status.PASS, f"GPU {g.index}: 0"

    return _per_gpu(
        s,
        judge,
        "no retired pages",
        hint=lambda gs: "reboot to apply pending retirements; " + fixes.GPU_DRAIN.format(idx=_idx(gs)),
        expected=f"pending none, total < {limit}",
    )


@check("gpu.E007", "PCIe link generation and width", weight=5, needs=("nvml",))
def pcie_link(s: Any) -> Outcome:
    def judge(g: GpuInfo) -> tuple[Status, str] | None:
        for v, what in ((g.pcie_width_current, "PCIe width"), (g.pcie_gen_current, "PCIe generation")):
            m = _missing(g, v, what)
            if m:
                return m
        gen, width = g.pcie_gen_current, g.pcie_width_current
        gmax = g.pcie_gen_max if isinstance(g.pcie_gen_max, int) else gen
        wmax = g.pcie_width_max if isinstance(g.pcie_width_max, int) else width
        if width < wmax:
            return Status.FAIL, f"GPU {g.index}: PCIe x{width}, capable of x{wmax} (link degraded)"
        if gen < gmax:
            return (
                Status.WARN,
                f"GPU {g.index}: PCIe gen{gen} of gen{gmax} (idle power saving, or a degraded link)",
            )
        return Status.PASS, f"GPU {g.index}: gen{gen} x{width}"

    return _per_gpu(
        s,
        judge,
        "all links at their maximum generation and width",
        hint=lambda gs: (
            f"re-check under load (nvidia-smi -q -d PCIE -i {_idx(gs)}); a narrow link means a badly seated GPU, "
            "riser or cable: reseat it; check BIOS PCIe settings"
        ),
        expected="gen = max, width = max",
    )


@check("gpu.E008", "Clock event reasons (throttling)", weight=5, needs=("nvml",))
def clock_reasons(s: Any) -> Outcome:
    def judge(g: GpuInfo) -> tuple[Status, str] | None:
        m = _missing(g, g.clock_event_reasons, "clock event reasons")
        if m:
            return m
        r = int(g.clock_event_reasons)
        names = [name for bit, name in CLOCK_REASON_NAMES.items() if r & bit]
        if r & (CLOCK_HW_SLOWDOWN | CLOCK_HW_THERMAL | CLOCK_HW_POWER_BRAKE):
            return Status.FAIL, f"GPU {g.index}: hardware slowdown active ({', '.join(names)})"
        if r & CLOCK_SW_THERMAL:
            return Status.WARN, f"GPU {g.index}: software thermal slowdown"
        if r & CLOCK_SW_POWER_CAP:
            return Status.PASS, f"GPU {g.index}: at its power cap (normal under load)"
        return Status.PASS, f"GPU {g.index}: none"

    return _per_gpu(
        s,
        judge,
        "no thermal, power-brake or hardware slowdown",
        hint=lambda gs: (
            "check cooling and airflow, the PSU and the power-brake signal of the chassis (BMC logs); "
            f"nvidia-smi -q -d PERFORMANCE -i {_idx(gs)}"
        ),
        expected="no hw_slowdown / hw_thermal / hw_power_brake / sw_thermal",
    )


@check("gpu.E009", "GPU temperature", weight=3, needs=("nvml",))
def temperature(s: Any) -> Outcome:
    th = _config(s).thresholds
    warn_c, fail_c = f"{th.gpu_temp_warn_c:g}", f"{th.gpu_temp_fail_c:g}"
    temps = [
        g.temperature_c
        for g in (s.nvml.gpus if s.nvml and s.nvml.ok else ())
        if isinstance(g.temperature_c, int)
    ]

    def judge(g: GpuInfo) -> tuple[Status, str] | None:
        m = _missing(g, g.temperature_c, "temperature")
        if m:
            return m
        t = g.temperature_c
        if t >= th.gpu_temp_fail_c:
            return Status.FAIL, f"GPU {g.index}: {t} C (>= {fail_c} C)"
        if t >= th.gpu_temp_warn_c:
            return Status.WARN, f"GPU {g.index}: {t} C (>= {warn_c} C)"
        return Status.PASS, f"GPU {g.index}: {t} C"

    return _per_gpu(
        s,
        judge,
        f"all GPUs below {warn_c} C",
        hint=lambda gs: (
            "check fans, airflow and inlet temperature (BMC); an idle GPU this hot has a cooling fault"
        ),
        value=max(temps) if temps else None,
        unit="C",
        expected=f"< {warn_c} (fail at {fail_c})",
    )


@check("gpu.E010", "Persistence mode", weight=2, needs=("nvml",))
def persistence(s: Any) -> Outcome:
    def judge(g: GpuInfo) -> tuple[Status, str] | None:
        m = _missing(g, g.persistence_mode, "persistence mode")
        if m:
            return m
        if not g.persistence_mode:
            return Status.WARN, f"GPU {g.index}: persistence mode off (slow first CUDA init, state lost)"
        return Status.PASS, f"GPU {g.index}: on"

    return _per_gpu(s, judge, "persistence mode on", hint=lambda gs: fixes.PERSISTENCE, expected="on")


#: Hint for XIDs the policy fails: the node needs a reset or service before it takes work.
_HINT_XID_FAIL = (
    "drain the node; look the XIDs up in NVIDIA's XID catalogue; reset or reboot, then run dcgmi diag -r 3; "
    "RMA on repeat"
)
_HINT_XID_WARN = "check which job crashed around those times; not a hardware fault unless it repeats"


def _meaning(policy: Any, xid: int) -> str:
    return (policy.meaning.get(xid, ("",))[0]) or "not in the XID policy"


def _on(pcis: list[str], names: dict[str, str]) -> str:
    """'GPU 3 (0000:a1:00), GPU 0000:b3:00': where the XIDs were, by index where NVML names that address."""
    return ", ".join(names.get(p, f"GPU {p}") for p in pcis)


def _xid_list(xids: list[int], policy: Any, where: dict[int, list[str]], names: dict[str, str]) -> str:
    """'Xid 79 (GPU has fallen off the bus) on GPU 3 (0000:a1:00), ...': each distinct XID with the policy's
    meaning and the GPUs that logged it."""
    return ", ".join(f"Xid {x} ({_meaning(policy, x)}) on {_on(where[x], names)}" for x in xids)


@check("gpu.E011", "XID errors in the kernel log (recent window)", weight=8, needs=("nvml", "system"))
def xid_errors(s: Any) -> Outcome:
    sysm = s.system
    events = sysm.xid_events
    if isinstance(events, Unavailable):
        return skipped(events.reason, hint="run hostcheck as root (or add the user to the adm group)")
    if not events:
        early = _no_gpus(s)
        if early and s.nvml is not None and not s.nvml.ok:
            return early
        return passed(f"no XID events ({sysm.xid_source})", value=0, unit="events", expected=0)
    policy = _config(s).xid
    names: dict[str, str] = {}
    for g in s.nvml.gpus if s.nvml and s.nvml.ok else ():
        if isinstance(g.pci_bus_id, BusId):
            names[g.pci_bus_id.kernel] = f"GPU {g.index} ({g.pci_bus_id.kernel})"
    action = {e.xid: policy.action(e.xid) for e in events}
    where: dict[int, list[str]] = {}
    for e in events:
        if e.pci not in where.setdefault(e.xid, []):
            where[e.xid].append(e.pci)
    by_action: dict[str, list[int]] = {"fail": [], "warn": [], "ignore": []}
    for x in sorted(action):
        by_action[action[x]].append(x)
    details = tuple(
        f"{names.get(e.pci, 'GPU ' + e.pci)}: Xid {e.xid} [{action[e.xid]}] {_meaning(policy, e.xid)}"
        + (f": {e.text}" if e.text else "")
        for e in events
    )
    count = {a: sum(1 for e in events if action[e.xid] == a) for a in by_action}
    kw: dict[str, Any] = {
        "value": len(events),
        "unit": "events",
        "expected": "0 (ignored XIDs aside)",
        "details": details,
    }
    named = {a: _xid_list(xs, policy, where, names) for a, xs in by_action.items()}
    ignored = f"; ignored: {named['ignore']}" if by_action["ignore"] else ""
    src = f"({sysm.xid_source})"
    worst_xids = by_action["fail"] or by_action["warn"]
    if worst_xids:
        # The drain reason: the first XID of the worst kind and the GPU's address, and how many more.
        x = worst_xids[0]
        pairs = sum(len(where[y]) for y in worst_xids)
        kw["brief"] = f"Xid {x} on GPU {where[x][0]}" + (f" and {pairs - 1} more" if pairs > 1 else "")
    if by_action["fail"]:
        also = f"; also {named['warn']}" if by_action["warn"] else ""
        msg = f"{count['fail']} hardware/driver XID event(s) {src}: {named['fail']}{also}{ignored}"
        return failed(msg, hint=_HINT_XID_FAIL, **kw)
    if by_action["warn"]:
        msg = f"{count['warn']} XID event(s) to look at {src}: {named['warn']}{ignored}"
        return warned(msg, hint=_HINT_XID_WARN, **kw)
    return passed(f"{len(events)} XID event(s), all ignored by the XID policy {src}: {named['ignore']}", **kw)


@check("gpu.E012", "Foreign processes on the GPUs", weight=3, needs=("nvml",))
def foreign_processes(s: Any) -> Outcome:
    def judge(g: GpuInfo) -> tuple[Status, str] | None:
        m = _missing(g, g.processes, "process list")
        if m:
            return m
        if g.processes:
            txt = ", ".join(f"{p.name}[{p.pid}]" for p in g.processes)
            return Status.WARN, f"GPU {g.index}: held by {txt}"
        return Status.PASS, f"GPU {g.index}: idle"

    return _per_gpu(
        s,
        judge,
        "no process holds a GPU",
        hint=lambda gs: (
            "stop the listed processes (kill PID, or stop the service that owns it) before training"
        ),
        expected="none",
    )


def _fabric_states(s: Any) -> list[tuple[int, Any]]:
    """(GPU index, (state, status)) for each GPU whose NVML answered the fabric probe."""
    if s.nvml is None or not s.nvml.ok:
        return []
    return [(g.index, g.fabric) for g in s.nvml.gpus if isinstance(g.fabric, tuple)]


@check("gpu.E013", "NVSwitch fabric and Fabric Manager", weight=8, needs=("nvml", "system", "facts"))
def nvswitch_fabric(s: Any) -> Outcome:
    fab = s.system.fabric
    switches = fab.nvswitches if isinstance(fab.nvswitches, tuple) else ()
    want_fm = bool(s.facts.get("gpunode_driver", "fabricmanager")) if s.facts is not None else False
    states = _fabric_states(s)
    pending = [(i, st) for i, (st, _status) in states if st in (FABRIC_NOT_STARTED, FABRIC_IN_PROGRESS)]
    broken = [(i, status) for i, (st, status) in states if st == FABRIC_COMPLETED and status != 0]
    details = tuple(
        f"GPU {i}: fabric {FABRIC_STATE_NAMES.get(st, st)}"
        + (f", status {nvml_return_words(status)}" if st == FABRIC_COMPLETED else "")
        for i, (st, status) in states
    )
    if not switches and not want_fm:
        if pending:
            return warned(
                f"no NVSwitch on the PCI bus, but the fabric probe of GPU {_list(pending)} is not complete",
                details=details,
                hint="in a VM or container the host runs Fabric Manager: check nvidia-fabricmanager there; "
                "CUDA cannot start on these GPUs until the fabric is up",
            )
        why = (
            fab.nvswitches.reason if isinstance(fab.nvswitches, Unavailable) else "no NVSwitch on the PCI bus"
        )
        return skipped(f"{why}: Fabric Manager not needed", details=details)
    where = f"{len(switches)} NVSwitch(es)" if switches else "gpunode_driver.fact fabricmanager: true"
    kw: dict[str, Any] = {
        "details": details,
        "expected": "Fabric Manager = driver version, active; fabric completed",
    }
    in_container = bool(s.system.container)
    problems: list[str] = []
    hint = fixes.FABRICMANAGER
    if not in_container:
        driver = s.nvml.driver_version if s.nvml is not None and s.nvml.ok else s.system.driver_version
        if fab.fm_version is None:
            problems.append("Fabric Manager (nv-fabricmanager) is not installed")
        elif isinstance(fab.fm_version, Unavailable):
            problems.append(f"Fabric Manager version unknown: {fab.fm_version.reason}")
        elif isinstance(driver, str) and fab.fm_version != driver:
            problems.append(f"Fabric Manager {fab.fm_version} but driver {driver}: it refuses to start")
            hint = fixes.FABRICMANAGER_VERSION
        if fab.fm_version is not None and fab.fm_active != "active":
            problems.append(
                f"{FM_SERVICE} is {fab.fm_active or 'unknown'} (enabled: {fab.fm_enabled or 'unknown'})"
            )
    if pending:
        problems.append(
            f"fabric probe {FABRIC_STATE_NAMES[pending[0][1]]} on GPU {_list(pending)}: CUDA waits for it"
        )
    if broken:
        problems.append(
            f"fabric registration failed on GPU {_list(broken)} ({nvml_return_words(broken[0][1])})"
        )
    if problems:
        return failed(f"{where}: " + "; ".join(problems), hint=hint, value=_v(fab.fm_version), **kw)
    done = f"fabric completed on {len(states)} GPU(s)" if states else "fabric state not readable per GPU"
    fm = "Fabric Manager runs on the host" if in_container else f"Fabric Manager {fab.fm_version} active"
    return passed(f"{where}, {fm}, {done}", value=_v(fab.fm_version), **kw)


def _list(pairs: list[tuple[int, Any]]) -> str:
    return ",".join(str(i) for i, _ in pairs)


def _v(v: Any) -> Any:
    return v if isinstance(v, str) else None


@check("gpu.E014", "Driver branch supported by NVIDIA", weight=2, needs=("nvml", "system"))
def driver_branch_lifecycle(s: Any) -> Outcome:
    """The running driver's branch against NVIDIA's lifecycle (platform data, driver_branches): a warning for an
    ended or new-feature branch, with the supported branch to move to and the variable that sets it."""
    early = _no_gpus(s) if s.nvml is None or not s.nvml.ok else None
    version = s.nvml.driver_version if early is None else None
    if early is None and not platform.release_tuple(version if isinstance(version, str) else ""):
        early = skipped("driver version unknown (see gpu.E001)")
    if early:
        return early
    data = platform.load()
    sms = {f"{c[0]}.{c[1]}" for g in s.nvml.gpus if isinstance(c := g.compute_capability, tuple)}
    archs = [a for a in data["archs"].values() if sms & set(a.get("sm", []))]
    row = platform.os_row_for(data, s.system.os_id, s.system.os_version)[1] if s.system else None
    via = "gpunode_driver_source: nvidia and " if platform.default_branch(data, row)[1] == "distro" else ""
    problem, fix = platform.lifecycle_advice(data, version, archs, via=via)
    life = platform.branch_lifecycle(data, version)
    if not life["known"]:
        return skipped(f"driver {version}: {problem}", value=version)
    if problem:
        hint = fixes.role_fix(fix, fixes.DRIVER, "driver") if fix else None
        expected = f"branch {fix.rsplit(' ', 1)[-1]}" if fix else None
        return warned(f"driver {version}: {problem}", value=version, expected=expected, hint=hint)
    until = f", supported to {life['end_of_life']}" if life["end_of_life"] else ""
    return passed(f"driver {version}: NVIDIA {life['type']} branch {life['branch']}{until}", value=version)
