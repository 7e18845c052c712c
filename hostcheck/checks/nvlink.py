"""NVLink checks (nvlink.E001-E004), per link through NVML: every link up, each at its speed and version, the
topology complete (every GPU reaches every NVSwitch, or its peers both ways on a board without one), and no error
counter rising since the last run. Messages name the GPU's index and UUID and the link number. Pure functions of
the Snapshot (docs/fabric.md, "NVLink").

What is expected depends on how the SKU's links are wired (hostcheck/data/gpu_skus.json, ``nvlink``): an SXM part
has every link up; an H100 NVL about 12 up to the card bridged to it, of the 18 NVML lists (an estimate: fewer
warn; none up is a card without its bridge, not judged); a PCIe card has none unless an NVLink bridge is fitted,
and NVML then answers every link it lists as down, the card's healthy state (NVIDIA/NVSentinel#1481 on A100
PCIe). An unknown SKU is compared with the node's other GPUs of its name only.

MIG: with MIG mode on, NVML reports a GPU's NVLinks as down, and the links of the other GPUs to it: DCGM treats
such links as disabled, not down (dcgmlib/src/DcgmTopology.cpp UpdateNvLinkLinkStateFromNvml, and
modules/health/DcgmHealthWatch.cpp MonitorNVLinkStatus: "Bug 200682374 - NVML reports links to MIG enabled GPUs
as down"). hostcheck does not judge them either, and says so."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from hostcheck.checks.gpu import _config, _missing, _per_gpu, mig_on
from hostcheck.checks.workload.sku import nvlink_line
from hostcheck.gather.base import NOT_SUPPORTED, Unavailable
from hostcheck.gather.hardware import HardwareSnapshot
from hostcheck.gather.nvml import NVLINK_COUNTERS, GpuInfo, NvLink, nvlink_key
from hostcheck.gather.state import FIRST, RESET, RISING
from hostcheck.registry import Outcome, Status, check, skipped

#: nvmlNvlinkVersion_t (nvml.h): what nvmlDeviceGetNvLinkVersion answers is this enum, not the generation.
NVLINK_VERSIONS = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0"}
#: nvmlIntNvLinkDeviceType_t (nvml.h)
REMOTE_GPU, REMOTE_SWITCH = 0, 2
#: Links named one by one in a message; the rest are counted.
NAMED = 6

Judged = tuple[Status, str]


def _gpu(g: GpuInfo) -> str:
    return f"GPU {g.index} ({g.uuid})" if isinstance(g.uuid, str) else f"GPU {g.index}"


#: Why a MIG GPU's NVLinks are not judged.
MIG_WHY = (
    "MIG mode is on: NVML then reports its NVLinks as down (DCGM treats them as disabled, NVIDIA bug 200682374); "
    "links not judged"
)


def _links(g: GpuInfo) -> Judged | tuple[NvLink, ...]:
    """The GPU's links, or the verdict when there are none to judge."""
    v = g.nvlinks
    if mig_on(g):
        return Status.SKIP, f"{_gpu(g)}: {MIG_WHY}"
    if v is None:
        return Status.SKIP, f"{_gpu(g)}: NVLinks not read (nvidia-smi fallback: install nvidia-ml-py)"
    m = _missing(g, v, "NVLink state")
    if m:
        return m
    if not v:
        return Status.SKIP, f"{_gpu(g)}: no NVLink (a PCIe card, or NVML reports none on this GPU)"
    return v


def _nodes_gpus(s: Any) -> list[GpuInfo]:
    return list(s.nvml.gpus) if s.nvml is not None and s.nvml.ok else []


def _names(links: list[int]) -> str:
    shown = ", ".join(str(n) for n in links[:NAMED])
    return shown + (f" and {len(links) - NAMED} more" if len(links) > NAMED else "")


def _version(v: int) -> str:
    return f"{v} (NVLink {NVLINK_VERSIONS[v]})" if v in NVLINK_VERSIONS else str(v)


def _ids(gs: list[GpuInfo]) -> str:
    return ",".join(str(g.index) for g in gs) or "N"


