"""Host hardware checks (system.E006-E010): EDAC memory errors, machine checks, tasks stuck in D state, PCIe AER
counters of the GPUs and NICs, and the counter history they compare with. Pure functions of the Snapshot; the
reading is hostcheck.gather.hardware, the thresholds hostcheck/data/thresholds.json (docs/hardware.md)."""

from __future__ import annotations

import re
from typing import Any

from hostcheck.checks.gpu import _config
from hostcheck.gather.base import NO_PERMISSION, NOT_FOUND, Unavailable
from hostcheck.gather.hardware import HardwareSnapshot, blocked_since
from hostcheck.gather.state import FIRST, RESET, RISING, SAME
from hostcheck.registry import Outcome, check, errored, failed, passed, plural, skipped, warned

EDAC_FIX = (
    "find the DIMM with 'ras-mc-ctl --error-count' (rasdaemon) or 'edac-util -v' and the BMC's event log, "
    "drain the node and have the DIMM replaced"
)
AER_FIX = (
    "reseat or replace the device or its riser/cable, check 'lspci -vvv -s <address>' for the link and the "
    "kernel log for 'AER:' lines; drain the node if uncorrectable errors keep coming"
)


_EDAC_MC = re.compile(r"MC\d{1,4}")


def _hw(s: Any) -> HardwareSnapshot | Outcome:
    hw = getattr(s, "hardware", None)
    return hw if isinstance(hw, HardwareSnapshot) else skipped("host hardware not gathered")


def _history_note(hw: HardwareSnapshot) -> str:
    st = hw.state
    if st.read_error is not None:
        return f"no usable history ({st.read_error.reason}): baseline recorded now"
    if not st.previous:
        return "first run: baseline recorded, rises are judged from the next run"
    return ""


def _unavailable(what: str, u: Unavailable) -> Outcome:
    if u.kind == NOT_FOUND:
        return skipped(f"{what}: {u.reason}")
    hint = "run hostcheck as root" if u.kind == NO_PERMISSION else None
    return errored(f"{what} could not be read: {u.reason}", hint=hint)


@check("system.E006", "Memory errors (EDAC, per memory controller)", weight=8, needs=("hardware",))
def edac_errors(s: Any) -> Outcome:
    hw = _hw(s)
    if isinstance(hw, Outcome):
        return hw
    logged = list(hw.edac_ue_lines) if isinstance(hw.edac_ue_lines, tuple) else []
    if logged:
        # EDAC's own report of an uncorrected error, read from the kernel log whether or not its counts are.
        said = f"{len(logged)} uncorrected memory error line(s) in the kernel log ({hw.log_source}): {logged[-1]}"
        counts = [] if isinstance(hw.edac, Unavailable) else [mc for mc in hw.edac if isinstance(mc.ue, int)]
        more = f"; EDAC counts: {', '.join(f'{mc.name} {mc.ue} UE' for mc in counts)}" if counts else ""
        mc = _EDAC_MC.search(logged[-1])
        return failed(
            said + more,
            hint=EDAC_FIX,
            details=tuple(logged[-5:]),
            brief=f"EDAC {mc.group(0) if mc else 'MC'} uncorrected memory error",
        )
    if isinstance(hw.edac, Unavailable):
        return _unavailable("EDAC", hw.edac)
    if not hw.edac:
        return skipped("no memory controller registered with EDAC")
    limit = _config(s).thresholds.edac_ce_rise_warn
    fails, warns, details, unreadable = [], [], [], []
    for mc in hw.edac:
        if not isinstance(mc.ue, int) or not isinstance(mc.ce, int):
            unreadable.append(mc.name)
            details.append(
                f"{mc.name}: counts unreadable ({(mc.ue if isinstance(mc.ue, Unavailable) else mc.ce).reason})"
            )
        if isinstance(mc.ue, int) and mc.ue > 0:
            fails.append(f"{mc.name}: {plural(mc.ue, 'uncorrected memory error')} since boot")
        if not isinstance(mc.ce, int):
            continue
        t = hw.state.trend("edac", f"{mc.name}.ce", mc.ce)
        details.append(_trend_text(f"{mc.name} corrected", t))
        if t.kind == RISING and t.delta >= limit:
            warns.append(
                f"{mc.name}: {plural(t.delta, 'corrected memory error')} since the last run (warn from {limit})"
            )
    note = _history_note(hw)
    if note:
        details.append(note)
    if fails:
        return failed("; ".join(fails + warns), hint=EDAC_FIX, details=tuple(details))
    if warns:
        return warned("; ".join(warns), hint=EDAC_FIX, details=tuple(details))
    read = len(hw.edac) - len(unreadable)
    if not read:
        return skipped(f"EDAC counts unreadable on {', '.join(unreadable)}", details=tuple(details))
    msg = f"{plural(read, 'memory controller')}: no uncorrected errors, corrected not rising"
    if unreadable:
        msg += f" ({', '.join(unreadable)}: counts unreadable, not judged)"
    return passed(msg, details=tuple(details))


