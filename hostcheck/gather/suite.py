"""The suite's raw records read once into typed facts: the checks and the report use these, never the records.

A suite section's record is a child's JSON (hostcheck.inside.workload), so nothing in it is trusted: every figure
goes through one reader here (a finite number, else None; an error text; a size), and what the checks judge and
the report publishes come from the same typed rows. Only this module and hostcheck.gather.workload (which plans
the launches from the suite's progress) read the records; tests/unit/test_structure.py holds the checks to it.
Duck-typed over hostcheck.gather.workload.WorkloadRun, which builds each fact once (cached properties).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hostcheck.child.launch import ProbeRun
from hostcheck.gather.base import finite_number


def section(run: ProbeRun | None, name: str) -> tuple[dict | None, str | None]:
    """(data, None) for a suite section that finished, else (None, why not)."""
    if run is None:
        return None, "not run"
    started = False
    for rec in run.records:
        if rec.get("probe") != name:
            continue
        if rec.get("event") == "start":
            started = True
        elif "ok" in rec:
            if rec["ok"]:
                return rec.get("data") or {}, None
            return None, f"{name} probe raised {rec.get('error')}"
    if started:
        return None, f"the probe process {run.error or 'stopped'} during {name}"
    if run.error:
        return None, f"the probe process {run.error} before {name}"
    return None, f"{name} did not run"


def started(run: ProbeRun | None, name: str) -> bool:
    return run is not None and any(r.get("probe") == name and r.get("event") == "start" for r in run.records)


def suite_run_for(run: Any, name: str) -> ProbeRun | None:
    """The suite process that ran (or should have run) section ``name``."""
    if run.suite_rest is not None and not started(run.suite, name):
        return run.suite_rest
    return run.suite


def suite_section(run: Any, name: str) -> tuple[dict | None, str | None]:
    """:func:`section` over the suite and, for what it never started, the re-run of the rest."""
    return section(suite_run_for(run, name), name)


@dataclass(frozen=True)
class DeviceFigures:
    """One CUDA device's measured figures, in base units; a figure the records do not hold as a finite number
    is left out (a hostile or broken child's JSON never becomes a value)."""

    #: The suite's CUDA device index (the report maps it to NVML's through the PCI address).
    index: int
    #: The PCI address the env probe read for it, as the probe gave it; None when it read none.
    pci_bus_id: str | None = None
    #: Matmul throughput per dtype ("bf16", "fp16", "tf32", "fp32"), FLOP/s.
    matmul_flops_per_second: dict[str, float] = field(default_factory=dict)
    #: Copy bandwidth per kind ("h2d_pinned", "d2h_pageable", "device_copy"...), bytes/s.
    copy_bytes_per_second: dict[str, float] = field(default_factory=dict)
    #: The burn-in's figures: burn_median_flops_per_second, burn_min_flops_per_second, burn_result_mismatches.
    quantities: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Measured:
    """One figure of one device as the suite recorded it, in the record's unit (TFLOP/s, GB/s), read once."""

    #: A finite number, else None (absent, text, NaN, a bool, an int beyond any float).
    value: float | None = None
    #: The probe's error text for this figure, when it raised.
    error: str | None = None
    #: False when the probe found the result not finite (matmul); None when it did not say.
    finite: bool | None = None
    #: What it was measured at (matmul: n; copies: bytes), for the plateau rule; None when not recorded.
    size: int | None = None


NO_MEASURE = Measured()


@dataclass(frozen=True)
class DeviceRow:
    """One device's row of a per-device suite section: matmul's figures per dtype, bandwidth's per copy kind."""

    #: The CUDA device index; None for the CPU's row (no CUDA GPU) or a row without one.
    index: int | None
    name: str | None = None
    figures: dict[str, Measured] = field(default_factory=dict)

    def figure(self, key: str) -> Measured:
        return self.figures.get(key, NO_MEASURE)


@dataclass(frozen=True)
class DeviceSection:
    """A per-device suite section (matmul, bandwidth): its rows in the suite's order, or why it has none."""

    rows: tuple[DeviceRow, ...] = ()
    #: Why the section gave no data (not run, raised, the process died); None when it finished.
    error: str | None = None


@dataclass(frozen=True)
class BurnRow:
    """One device's burn-in figures, TFLOP/s, as read once from the burn record."""

    index: int | None = None
    device: str | None = None
    first: float | None = None
    last: float | None = None
    lowest: float | None = None
    median: float | None = None
    #: Results that changed between two runs of the same product, as recorded (an int or float, or None).
    mismatches: float | None = None
    #: False when the probe said the results were not finite, or gave a mismatch count that is no number.
    finite: bool = True
    windows: float | None = None


@dataclass(frozen=True)
class BurnResult:
    """The burn-in's finished record: its length and its rows."""

    seconds: float | None = None
    rows: tuple[BurnRow, ...] = ()


@dataclass(frozen=True)
class SuiteEnv:
    """What the env probe said that the checks use, read once."""

    cuda_available: bool = False
    #: Variables that force TF32 off or on (NVIDIA_TF32_OVERRIDE...), as the probe saw them.
    precision_env: dict[str, Any] = field(default_factory=dict)
    #: CUDA device index -> the PCI address the probe read for it, as it gave it.
    bus_ids: dict[int, str] = field(default_factory=dict)
    #: Why the env probe gave no data; None when it finished.
    error: str | None = None


def _float(v: Any) -> float | None:
    """A finite number as a float, else None (bools, text, NaN, an int beyond any float)."""
    v = finite_number(v, bools=False)
    return None if v is None else float(v)


def _count(v: Any) -> int | None:
    """A whole number a float can hold (an index, a size), else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and finite_number(v) is not None else None


def _device_index(row: Any) -> int | None:
    return _count(row.get("index")) if isinstance(row, dict) else None


def _figure(m: dict, value_key: str, size_key: str) -> Measured:
    finite = m.get("finite")
    return Measured(
        value=_float(m.get(value_key)),
        error=str(m["error"]) if "error" in m else None,
        finite=finite if isinstance(finite, bool) else None,
        size=_count(m.get(size_key)),
    )


#: Per-device section -> (where a row keeps its figures: None for the row itself, value key, size key).
DEVICE_SECTIONS = {"matmul": ("dtypes", "tflops", "n"), "bandwidth": (None, "gbs", "bytes")}


def device_section(run: Any, name: str) -> DeviceSection:
    """A per-device suite section's rows, every figure read once (DEVICE_SECTIONS); rows that are no objects
    are left out."""
    data, err = suite_section(run, name)
    if not isinstance(data, dict):
        return DeviceSection(error=err or f"{name} gave no object")
    inner, value_key, size_key = DEVICE_SECTIONS[name]
    rows = []
    for row in data.get("gpus") if isinstance(data.get("gpus"), list) else ():
        if not isinstance(row, dict):
            continue
        held = row.get(inner) if inner else row
        figures = {
            k: _figure(m, value_key, size_key)
            for k, m in (held.items() if isinstance(held, dict) else ())
            if isinstance(k, str) and isinstance(m, dict)
        }
        label = row.get("name")
        rows.append(DeviceRow(_device_index(row), label if isinstance(label, str) else None, figures))
    return DeviceSection(tuple(rows))


def burn_result(run: Any) -> BurnResult | None:
    """The burn-in's last finished record, read once; None when it did not finish (or was not run)."""
    recs = run.burn.records if run.burn is not None else ()
    rec = next((x for x in reversed(recs) if x.get("probe") == "burn" and x.get("ok")), None)
    if rec is None:
        return None
    data = rec.get("data") if isinstance(rec.get("data"), dict) else {}
    rows = []
    for g in data.get("gpus") if isinstance(data.get("gpus"), list) else ():
        if not isinstance(g, dict):
            continue
        raw = g.get("mismatches")
        mismatches = finite_number(raw, bools=False)
        label = g.get("device")
        rows.append(
            BurnRow(
                index=_device_index(g),
                device=label if isinstance(label, str) else None,
                first=_float(g.get("tflops_first")),
                last=_float(g.get("tflops_last")),
                lowest=_float(g.get("tflops_min")),
                median=_float(g.get("tflops_median")),
                mismatches=mismatches,
                # A count that is no number is no proof of a clean run.
                finite=bool(g.get("finite", True)) and not (raw and mismatches is None),
                windows=finite_number(g.get("windows"), bools=False),
            )
        )
    return BurnResult(seconds=finite_number(data.get("seconds"), bools=False), rows=tuple(rows))


def suite_env(run: Any) -> SuiteEnv:
    data, err = suite_section(run, "env")
    if not isinstance(data, dict):
        return SuiteEnv(error=err)
    found = data.get("precision_env")
    rows = data.get("gpus") if isinstance(data.get("gpus"), list) else []
    buses = {_device_index(r): r.get("pci_bus_id") for r in rows if _device_index(r) is not None}
    return SuiteEnv(
        cuda_available=bool(data.get("cuda_available")),
        precision_env=dict(found) if isinstance(found, dict) else {},
        bus_ids={i: b for i, b in buses.items() if i is not None and isinstance(b, str)},
    )


def device_figures(run: Any) -> tuple[DeviceFigures, ...]:
    """The suite's matmul and bandwidth rows and the burn-in's, per CUDA device, in base units."""
    parts: dict[int, dict[str, dict[str, float]]] = {}

    def slot(index: int, part: str) -> dict[str, float]:
        return parts.setdefault(index, {"quantities": {}, "matmul": {}, "copy": {}})[part]

    for section, part, scale in (("matmul", "matmul", 1e12), ("bandwidth", "copy", 1e9)):
        for row in getattr(run, section).rows:
            for key, fig in row.figures.items() if row.index is not None else ():
                v = finite_number(fig.value, scale=scale)
                if v is not None:
                    slot(row.index, part)[key] = v
    burned = run.burn_result
    for row in burned.rows if burned is not None else ():
        for v, name, scale in (
            (row.median, "burn_median_flops_per_second", 1e12),
            (row.lowest, "burn_min_flops_per_second", 1e12),
            (row.mismatches, "burn_result_mismatches", 1),
        ):
            v = finite_number(v, scale=scale)
            if v is not None and row.index is not None:
                slot(row.index, "quantities")[name] = v
    buses = run.env.bus_ids
    return tuple(
        DeviceFigures(
            index=i,
            pci_bus_id=buses.get(i),
            matmul_flops_per_second=p["matmul"],
            copy_bytes_per_second=p["copy"],
            quantities=p["quantities"],
        )
        for i, p in parts.items()
    )


@dataclass(frozen=True)
class RankResult:
    """One DDP rank's finished record (the DDP check, the all_reduce through the NICs, multi-node), read once."""

    rank: int | None = None
    world: int | None = None
    backend: str | None = None
    allreduce_ok: bool = False
    ddp_ok: bool = False
    #: Shown as recorded (a NaN loss stays NaN: it is what went wrong); None when no number.
    allreduce_value: float | None = None
    ddp_loss: float | None = None
    ddp_param_maxdiff: float | None = None
    init_s: float | None = None
    busbw_gbs: float | None = None
    algbw_gbs: float | None = None
    bw_bytes: int | None = None
    #: Why the bandwidth was not measured, as the rank said.
    bw_skipped: str | None = None


@dataclass(frozen=True)
class RankResults:
    """Every rank's result of one launch, the launch's errors, and whether one hung (rather than crashed)."""

    ranks: tuple[RankResult, ...] = ()
    errors: tuple[str, ...] = ()
    hung: bool = False


def _shown(v: Any) -> float | None:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def rank_result(data: Any) -> RankResult:
    d = data if isinstance(data, dict) else {}
    world = finite_number(d.get("world"), bools=False)
    backend, skipped = d.get("backend"), d.get("bw_skipped")
    return RankResult(
        rank=_count(d.get("rank")),
        world=int(world) if world is not None else None,
        backend=backend if isinstance(backend, str) else None,
        allreduce_ok=bool(d.get("allreduce_ok")),
        ddp_ok=bool(d.get("ddp_ok")),
        allreduce_value=_shown(d.get("allreduce_value")),
        ddp_loss=_shown(d.get("ddp_loss")),
        ddp_param_maxdiff=_shown(d.get("ddp_param_maxdiff")),
        init_s=_shown(d.get("init_s")),
        busbw_gbs=_float(d.get("busbw_gbs")),
        algbw_gbs=_float(d.get("algbw_gbs")),
        bw_bytes=_count(d.get("bw_bytes")),
        bw_skipped=str(skipped) if skipped else None,
    )


def rank_results(runs: tuple) -> RankResults:
    """The results of ranks launched one process each (the DDP check, the all_reduce through the NICs)."""
    ranks, errors, hung = [], [], False
    crashed = any(r.error and not r.timed_out for r in runs)
    for r in runs:
        hung = hung or (r.timed_out and not crashed)  # peers killed after a crash did not hang on their own
        d = next((x for x in reversed(r.records) if x.get("probe") == "ddp_worker" and x.get("ok")), None)
        if d is not None:
            ranks.append(rank_result(d.get("data")))
        if r.error:
            errors.append(f"{r.name}: {r.error}")
    return RankResults(tuple(ranks), tuple(errors), hung)


def ddp_results(run: Any) -> RankResults:
    """The DDP check's ranks, from wherever it ran: in the suite's process, or launched one process per rank."""
    if run.ddp_mode != "in-suite":
        return rank_results(run.ddp)
    data, err = suite_section(run, "ddp")
    if data is None:
        where = suite_run_for(run, "ddp")
        hung = bool(where and where.timed_out and started(where, "ddp"))
        return RankResults(errors=(err or "no result",), hung=hung)
    return RankResults(ranks=(rank_result(data),))


def multinode_results(runs: tuple) -> RankResults:
    """torchrun's local ranks: every finished rank, and why any failed (a rank's own error says why; torchrun's
    only that it failed). ``hung``: torchrun was cut at its deadline."""
    ranks, errors = [], []
    for r in runs:
        ranks += [
            rank_result(x.get("data")) for x in r.records if x.get("probe") == "ddp_worker" and x.get("ok")
        ]
        errors += [
            f"rank error: {x.get('error')}"
            for x in r.records
            if x.get("probe") == "ddp_worker" and x.get("ok") is False
        ]
        if r.error:
            errors.append(r.error)
    return RankResults(tuple(ranks), tuple(errors), any(r.timed_out for r in runs))


@dataclass(frozen=True)
class AmpRun:
    """One model's short training run in one precision mode (AMP section), read once."""

    #: The losses step by step; None when one of them is no number (NaN and inf are numbers: they stay).
    losses: tuple[float, ...] | None = ()
    #: GradScaler's skipped steps and the run's steps, as recorded (None: not recorded as a whole number).
    skipped: int | None = None
    steps: int | None = None
    #: Throughput, in ``unit`` (img/s, seq/s).
    per_s: float | None = None
    unit: str = ""
    error: str | None = None


@dataclass(frozen=True)
class AmpSection:
    """The AMP section: model kind -> precision mode -> its run, or why the section has none."""

    models: dict[str, dict[str, AmpRun]] = field(default_factory=dict)
    device: str | None = None
    #: The CNN's fp32 baseline ran its convolutions in TF32 (torch's default).
    conv_tf32: bool = False
    error: str | None = None


def _losses(v: Any) -> tuple[float, ...] | None:
    if not isinstance(v, list) or not all(_shown(x) is not None for x in v):
        return None
    try:
        return tuple(float(x) for x in v)
    except OverflowError:
        return None


def amp_section(run: Any) -> AmpSection:
    data, err = suite_section(run, "amp")
    if not isinstance(data, dict):
        return AmpSection(error=err or "amp gave no object")
    models: dict[str, dict[str, AmpRun]] = {}
    found = data.get("models")
    for kind, modes in found.items() if isinstance(found, dict) else ():
        for mode, r in modes.items() if isinstance(modes, dict) else ():
            if not isinstance(r, dict):
                continue
            unit = r.get("unit", "")
            models.setdefault(str(kind), {})[str(mode)] = AmpRun(
                losses=_losses(r.get("losses") or []),
                skipped=_count(r.get("skipped")),
                steps=_count(r.get("steps")),
                per_s=_float(r.get("per_s")),
                unit=unit if isinstance(unit, str) else "",
                error=str(r["error"]) if "error" in r else None,
            )
    device = data.get("device")
    return AmpSection(models, device if isinstance(device, str) else None, bool(data.get("conv_tf32")))


@dataclass(frozen=True)
class PeerPair:
    """One ordered GPU pair's copy (p2p section), read once."""

    src: int | None = None
    dst: int | None = None
    gbs: float | None = None
    #: Whether peer access was on (None: not said).
    p2p: bool | None = None
    #: False when the copied bytes were wrong (None: not said).
    ok: bool | None = None
    error: str | None = None


@dataclass(frozen=True)
class PeerCopies:
    """The p2p section: every pair, the GPUs' model names, why it was skipped, or why it has no data."""

    pairs: tuple[PeerPair, ...] = ()
    names: tuple[str, ...] = ()
    skipped: str | None = None
    error: str | None = None


def _flag(v: Any) -> bool | None:
    return v if isinstance(v, bool) else None


def peer_copies(run: Any) -> PeerCopies:
    data, err = suite_section(run, "p2p")
    if not isinstance(data, dict):
        return PeerCopies(error=err or "p2p gave no object")
    if data.get("skipped"):
        return PeerCopies(skipped=str(data["skipped"]))
    found, names = data.get("pairs"), data.get("names")
    pairs = tuple(
        PeerPair(
            src=_count(p.get("src")),
            dst=_count(p.get("dst")),
            gbs=_float(p.get("gbs")),
            p2p=_flag(p.get("p2p")),
            ok=_flag(p.get("ok")),
            error=str(p["error"]) if p.get("error") else None,
        )
        for p in (found if isinstance(found, list) else ())
        if isinstance(p, dict)
    )
    return PeerCopies(
        pairs, tuple(n for n in (names if isinstance(names, list) else ()) if isinstance(n, str))
    )


@dataclass(frozen=True)
class WorkerRun:
    """The DataLoader measured at one worker count, read once."""

    workers: int
    ips: float | None = None
    first_epoch_s: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class DataLoaderSection:
    """The dataloader section: each worker count's run (in worker order) and the probe's choice, or why none."""

    runs: tuple[WorkerRun, ...] = ()
    best_workers: int | None = None
    best_ips: float | None = None
    zero_ips: float | None = None
    pin_memory: bool | None = None
    prefetch_factor: int | None = None
    shm_bytes: int | None = None
    cpus: int | None = None
    crop: int | None = None
    error: str | None = None


def _workers(key: Any) -> int | None:
    try:
        return int(key)
    except (TypeError, ValueError):
        return None


def dataloader_section(run: Any) -> DataLoaderSection:
    data, err = suite_section(run, "dataloader")
    if not isinstance(data, dict):
        return DataLoaderSection(error=err or "dataloader gave no object")
    found = data.get("results")
    runs = []
    for key, r in found.items() if isinstance(found, dict) else ():
        w = _workers(key)
        if w is None or not isinstance(r, dict):
            continue
        runs.append(
            WorkerRun(
                workers=w,
                ips=_float(r.get("ips")),
                first_epoch_s=_float(r.get("first_epoch_s")),
                error=str(r["error"]) if "error" in r else None,
            )
        )
    return DataLoaderSection(
        runs=tuple(sorted(runs, key=lambda r: r.workers)),
        best_workers=_count(data.get("best_workers")),
        best_ips=_float(data.get("best_ips")),
        zero_ips=_float(data.get("zero_ips")),
        pin_memory=_flag(data.get("pin_memory")),
        prefetch_factor=_count(data.get("prefetch_factor")),
        shm_bytes=_count(data.get("shm_bytes")),
        cpus=_count(data.get("cpus")),
        crop=_count(data.get("crop")),
    )