def _each_gpu(s: Any, judge: Callable[[GpuInfo, tuple[NvLink, ...]], Judged], *a: Any, **kw: Any) -> Outcome:
    def one(g: GpuInfo) -> Judged | None:
        links = _links(g)
        return judge(g, links) if isinstance(links[0], NvLink) else links  # type: ignore[arg-type]

    return _per_gpu(s, one, *a, **kw)


@check("nvlink.E001", "Every NVLink up", weight=8, needs=("nvml",))
def links_up(s: Any) -> Outcome:
    gpus = _nodes_gpus(s)
    mig = [g for g in gpus if mig_on(g)]
    # Peers for a SKU without a line: the most links up on a GPU of the same name on this node.
    most: dict[Any, int] = {}
    for g in gpus:
        if isinstance(g.nvlinks, tuple) and not mig_on(g):
            n = sum(lk.active is True for lk in g.nvlinks)
            most[g.name] = max(most.get(g.name, 0), n)

    def judge(g: GpuInfo, links: tuple[NvLink, ...]) -> Judged:
        line = nvlink_line(g.name if isinstance(g.name, str) else None)
        up = [lk.link for lk in links if lk.active is True]
        down = [lk.link for lk in links if lk.active is not True]
        if down and mig:
            # Links to a MIG GPU read as down too (DCGM's workaround applies while any GPU has MIG on).
            return (
                Status.SKIP,
                f"{_gpu(g)}: {len(up)} up, link {_names(down)} down, not judged: MIG mode is on for GPU "
                f"{_ids(mig)}, and NVML then reports links as down (NVIDIA bug 200682374)",
            )
        if line is not None and line.form == "pcie":
            if not up:
                return (
                    Status.SKIP,
                    f"{_gpu(g)}: a PCIe card without an NVLink bridge: none expected (NVML lists {len(links)} "
                    "links, down, as it does without a bridge); not judged",
                )
            if down:
                return (
                    Status.WARN,
                    f"{_gpu(g)}: NVLink bridge seen ({len(up)} links up) but link {_names(down)} down: a bridge "
                    "missing or unseated (no public line says how many a bridged card has)",
                )
            return Status.PASS, f"{_gpu(g)}: NVLink bridge: all {len(up)} links up"
        if line is not None and line.form == "nvl" and not up:
            return (
                Status.SKIP,
                f"{_gpu(g)}: no NVLink up: a card without its NVLink bridge (NVML lists {len(links)} links, down); "
                "not judged",
            )
        if line is not None:
            if len(up) < line.links:
                text = f"{_gpu(g)}: {len(up)} of {line.links} NVLinks up"
                if down:
                    text += f"; link {_names(down)} down"
                if len(links) < line.links:
                    text += f"; NVML lists {len(links)} links"
                if line.links_estimate:
                    # No document states the count: below an estimate only warns.
                    return (
                        Status.WARN,
                        text + f" ({line.links} is an estimate for {line.sku}: warns, never fails)",
                    )
                return Status.FAIL, text
            return Status.PASS, f"{_gpu(g)}: {len(up)} of {line.links} NVLinks up"
        peers = most.get(g.name, 0)
        if not up and not peers:
            return (
                Status.SKIP,
                f"{_gpu(g)}: no NVLink up here and no line for {g.name} (an unknown SKU) says how many it should "
                f"have: not judged (NVML lists {len(links)} links, down)",
            )
        if len(up) < peers:
            return (
                Status.WARN,
                f"{_gpu(g)}: {len(up)} NVLinks up, link {_names(down)} down, where another {g.name} of this node "
                f"has {peers} (an unknown SKU: compared with its peers only)",
            )
        return Status.PASS, f"{_gpu(g)}: all {len(up)} NVLinks that its peers have up"

    return _each_gpu(
        s,
        judge,
        "every NVLink up",
        hint=lambda gs: (
            f"'nvidia-smi nvlink --status -i {_ids(gs)}' lists the links; check the Fabric Manager (gpu.E013), then "
            f"reset the GPU ('nvidia-smi -r -i {_ids(gs)}' with nothing running on it) or reboot; a link still down "
            "needs the GPU or baseboard serviced (NVIDIA's recommended action: drain, reset the GPU, restart the OS, "
            "then service); on a PCIe card, reseat its NVLink bridge"
        ),
    )


