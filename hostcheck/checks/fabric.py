"""RDMA fabric checks (fabric.E001-E008): ports by role, rates, error counters and link-down events per unit of
time, NIC firmware, GPU-NIC placement in NCCL's words, ACS on the paths between them and the GPUDirect RDMA path.
Pure functions of the Snapshot; the reading is hostcheck.gather.rdma, the roles and expectations
hostcheck.checks.fabric_plan, the thresholds hostcheck/data/thresholds.json, NCCL's configuration fabric.E009
(hostcheck.checks.fabric_nccl). docs/fabric.md says what is judged and from where.

A node without an RDMA device gets skips that say so, never a fail; what could not be read is said, never judged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hostcheck.checks.fabric_plan import (
    MISSING_FIX,
    PORT_FIX,
    Fabric,
    distance_words,
    group,
    missing_rail_lines,
    rdma_of,
    setup,
    up,
    verdict,
    within,
)
from hostcheck.checks.gpu import _config
from hostcheck.config import RAIL
from hostcheck.gather.rdma import (
    ERROR_COUNTERS,
    LINK_DOWNED,
    WINDOW_S,
    RdmaPort,
    RdmaSnapshot,
    per,
    saturated,
)
from hostcheck.gather.rdma_topology import NEAR, PXB
from hostcheck.gather.state import FIRST, RISING, SAME
from hostcheck.registry import Outcome, Status, check, failed, passed, plural, skipped, warned

COUNTER_FIX = (
    "a cable or transceiver is going bad: watch the port's counters ('perfquery -x' or the files under "
    "/sys/class/infiniband/<dev>/ports/<n>/counters/), reseat or replace the cable, drain the node if they keep "
    "rising; a saturated counter is cleared with 'perfquery -R' (or a reboot) so it can count again"
)
#: Each error counter's line (a row of hostcheck/data/thresholds.json), what passing it is, and the unit the line
#: is stated per ("": any rise past the row's count, whatever the time). NVIDIA NVSentinel's NIC health monitor
#: lines where it gives one, Meta GCM's "any rise warns" for the rest.
COUNTER_RULES = {
    "symbol_error": ("rdma_symbol_error_fail_per_h", Status.FAIL, "h"),
    "local_link_integrity_errors": ("rdma_fatal_counter_rise_fail", Status.FAIL, ""),
    "excessive_buffer_overrun_errors": ("rdma_fatal_counter_rise_fail", Status.FAIL, ""),
    "link_error_recovery": ("rdma_link_error_recovery_warn_per_min", Status.WARN, "min"),
    "port_rcv_errors": ("rdma_port_rcv_errors_warn_per_s", Status.WARN, "s"),
    "port_xmit_discards": ("rdma_port_xmit_discards_warn_per_s", Status.WARN, "s"),
    LINK_DOWNED: ("rdma_link_downed_rise_fail", Status.FAIL, ""),
}
OTHER_RULE = ("rdma_error_rise_warn", Status.WARN, "")
RISING_ERRORS = tuple(c for c in ERROR_COUNTERS if c != LINK_DOWNED)
#: NCCL_NET_GDR_LEVEL when unset: NCCL uses GPUDirect RDMA up to PXB (src/graph/paths.cc, ncclTopoCheckGdr).
GDR_DEFAULT = PXB


def _down_what(p: RdmaPort) -> str:
    return f"state {p.state or '?'}, physical state {p.phys_state or '?'}"


# long: the port findings (down, link layer, class counts, the baseline's missing ports, missing rails) in one pass
@check("fabric.E001", "RDMA ports up and present, by role (rails vs the rest)", weight=8, needs=("rdma",))
def ports_up(s: Any) -> Outcome:
    f = setup(s)
    if isinstance(f, Outcome):
        return f
    ports = f.ports
    fails: list[tuple[str, str]] = []
    warns: list[tuple[str, str]] = []
    briefs: list[str] = []
    notes: list[str] = []
    unread = [p for p in ports if not p.state or not p.phys_state]
    missing_device = False
    for p in ports:
        key, role = (p.device, p.port), f.role(p.device)
        want = f.want.get(key)
        if p in unread:
            continue
        if not up(p):
            what = _down_what(p)
            if (want and want.up and not want.unsure) or (want is None and role == RAIL):
                fails.append((what, p.name + f.rail_of(p.device)))
                briefs.append(f"{p.short} {p.state or 'down'}/{p.phys_state or '?'}")
            elif (want and want.up) or (want is None and role is None):
                why = "no GPU PCI path read: not known to be a rail" if role is None else want.source
                warns.append((f"{what} ({why})", p.name))
                briefs.append(f"{p.short} {p.state or 'down'}/{p.phys_state or '?'}")
            else:
                notes.append(f"{p.name}: {what} (not a rail, nothing expects it up: not judged)")
        if want and want.link_layer and p.link_layer and p.link_layer != want.link_layer:
            what = f"link layer {p.link_layer}, expected {want.link_layer} ({want.source})"
            (warns if want.unsure else fails).append((what, p.name))
            briefs.append(f"{p.short} {p.link_layer}, not {want.link_layer}")
    # Rails on another link layer than most rails, where nothing sets one: a warning only.
    if f.rail_set is not None:
        rail_ports = [p for p in ports if p.device in f.rail_set and p.link_layer]
        layers = [p.link_layer for p in rail_ports]
        common = max(set(layers), key=layers.count) if layers else ""
        for p in rail_ports:
            want = f.want.get((p.device, p.port))
            if p.link_layer != common and not (want and want.link_layer):
                warns.append((f"link layer {p.link_layer}, the other rails {common}", p.name))
                briefs.append(f"{p.short} {p.link_layer}, rails {common}")
    lines_f, lines_w = group(fails), group(warns)
    # The baseline's ports that are gone, with the GPU each served.
    present = {f"{p.device}:{p.port}" for p in ports}
    for name, _rate, _layer, gpu, _dist in f.baseline_rows().values():
        if name not in present:
            served = f", the rail of {f.gpu(gpu)}" if gpu else ""
            lines_f.append(f"{name} missing (in the baseline{served})")
            briefs.append(f"{name} missing" + (f" ({f.gpu_short(gpu)} rail)" if gpu else ""))
            missing_device = True
    # Each class's count; the rails' shortfall named by the GPUs left without one.
    gone = missing_rail_lines(f)
    for k in f.settings.classes():
        if k.count is None:
            continue
        have = [p for p in ports if f.klass.get((p.device, p.port)) == k]
        if len(have) < k.count:
            named = [line for line, _p in gone] if k.role == RAIL else []
            literal = [d for d in k.devices if not any(c in d for c in "*?[")]
            absent = sorted(set(literal) - {p.device for p in have})
            said = named + [f"{d} absent" for d in absent]
            lines_f.append(
                f"{len(have)} of "
                + plural(k.count, f"'{k.name}' port")
                + (": " + "; ".join(said) if said else "")
            )
            if named:
                lead = f"{f.gpu_short(gone[0][1].gpu)} rail missing, "
            else:
                lead = f"{absent[0]} absent, " if absent else ""
            briefs.append(f"{lead}{len(have)}/{k.count} {k.name}")
            missing_device = True
        elif len(have) > k.count:
            lines_w.append(plural(len(have), f"'{k.name}' port") + f", more than the {k.count} expected")
            briefs.append(f"{len(have)} {k.name} ports, {k.count} expected")
    counted = any(k.count is not None and k.role == RAIL for k in f.settings.classes())
    if gone and not counted and not f.baseline_rows():
        # Nothing says how many rails: a GPU without one while the others have theirs is still worth a word.
        for line, p in gone:
            lines_w.append(line + ": a rail NIC missing?")
            briefs.append(f"{f.gpu_short(p.gpu)}: no rail NIC within PXB")
            missing_device = True
    # Devices or ports past the reader's caps, or whose reading failed: the ports judged are not all there are.
    for line in f.r.unread:
        lines_w.append(line)
        briefs.append(line[:60])
    details = tuple(notes + [f"{p.name}: state not readable, not judged" for p in unread])
    hint = "; ".join(h for h, on in ((MISSING_FIX, missing_device), (PORT_FIX, True)) if on)
    if not lines_f and not lines_w and unread and len(unread) == len(ports):
        return skipped(f"no RDMA port state readable ({plural(len(ports), 'port')})", details=details)
    layers = sorted({p.link_layer for p in ports if p.link_layer})
    up_count = sum(1 for p in ports if up(p))
    ok = f"{up_count} of {plural(len(ports), 'RDMA port')} ACTIVE/LinkUp ({', '.join(layers) or 'link layer unknown'})"
    if f.rail_set is not None:
        ok += f"; {sum(1 for p in ports if p.device in f.rail_set)} on GPU rails"
    if len(ports) - up_count - len(unread):
        ok += "; the others are not rails and nothing expects them up"
    return verdict(lines_f, lines_w, briefs, ok, hint, value=len(ports), details=details)


@check(
    "fabric.E002",
    "RDMA port rate (each port against its expectation, else its peers)",
    weight=5,
    needs=("rdma",),
)
def port_rate(s: Any) -> Outcome:
    f = setup(s)
    if isinstance(f, Outcome):
        return f
    live = [p for p in f.ports if up(p)]
    unread = [f"{p.name}: rate unreadable ({p.rate_text or 'empty'})" for p in live if p.rate_gbps is None]
    rated = [p for p in live if p.rate_gbps is not None]
    if not rated:
        return skipped("no active port with a readable rate", details=tuple(unread))
    details = tuple(f"{p.name}: {p.rate_text}" for p in rated) + tuple(unread)
    fails, warns, briefs = [], [], []
    judged = set()
    for p in rated:
        want = f.want.get((p.device, p.port))
        if want and want.rate_gbps:
            judged.add(p.name)
            if p.rate_gbps < want.rate_gbps:
                what = f"at {p.rate_gbps:g} Gb/s, expected {want.rate_gbps:g} ({want.source})"
                (warns if want.unsure else fails).append((what, p.name))
                briefs.append(f"{p.short} at {p.rate_gbps:g} Gb/s of {want.rate_gbps:g}")
    # Peers: ports nothing sets a rate for, of one NIC model, link layer and role (a front-end NIC is no peer).
    board = {d.name: d.board_id for d in f.r.devices}
    free = [p for p in rated if p.name not in judged]
    peer_key = {p.name: (p.link_layer, board.get(p.device, ""), f.role(p.device)) for p in free}
    for key in sorted(set(peer_key.values()), key=str):
        peers = [p for p in free if peer_key[p.name] == key]
        top = max(p.rate_gbps for p in peers)
        for p in peers:
            if p.rate_gbps < top:
                warns.append(
                    (f"at {p.rate_gbps:g} Gb/s, its peers at {top:g} (no expected rate set)", p.name)
                )
                briefs.append(f"{p.short} at {p.rate_gbps:g} Gb/s, peers {top:g}")
    hint = (
        "the link trained below its speed: " + PORT_FIX + "; [fabric] or the baseline sets the expected rate"
    )
    ok = f"{plural(len(rated), 'active port')}: {len(judged)} at their expected rate"
    if len(judged) < len(rated):
        ok += f", {len(rated) - len(judged)} at their peers' rate (nothing sets theirs)"
    kw = {"unit": "Gb/s", "value": min(p.rate_gbps for p in rated), "details": details}
    return verdict(group(fails), group(warns), briefs, ok, hint, **kw)


def _history(r: RdmaSnapshot) -> Outcome | None:
    st = r.state
    if st.read_error is not None:
        return skipped(f"no usable history ({st.read_error.reason}): the counters were recorded now")
    if "rdma" not in st.previous:
        return skipped("first run: the counters were recorded; they are judged from the next run on")
    return None


def _dur(seconds: float) -> str:
    for unit in ("h", "min"):
        if seconds >= WINDOW_S[unit]:
            return f"{seconds / WINDOW_S[unit]:.3g} {unit}"
    return f"{seconds:.3g} s"


# long: one pass over every port's counters, each against its own line, unit and saturation
def _counter_findings(f: Fabric, names: tuple[str, ...], s: Any) -> Outcome:
    r = f.r
    th = _config(s).thresholds
    elapsed = r.state.elapsed_s(r.taken_at, "rdma")
    fails: list[tuple[str, str]] = []
    warns: list[tuple[str, str]] = []
    briefs: list[str] = []
    notes: list[str] = []
    judged = 0
    unread = [p for p in f.ports if p.counters_unread]
    for p in f.ports:
        if p in unread:
            continue
        judged += 1
        for k in names:
            if k not in p.counters:
                continue
            t = r.state.trend("rdma", f"{p.device}:{p.port}.{k}", p.counters[k])
            full = saturated(k, t.value)
            if full and t.kind == SAME:
                notes.append(
                    f"{p.name}: {k} saturated at {t.value}: it cannot rise, so its events are not judged"
                )
                continue
            if t.kind == FIRST and t.value:
                notes.append(f"{p.name}: {k} {t.value} since the counters were cleared (recorded now)")
            if t.kind != RISING:
                continue
            row, severity, unit = COUNTER_RULES.get(k, OTHER_RULE)
            line = getattr(th, row)
            sat = f", now saturated at {t.value}: at least that many" if full else ""
            if unit and elapsed is None:
                notes.append(
                    f"{p.name}: {k} +{t.delta}{sat}; rate not judged (the last reading's time unknown)"
                )
                continue
            span = f" in {_dur(elapsed)}" if elapsed is not None else ""
            hourly = f"{per(t.delta, elapsed, 'h'):.3g}/h" if elapsed is not None else "rate unknown"
            if unit:
                rate = per(t.delta, elapsed, unit)
                over = rate > line
                said = f"{k} +{t.delta}{span}{sat}: {rate:.3g}/{unit}"
                said += f" ({hourly})" if unit != "h" else ""
                said += f", line {line:g}/{unit}"
                if elapsed < WINDOW_S[unit]:
                    said += f" (counted over a whole {unit})"
                brief = f"{p.short} {k} {rate:.3g}/{unit}"
            else:
                over = t.delta >= line
                said = f"{k} +{t.delta}{span}{sat} ({hourly}), line {line} new"
                brief = f"{p.short} {k} +{t.delta} ({hourly})"
            if over:
                (fails if severity is Status.FAIL else warns).append((said, p.name))
                briefs.append(brief)
            else:
                notes.append(f"{p.name}: {said}: below the line")
    details = tuple(notes + [f"{p.name}: no counter read ({p.counters_unread}), not judged" for p in unread])
    if not judged:
        why = unread[0].counters_unread if unread else "no port"
        return skipped(
            f"no error counter readable on any of {plural(len(f.ports), 'port')} ({why})", details=details
        )
    history = _history(r)
    if history is not None:
        return dataclasses.replace(history, details=details)
    period = f" over {_dur(elapsed)}" if elapsed is not None else ""
    ok = f"{plural(judged, 'port')}{period}: no counter past its line"
    if unread:
        ok += f" ({plural(len(unread), 'port')} without readable counters, not judged)"
    return verdict(group(fails), group(warns), briefs, ok, COUNTER_FIX, details=details)


@check("fabric.E003", "RDMA port error counters per unit of time", weight=5, needs=("rdma",))
def port_errors(s: Any) -> Outcome:
    f = setup(s)
    return f if isinstance(f, Outcome) else _counter_findings(f, RISING_ERRORS, s)


@check("fabric.E004", "RDMA link-down events since the last run", weight=5, needs=("rdma",))
def link_downed(s: Any) -> Outcome:
    f = setup(s)
    return f if isinstance(f, Outcome) else _counter_findings(f, (LINK_DOWNED,), s)


@check("fabric.E005", "NIC firmware the same on every NIC of a model", weight=2, needs=("rdma",))
def firmware(s: Any) -> Outcome:
    r = rdma_of(s)
    if isinstance(r, Outcome):
        return r
    by_board: dict[str, dict[str, list[str]]] = {}
    for d in r.devices:
        if d.fw_ver:
            by_board.setdefault(d.board_id or "?", {}).setdefault(d.fw_ver, []).append(d.name)
    drift, briefs = [], []
    for board, versions in sorted(by_board.items()):
        if len(versions) > 1:
            common = max(versions, key=lambda v: len(versions[v]))
            odd = [(v, n) for v, n in sorted(versions.items()) if v != common]
            said = "; ".join(f"{', '.join(n)} at {v}" for v, n in odd)
            drift.append(f"{said} (the other {board} NICs at {common})")
            briefs.append(f"{odd[0][1][0]} fw {odd[0][0]}, others {common}")
    if drift:
        return warned(
            "firmware drift: " + "; ".join(drift),
            brief=briefs[0],
            hint="flash every NIC of a model to the same firmware ('mlxfwmanager --query', then the site's image)",
        )
    if not by_board:
        return skipped("no NIC firmware version readable (fw_ver)")
    return passed("; ".join(f"{board}: {next(iter(v))}" for board, v in sorted(by_board.items())))


@check("fabric.E006", "Each GPU's rail NIC near it (NCCL's PCIe distance)", weight=3, needs=("rdma",))
def placement(s: Any) -> Outcome:
    f = setup(s)
    if isinstance(f, Outcome):
        return f
    if not f.r.gpus:
        return skipped("no GPU with a readable PCI path on this node")
    if not f.r.nics:
        return skipped("no RDMA NIC with a readable PCI path on this node")
    details = [
        f"{f.gpu(p.gpu)}: {p.nic or 'no NIC'} {p.level}{' (shared)' if p.shared else ''}" for p in f.pairs
    ]
    gone = {p.gpu for _line, p in missing_rail_lines(f)}
    expected = f.settings.max_distance
    topo = [(st, src) for st, src, used in f.r.nccl.settings("NCCL_TOPO_FILE") if used and st.value]
    by_nic = {row[0].split(":")[0]: row for row in f.baseline_rows().values() if row[4]}
    fails, warns, briefs = [], [], []
    for p in f.pairs:
        if not p.nic or p.gpu in gone:  # a missing rail is fabric.E001's
            continue
        row = by_nic.get(p.nic)
        limit, whence = (row[4], "the baseline") if row else (expected, "[fabric] max_distance")
        said = distance_words(f, p)
        if limit and not within(p.level, limit):
            fails.append(f"{said}; {whence} expects {limit} or nearer")
            briefs.append(f"{f.gpu_short(p.gpu)}-{p.nic} {p.level} (want {limit})")
        elif not limit and p.level not in NEAR and topo:
            details.append(f"{said}: not judged (NCCL_TOPO_FILE)")
        elif not limit and p.level not in NEAR:
            warns.append(f"{said}; NCCL uses GPUDirect RDMA up to {GDR_DEFAULT} by default")
            briefs.append(f"{f.gpu_short(p.gpu)}-{p.nic} {p.level}")
    hint = (
        "GPUDirect RDMA wants the GPU and its NIC under one PCIe switch (PIX/PXB); NCCL stages through the CPU "
        "beyond NCCL_NET_GDR_LEVEL (PXB by default): put the NIC in the slot the board's manual pairs with the "
        "GPU, check the BIOS's PCIe bifurcation, or set [fabric] max_distance where this layout is by design"
    )
    if topo and not fails and not warns and any(d.endswith("(NCCL_TOPO_FILE)") for d in details):
        st, src = topo[0]
        return skipped(
            f"NCCL_TOPO_FILE={st.value[:80]} ({src.where(st)}): NCCL takes the PCIe topology from that file, not "
            "from sysfs (a VM shows no switches); distances beyond PXB are judged only against [fabric] "
            "max_distance or a baseline",
            details=tuple(details),
        )
    ok = f"{plural(len(f.pairs), 'GPU')}, each with a NIC within {expected or GDR_DEFAULT}"
    if gone:
        ok += f" ({len(gone)} without a rail: fabric.E001)"
    return verdict(fails, warns, briefs, ok, hint, details=tuple(details))


@check("fabric.E007", "ACS off on the GPU-NIC PCIe paths", weight=5, needs=("rdma",))
def acs_off(s: Any) -> Outcome:
    f = setup(s)
    if isinstance(f, Outcome):
        return f
    pairs = [p for p in f.pairs if p.nic and within(p.level, "PHB")]
    if not pairs:
        return skipped("no GPU-NIC pair on this node")
    on, briefs, unread = [], [], set()
    for p in pairs:
        for b in p.bridges:
            acs = f.r.acs.get(b)
            if acs is None or acs.enabled is None:
                unread.add(f"{b}: {acs.why if acs else 'not read'}")
            elif acs.enabled:
                on.append(f"bridge {b} between {f.gpu(p.gpu)} and {p.nic}: ACSCtl {'+ '.join(acs.enabled)}+")
                briefs.append(f"ACS on {b} ({f.gpu_short(p.gpu)}-{p.nic})")
    if on:
        return failed(
            "; ".join(dict.fromkeys(on)),
            brief=briefs[0],
            hint="ACS redirects GPU-NIC traffic through the CPU's root complex: disable it in the BIOS (ACS / "
            "PCIe isolation) or at boot ('setpci -s <bridge> ECAP_ACS+0x6.w=0000'), as NCCL's troubleshooting "
            "guide says",
        )
    if unread:
        return skipped(
            f"ACS not readable on {plural(len(unread), 'bridge')} (run as root)",
            details=tuple(sorted(unread)),
        )
    return passed(f"ACS off on every bridge between {plural(len(pairs), 'GPU')} and the NICs")


@check("fabric.E008", "GPUDirect RDMA path (nvidia-peermem or DMA-BUF)", weight=5, needs=("rdma",))
def gpudirect(s: Any) -> Outcome:
    r = rdma_of(s)
    if isinstance(r, Outcome):
        return r
    if not r.gpus:
        return skipped("no GPU with a readable PCI path on this node: GPUDirect RDMA not judged")
    gd = r.gpudirect
    if gd.peermem:
        return passed(f"{gd.peermem} loaded: the NICs reach GPU memory (peer memory)")
    if gd.open_modules:
        return passed("NVIDIA's open kernel modules: GPU memory registers with the NICs through DMA-BUF")
    if gd.open_modules is None:
        return skipped("NVIDIA kernel module not loaded: GPUDirect RDMA not judged")
    return failed(
        f"no GPUDirect RDMA path: neither nvidia-peermem loaded nor the open kernel modules (DMA-BUF) with "
        f"{plural(len(r.gpus), 'GPU')} and {plural(len(r.devices), 'RDMA device')}: NCCL stages every transfer "
        "through host memory",
        brief=f"no GPUDirect path ({len(r.gpus)} GPUs, no peermem/DMA-BUF)",
        hint="install NVIDIA's open kernel modules (DMA-BUF, NVIDIA's recommendation) or load nvidia-peermem "
        "('modprobe nvidia-peermem', and list it in /etc/modules-load.d)",
    )