def _trend_text(what: str, t: Any) -> str:
    if t.kind == FIRST:
        return f"{what}: {t.value} (baseline)"
    if t.kind == RESET:
        return f"{what}: {t.value}, down from {t.previous} (reset: reboot or driver reload; new baseline)"
    if t.kind == SAME:
        return f"{what}: {t.value} (unchanged)"
    return f"{what}: {t.value} (+{t.delta} since the last run)"


@check("system.E007", "Machine-check events (rasdaemon, kernel log)", weight=5, needs=("hardware",))
def machine_checks(s: Any) -> Outcome:
    hw = _hw(s)
    if isinstance(hw, Outcome):
        return hw
    found, details = [], []
    if isinstance(hw.ras_mce, dict) and hw.ras_mce:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(hw.ras_mce.items()))
        found.append(f"rasdaemon recorded machine checks: {kinds}")
    elif isinstance(hw.ras_mce, Unavailable):
        details.append(f"rasdaemon: {hw.ras_mce.reason}")
    if isinstance(hw.mce_lines, tuple) and hw.mce_lines:
        found.append(f"{plural(len(hw.mce_lines), 'machine-check line')} in the kernel log ({hw.log_source})")
        details.extend(hw.mce_lines[-5:])
    if found:
        return warned(
            "; ".join(found),
            hint="decode them with 'ras-mc-ctl --errors' (rasdaemon) and the BMC's event log; a CPU or DIMM "
            "that keeps reporting needs replacing",
            details=tuple(details),
        )
    if isinstance(hw.mce_lines, Unavailable) and not isinstance(hw.ras_mce, dict):
        return _unavailable("kernel log", hw.mce_lines)
    sources = [hw.log_source] if isinstance(hw.mce_lines, tuple) else []
    if isinstance(hw.ras_mce, dict):
        sources.append("rasdaemon")
    return passed(f"no machine-check events ({', '.join(sources)})", details=tuple(details))


@check("system.E008", "Tasks stuck in D state (uninterruptible)", weight=3, needs=("hardware",))
def stuck_tasks(s: Any) -> Outcome:
    hw = _hw(s)
    if isinstance(hw, Outcome):
        return hw
    if isinstance(hw.blocked, Unavailable):
        return _unavailable("/proc", hw.blocked)
    limit = _config(s).thresholds.dstate_stuck_s
    stuck, details = [], []
    for t in hw.blocked:
        # Found in D by an earlier run with the same context-switch count: never scheduled since then.
        since = blocked_since(hw.state, t)
        blocked = hw.taken_at - since if since is not None else None
        if blocked is not None and blocked >= limit:
            stuck.append(f"{t.comm} (pid {t.pid}, tid {t.tid}) blocked for at least {blocked:.0f} s")
        else:
            details.append(f"{t.comm} (pid {t.pid}, tid {t.tid}) in D state now")
    hung = hw.hung_lines if isinstance(hw.hung_lines, tuple) else ()
    if hung:
        details.extend(hung[-5:])
    if stuck or hung:
        parts = stuck + (
            [f"{plural(len(hung), 'hung-task report')} in the kernel log ({hw.log_source})"] if hung else []
        )
        return warned(
            "; ".join(parts),
            value=len(stuck) + len(hung),
            expected=f"none blocked for {limit:g} s",
            hint="see what they wait on ('cat /proc/<pid>/stack', 'echo w > /proc/sysrq-trigger'); a hung "
            "NFS/Lustre mount or a stuck GPU driver call needs the node drained",
            details=tuple(details),
        )
    msg = f"no task blocked for {limit:g} s"
    if hw.blocked:
        msg += f" ({plural(len(hw.blocked), 'task')} in D state now: judged at the next run)"
    return passed(msg, value=0, details=tuple(details))