def _common(values: list[int]) -> int | None:
    """The value most links have (the larger one on a tie), or None."""
    if not values:
        return None
    counts = Counter(values)
    return max(counts, key=lambda v: (counts[v], v))


@check("nvlink.E002", "NVLinks at their speed and version", weight=5, needs=("nvml",))
def links_speed(s: Any) -> Outcome:
    gpus = [
        g for g in (s.nvml.gpus if s.nvml is not None and s.nvml.ok else ()) if isinstance(g.nvlinks, tuple)
    ]
    # Per model: the speed and version most active links of the node have (judged where no SKU line says).
    speeds: dict[Any, list[int]] = {}
    versions: dict[Any, list[int]] = {}
    for g in gpus:
        for lk in g.nvlinks:
            if lk.active is True and isinstance(lk.speed_mbps, int):
                speeds.setdefault(g.name, []).append(lk.speed_mbps)
            if lk.active is True and isinstance(lk.version, int):
                versions.setdefault(g.name, []).append(lk.version)

    def judge(g: GpuInfo, links: tuple[NvLink, ...]) -> Judged:
        line = nvlink_line(g.name if isinstance(g.name, str) else None)
        active = [lk for lk in links if lk.active is True]
        if not active:
            return Status.SKIP, f"{_gpu(g)}: no NVLink up (nvlink.E001)"
        sku_speed = line.link_mbps if line is not None else None
        want = sku_speed if sku_speed else _common(speeds.get(g.name, []))
        can_fail = bool(sku_speed) and line is not None and not line.link_mbps_estimate
        ver = _common(versions.get(g.name, []))
        slow = [lk for lk in active if isinstance(lk.speed_mbps, int) and want and lk.speed_mbps < want]
        odd = [lk for lk in active if isinstance(lk.version, int) and ver is not None and lk.version != ver]
        read = [lk for lk in active if isinstance(lk.speed_mbps, int) or isinstance(lk.version, int)]
        if not read:
            why = active[0].speed_mbps
            reason = why.reason if isinstance(why, Unavailable) else "not answered"
            kind = (
                Status.SKIP if not isinstance(why, Unavailable) or why.kind == NOT_SUPPORTED else Status.ERROR
            )
            return kind, f"{_gpu(g)}: NVLink speed and version not read ({reason})"
        parts, status = [], Status.PASS
        if slow:
            basis = (
                "NVIDIA's figure for the SKU"
                if can_fail
                else "an estimate for the SKU: warns, never fails"
                if sku_speed
                else "the node's other links"
            )
            parts.append(
                "; ".join(f"link {lk.link} at {lk.speed_mbps} MB/s" for lk in slow[:NAMED])
                + f" (expected {want} MB/s, {basis})"
            )
            status = Status.FAIL if can_fail else Status.WARN
        if odd:
            parts.append(
                "; ".join(f"link {lk.link} at NVML version {_version(lk.version)}" for lk in odd[:NAMED])
                + f" (the node's other links: {_version(ver)})"
            )
            status = Status.FAIL if status is Status.FAIL else Status.WARN
        if parts:
            return status, f"{_gpu(g)}: " + "; ".join(parts)
        got = sorted({lk.speed_mbps for lk in active if isinstance(lk.speed_mbps, int)})
        spd = "/".join(map(str, got)) + " MB/s" if got else "speed not read"
        return (
            Status.PASS,
            f"{_gpu(g)}: {len(active)} links at {spd}, NVML version {_version(ver) if ver else '?'}",
        )

    return _each_gpu(
        s,
        judge,
        "every active NVLink at its speed and version",
        hint=lambda gs: (
            f"a link that trained below its speed or version carries less: 'nvidia-smi nvlink --status -i {_ids(gs)}' "
            "shows each link's speed; reset the GPU or reboot so the links train again; if it stays, service the "
            "GPU or baseboard"
        ),
    )