@check("system.E009", "PCIe AER errors of the GPUs and NICs", weight=5, needs=("hardware",))
def pcie_aer(s: Any) -> Outcome:
    hw = _hw(s)
    if isinstance(hw, Outcome):
        return hw
    if isinstance(hw.aer, Unavailable):
        return _unavailable("PCI devices", hw.aer)
    devices = [d for d in hw.aer if isinstance(d.totals, dict)]
    unread = [f"{d.kind} {d.address}: {d.totals.reason}" for d in hw.aer if isinstance(d.totals, Unavailable)]
    if not hw.aer:
        return skipped("no GPU or NIC on the PCI bus")
    if not devices:
        why = {d.totals.reason for d in hw.aer if isinstance(d.totals, Unavailable)}
        on = plural(len(hw.aer), "GPU/NIC device")
        return skipped(f"no AER counters on the {on}: {'; '.join(sorted(why))}")
    limit = _config(s).thresholds.aer_correctable_rise_warn
    fails, warns, details = [], [], []
    for d in devices:
        for which in ("fatal", "nonfatal", "correctable"):
            t = hw.state.trend("aer", f"{d.address}.{which}", d.totals[which])
            if t.kind != SAME or t.value:
                details.append(_trend_text(f"{d.kind} {d.address} {which}", t))
            name = f"{d.kind} {d.address}"
            if which != "correctable" and t.kind == RISING:
                fails.append(
                    f"{name}: {plural(t.delta, f'new {which} (uncorrectable) PCIe error')} since the last run"
                )
            elif which != "correctable" and t.kind == FIRST and t.value:
                warns.append(f"{name}: {plural(t.value, f'{which} PCIe error')} since boot (no history yet)")
            elif which == "correctable" and t.kind == RISING and t.delta >= limit:
                warns.append(
                    f"{name}: {plural(t.delta, 'correctable PCIe error')} since the last run (warn from {limit})"
                )
    note = _history_note(hw)
    if note:
        details.append(note)
    if fails:
        return failed("; ".join(fails + warns), hint=AER_FIX, details=tuple(details))
    if warns:
        return warned("; ".join(warns), hint=AER_FIX, details=tuple(details))
    msg = f"{plural(len(devices), 'GPU/NIC device')}: no AER errors rising"
    if unread:
        msg += f" ({len(unread)} without readable counters, not judged)"
    return passed(msg, details=tuple(details + unread))


@check("system.E010", "Counter history for 'rising since the last run'", weight=1, needs=("hardware",))
def counter_history(s: Any) -> Outcome:
    hw = _hw(s)
    if isinstance(hw, Outcome):
        return hw
    st = hw.state
    fix = "give hostcheck a writable state file: --state-file PATH or [hardware] state_file, as root"
    if st.write_error is not None:
        return warned(
            f"this run's counters were not kept ({st.write_error.reason}): rises cannot be judged next time",
            hint=fix,
        )
    if st.read_error is not None:
        return warned(
            f"the last run's counters were unusable ({st.read_error.reason}); baseline recorded now", hint=fix
        )
    if not st.previous:
        return passed(f"first run: baseline recorded in {st.path}")
    elapsed = st.elapsed_s(hw.taken_at)
    ago = f", last run {elapsed:.0f} s ago" if elapsed is not None else ""
    return passed(f"counters kept in {st.path}{ago}")