def _listed_switches(s: Any) -> set[str]:
    """The NVSwitches the PCI bus lists (hostcheck.gather.fabric), or an empty set."""
    listed = getattr(getattr(getattr(s, "system", None), "fabric", None), "nvswitches", None)
    return set(listed) if isinstance(listed, tuple) else set()


@check("nvlink.E003", "NVLink topology complete", weight=5, needs=("nvml", "system"))
def topology(s: Any) -> Outcome:
    gpus = [
        g for g in (s.nvml.gpus if s.nvml is not None and s.nvml.ok else ()) if isinstance(g.nvlinks, tuple)
    ]
    listed = _listed_switches(s)
    buses = {g.pci_bus_id: g for g in gpus if isinstance(g.pci_bus_id, str)}

    def kind(lk: NvLink) -> int | None:
        """What the link reaches: NVML's answer, else what the remote address is on this node."""
        if isinstance(lk.remote_type, int):
            return lk.remote_type
        if lk.remote_bus_id in listed:
            return REMOTE_SWITCH
        return REMOTE_GPU if lk.remote_bus_id in buses else None

    def up(g: GpuInfo) -> list[NvLink]:
        return [lk for lk in g.nvlinks if lk.active is True and isinstance(lk.remote_bus_id, str)]

    switches = listed or {lk.remote_bus_id for g in gpus for lk in up(g) if kind(lk) == REMOTE_SWITCH}
    where = "the PCI bus" if listed else "the GPUs' links"

    def peers(g: GpuInfo) -> Counter:
        return Counter(lk.remote_bus_id for lk in up(g) if kind(lk) == REMOTE_GPU)

    def judge(g: GpuInfo, links: tuple[NvLink, ...]) -> Judged:
        active = [lk for lk in links if lk.active is True]
        if not active:
            return Status.SKIP, f"{_gpu(g)}: no NVLink up (nvlink.E001)"
        known = [lk for lk in up(g) if kind(lk) is not None]
        if not known:
            why = next(
                (
                    v
                    for lk in active
                    for v in (lk.remote_bus_id, lk.remote_type)
                    if isinstance(v, Unavailable)
                ),
                None,
            )
            if why is not None and why.kind != NOT_SUPPORTED:
                return Status.ERROR, f"{_gpu(g)}: remote ends not read ({why.reason})"
            reason = why.reason if why is not None else "unknown device types"
            return Status.SKIP, f"{_gpu(g)}: remote ends of its NVLinks not known ({reason})"
        if switches:
            reach = {lk.remote_bus_id for lk in known if kind(lk) == REMOTE_SWITCH}
            missing = sorted(switches - reach)
            stray = sorted(
                f"link {lk.link} -> {lk.remote_bus_id}"
                for lk in known
                if kind(lk) == REMOTE_SWITCH and lk.remote_bus_id not in switches
            )
            if missing:
                return (
                    Status.FAIL,
                    f"{_gpu(g)}: reaches {len(reach & switches)} of the {len(switches)} NVSwitches; none of its "
                    f"links reaches {', '.join(missing)}",
                )
            if stray:
                return Status.WARN, f"{_gpu(g)}: {'; '.join(stray)}: not an NVSwitch of this node ({where})"
            return Status.PASS, f"{_gpu(g)}: reaches all {len(switches)} NVSwitches"
        # No NVSwitch: a direct mesh. Every peer is a GPU of this node with as many links back.
        mine = peers(g)
        if not mine:
            return Status.WARN, f"{_gpu(g)}: {len(active)} links up but none reaches a GPU or an NVSwitch"
        wrong = []
        for bus, n in sorted(mine.items()):
            other = buses.get(bus)
            back = peers(other).get(g.pci_bus_id, 0) if other is not None else 0
            if other is None:
                wrong.append(f"{n} link(s) to {bus}, not a GPU of this node")
            elif back != n:
                wrong.append(f"{n} link(s) to GPU {other.index}, which has {back} back")
        if wrong:
            return Status.WARN, f"{_gpu(g)}: " + "; ".join(wrong)
        listing = ", ".join(f"GPU {buses[b].index} x{n}" for b, n in sorted(mine.items()))
        return Status.PASS, f"{_gpu(g)}: {listing}"

    return _each_gpu(
        s,
        judge,
        "every GPU reaches every NVSwitch" if switches else "every NVLink peer links back",
        hint=lambda gs: (
            "a GPU that misses an NVSwitch or a peer has lost links or trained them wrong: compare "
            f"'nvidia-smi nvlink -R -i {_ids(gs)}' and 'nvidia-smi topo -m' with the board's layout, read the "
            "Fabric Manager log, then reset the GPUs or reboot; if it stays, service the baseboard"
        ),
    )


@check("nvlink.E004", "NVLink error counters not rising", weight=5, needs=("nvml", "hardware"))
def errors_rising(s: Any) -> Outcome:
    hw = getattr(s, "hardware", None)
    if not isinstance(hw, HardwareSnapshot):
        return skipped("host hardware (the counter history) not gathered")
    t = _config(s).thresholds
    elapsed = hw.state.elapsed_s(hw.taken_at)

    def judge(g: GpuInfo, links: tuple[NvLink, ...]) -> Judged:
        if not isinstance(g.uuid, str):
            return Status.SKIP, f"{_gpu(g)}: no UUID to keep its counters under"
        read = [lk for lk in links if lk.counters()]
        if not read:
            why = links[0].replay
            reason = why.reason if isinstance(why, Unavailable) else "not answered"
            st = (
                Status.SKIP if not isinstance(why, Unavailable) or why.kind == NOT_SUPPORTED else Status.ERROR
            )
            return st, f"{_gpu(g)}: NVLink error counters not read ({reason})"
        bad, worst, baseline = [], Status.PASS, False
        for lk in read:
            for name, value in lk.counters().items():
                tr = hw.state.trend("nvlink", nvlink_key(g.uuid, lk.link, name), value)
                baseline |= tr.kind in (FIRST, RESET)
                if tr.kind != RISING:
                    continue
                what = name.replace("_", " ").replace("crc", "CRC")
                if name in ("replay", "recovery"):
                    limit = t.nvlink_replay_rise_fail if name == "replay" else t.nvlink_recovery_rise_fail
                    if tr.delta >= limit:
                        bad.append(f"link {lk.link} +{tr.delta} {what} errors")
                        worst = Status.FAIL
                    continue
                rate = tr.delta / max(elapsed or 0.0, 1.0) if elapsed is not None else None
                if rate is not None and rate >= t.nvlink_crc_rate_fail_per_s:
                    bad.append(f"link {lk.link} +{tr.delta} {what} errors ({rate:.0f}/s)")
                    worst = Status.FAIL
                elif tr.delta >= t.nvlink_crc_rise_warn:
                    bad.append(f"link {lk.link} +{tr.delta} {what} errors")
                    worst = Status.FAIL if worst is Status.FAIL else Status.WARN
        if bad:
            more = f" and {len(bad) - NAMED} more" if len(bad) > NAMED else ""
            return worst, f"{_gpu(g)}: " + "; ".join(bad[:NAMED]) + more + " since the last run"
        if baseline:
            return Status.PASS, f"{_gpu(g)}: {len(read)} links' counters recorded (baseline)"
        return Status.PASS, f"{_gpu(g)}: {len(read)} links, no error counter rising"

    return _each_gpu(
        s,
        judge,
        "no NVLink error counter rising since the last run",
        hint=lambda gs: (
            f"'nvidia-smi nvlink -e -i {_ids(gs)}' shows the counters; replay and recovery errors mean the link "
            "retried or retrained (DCGM's NVLink health watch fails on them): drain the node, reset the GPU, and if "
            "the counters keep rising, service the GPU or baseboard"
        ),
        expected=(
            f"replay < {t.nvlink_replay_rise_fail}, recovery < {t.nvlink_recovery_rise_fail}, "
            f"CRC < {t.nvlink_crc_rise_warn} per link per run"
        ),
    )


__all__ = ["NVLINK_COUNTERS", "NVLINK_VERSIONS", "errors_rising", "links_speed", "links_up", "topology"]
