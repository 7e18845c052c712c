"""Workload checks of one GPU's speed: matmul throughput per dtype, host<->device and device memory bandwidth.

Each is judged against what a healthy GPU of its SKU achieves (sku.py: the site's ``[[gpu_models]]`` first,
then the built-in table) or what its PCIe link carries (judge.py), GPU by GPU; the slowest GPU is the
check's value.
"""

from __future__ import annotations

from typing import Any

from hostcheck.checks.workload import grading
from hostcheck.checks.workload import peers as P
from hostcheck.checks.workload import sku as S
from hostcheck.checks.workload.common import _f, gpu_for, link_int, verdict_or_skip, workload_check
from hostcheck.gather.suite import DeviceRow
from hostcheck.gather.workload import WorkloadRun
from hostcheck.registry import Outcome, Status

_HINT_MATMUL = (
    "look for throttling (nvidia-smi -q -d PERFORMANCE: power cap, thermal, HW slowdown), a lowered power "
    "limit or application clocks, other processes on the GPU, and ECC/row-remap events; re-measure with "
    "benchmarks/matmul_h2d_long_vs_short.py"
)
_HINT_COPY = (
    "check for throttling and other processes on the GPU; compare nvidia-smi -q -d CLOCK memory clocks"
)


def _tolerance(config: Any) -> float:
    t = getattr(config, "thresholds", None)
    return float(getattr(t, "gpu_peer_tolerance", 0.1))


def _peers(by_gpu: dict, details: list[str], lines: dict, unit: str, config: Any) -> list[str]:
    """Fail statuses for the GPUs more than the tolerance below their node's other GPUs, whatever their SKU's
    line says (DCGM's and gpu-fryer's peer rule); each one's detail line (``lines``: GPU -> position in
    ``details``) says how far below."""
    tol = _tolerance(config)
    slow = P.below_peers(by_gpu, tol)
    for i, r in slow.items():
        said = P.peer_detail(by_gpu[i], r, unit, tol)
        if i in lines:
            details[lines[i]] += f"; {said}"
        else:
            details.append(f"GPU {i}: {by_gpu[i]:.4g} {unit} = {said}")
    return [Status.FAIL] * len(slow)


def _basis(fig: Any) -> str:
    """A figure's basis as the report says it: an estimate says it warns only."""
    return "an estimate: warns, never fails" if fig.basis == S.ESTIMATE else fig.basis


def _soft(fig: Any, frac: float | None, th: Any) -> bool:
    """True where a figure below the fail line only warned because its line is an estimate."""
    return fig.basis == S.ESTIMATE and frac is not None and frac < th.achievable_fail_fraction


def _no_line(name: Any, what: str) -> str:
    """Why a GPU has no line: an unknown SKU (compared with its peers only), or a dtype its SKU has no figure for."""
    if S.lookup(name) is None:
        return f"unknown SKU {name!r}: no line of its own, compared with the node's other GPUs only"
    return f"no {what} figure for this SKU: compared with the node's other GPUs only"


def _precision_env(run: WorkloadRun) -> str:
    """Variables that force TF32 off (NVIDIA_TF32_OVERRIDE=0) or on for fp32, as the env probe saw them."""
    found = run.env.precision_env
    return ", ".join(f"{k}={v}" for k, v in sorted(found.items()))


def _matmul(run: WorkloadRun, on_gpu: bool, dt: str, config: Any) -> Outcome:
    measured = run.matmul
    if measured.error is not None:
        return _f(Status.ERROR, f"matmul not measured: {measured.error}")
    rows = measured.rows
    if not on_gpu:
        v = rows[0].figure(dt).value if rows else None
        msg = "no CUDA GPU: " + (f"{dt} matmul on the CPU {v:.3g} TFLOP/s, no verdict" if v else "skipped")
        return _f(Status.SKIP, msg, value=v, unit="TFLOP/s")
    statuses, details, values, expected = [], [], [], None
    errors = []
    by_gpu: dict = {}
    lines: dict = {}
    softened = False
    for row in rows:
        m = row.figure(dt)
        name = row.name
        if m.error is not None:
            errors.append(f"GPU {row.index}: {m.error}")
            statuses.append(Status.ERROR)
            continue
        v = m.value
        if v is None:
            continue
        values.append(v)
        by_gpu[row.index] = v
        lines[row.index] = len(details)
        if m.finite is False:
            statuses.append(Status.FAIL)
            details.append(f"GPU {row.index} {name}: {v:.1f} TFLOP/s but the result is not finite")
            continue
        fig = S.matmul_figure(name, dt, config)
        th = grading.lines(config)
        st, frac = grading.judge_fraction(
            v, fig.value if fig else None, fig.basis == S.ESTIMATE if fig else False, th
        )
        st, note = grading.on_plateau(st, "matmul_n", m.size, th)
        statuses.append(st)
        if fig:
            expected = f">= {th.achievable_pass_fraction * fig.value:.0f} ({th.achievable_pass_fraction:.0%} of {fig.value:g} achievable, {_basis(fig)})"
            softened |= _soft(fig, frac, th)
            details.append(
                f"GPU {row.index} {name}: {v:.1f} TFLOP/s = {frac:.0%} of {fig.value:g} ({_basis(fig)}: "
                f"{fig.source})" + note
            )
        else:
            details.append(f"GPU {row.index} {name}: {v:.1f} TFLOP/s ({_no_line(name, dt)})")
    slow = _peers(by_gpu, details, lines, "TFLOP/s", config)
    statuses += slow
    status = verdict_or_skip(statuses)
    worst_v = min(values) if values else None
    if errors and not values:
        return _f(Status.ERROR, "; ".join(errors)[:500], details=tuple(details))
    if status == Status.SKIP:
        msg = (
            f"{dt} matmul {worst_v:.1f} TFLOP/s measured; no line for this SKU or dtype, no verdict "
            "beyond the comparison with the node's other GPUs"
            if worst_v
            else f"{dt} matmul not measured"
        )
    else:
        msg = f"{dt} matmul {worst_v:.1f} TFLOP/s on the slowest GPU ({len(values)} measured)"
    if slow:
        msg += f"; {len(slow)} GPU(s) more than {_tolerance(config):.0%} below their peers' median"
    if softened:
        msg += f"; far below its SKU's {dt} figure, which is only an estimate: a warning, not a fail"
    hint = _HINT_MATMUL if status in (Status.WARN, Status.FAIL) else None
    forced = _precision_env(run)
    if hint and forced and dt in ("tf32", "fp32"):
        hint = f"{forced} is set in the training environment and changes what {dt} runs; " + hint
    return _f(
        status, msg, value=worst_v, unit="TFLOP/s", expected=expected, hint=hint, details=tuple(details)
    )


@workload_check("workload.E001", "Matmul throughput, bf16", 2.0, "matmul", reads_config=True)
def matmul_bf16(run: WorkloadRun, gpus: list, on_gpu: bool, config: Any) -> Outcome:
    return _matmul(run, on_gpu, "bf16", config)


@workload_check("workload.E002", "Matmul throughput, fp16", 1.0, "matmul", reads_config=True)
def matmul_fp16(run: WorkloadRun, gpus: list, on_gpu: bool, config: Any) -> Outcome:
    return _matmul(run, on_gpu, "fp16", config)


@workload_check("workload.E003", "Matmul throughput, tf32", 1.0, "matmul", reads_config=True)
def matmul_tf32(run: WorkloadRun, gpus: list, on_gpu: bool, config: Any) -> Outcome:
    return _matmul(run, on_gpu, "tf32", config)


@workload_check("workload.E004", "Matmul throughput, fp32", 0.5, "matmul", reads_config=True)
def matmul_fp32(run: WorkloadRun, gpus: list, on_gpu: bool, config: Any) -> Outcome:
    return _matmul(run, on_gpu, "fp32", config)


# ------------------------------------------------------------------------------------------ bandwidth


def _pcie_desc(gpu: Any) -> str:
    if gpu is None:
        return "link unknown"
    gen, width = link_int(gpu, "pcie_gen_current"), link_int(gpu, "pcie_width_current")
    gmax, wmax = link_int(gpu, "pcie_gen_max"), link_int(gpu, "pcie_width_max")
    cur = f"gen{gen} x{width}" if gen else "?"
    mx = f"gen{gmax} x{wmax}" if gmax else "?"
    return f"link {cur} now, {mx} max"


def _pcie_hint(gpu: Any) -> str:
    parts = []
    width, wmax = link_int(gpu, "pcie_width_current"), link_int(gpu, "pcie_width_max")
    if width and wmax and width < wmax:
        parts.append(
            f"the link trained at x{width} of x{wmax}: reseat the GPU or riser, check the slot and BIOS "
            "bifurcation"
        )
    else:
        parts.append("check the link width (nvidia-smi -q -d PCIE; lspci -vv LnkSta vs LnkCap)")
    parts.append("IOMMU translation (try iommu=pt on the kernel command line)")
    node = link_int(gpu, "numa_node")
    numa = f" {node}" if node is not None else ""
    parts.append(f"NUMA placement (run on the GPU's node{numa}: numactl --cpunodebind=N --membind=N)")
    return "; ".join(parts)


def _link_rates(gpu: Any, th: Any = grading.DEFAULT) -> tuple[float | None, float | None]:
    """(theoretical, achievable pinned) GB/s of a GPU's PCIe link at its maximum generation and width."""
    gen, width = link_int(gpu, "pcie_gen_max"), link_int(gpu, "pcie_width_max")
    return grading.pcie_theoretical_gbs(gen, width), grading.pinned_achievable_gbs(gen, width, th)


def _bandwidth_rows(run: WorkloadRun, on_gpu: bool) -> tuple[tuple[DeviceRow, ...], Outcome | None]:
    """The bandwidth section's per-GPU rows, or the outcome when there is nothing to judge."""
    measured = run.bandwidth
    if measured.error is not None:
        return (), _f(Status.ERROR, f"bandwidth not measured: {measured.error}")
    if not on_gpu:
        return (), _f(Status.SKIP, "no CUDA GPU: nothing to measure")
    return measured.rows, None


def _pinned(run: WorkloadRun, gpus: list, on_gpu: bool, key: str, config: Any = None) -> Outcome:
    rows, early = _bandwidth_rows(run, on_gpu)
    if early is not None:
        return early
    statuses, details, values = [], [], []
    by_gpu: dict = {}
    lines: dict = {}
    hint, expected = None, None
    for row in rows:
        m = row.figure(key)
        gpu = gpu_for(gpus, row.index)
        if m.error is not None:
            statuses.append(Status.ERROR)
            details.append(f"GPU {row.index}: {m.error}")
            continue
        v = m.value
        if v is None:
            continue
        values.append(v)
        by_gpu[row.index] = v
        lines[row.index] = len(details)
        th = grading.lines(config)
        theo, ach = _link_rates(gpu, th)
        st, _ = grading.judge_fraction(v, ach, th=th)
        st, note = grading.on_plateau(st, "pinned_bytes", m.size, th)
        statuses.append(st)
        if ach and theo:
            expected = (
                f">= {th.achievable_pass_fraction * ach:.1f} ({th.achievable_pass_fraction:.0%} of {ach:.1f} = "
                f"{th.pinned_copy_efficiency:g} x {theo:.1f} theoretical)"
            )
            details.append(
                f"GPU {row.index}: {v:.1f} GB/s = {v / theo:.0%} of {theo:.1f} GB/s ({_pcie_desc(gpu)})"
                + note
            )
            if st in (Status.WARN, Status.FAIL) and hint is None:
                hint = _pcie_hint(gpu)
        else:
            details.append(f"GPU {row.index}: {v:.1f} GB/s (PCIe link unknown: no verdict)")
    slow = _peers(by_gpu, details, lines, "GB/s", config)
    statuses += slow
    if slow and hint is None:
        first = next(iter(P.below_peers(by_gpu, _tolerance(config))))
        hint = _pcie_hint(gpu_for(gpus, first))
    status = verdict_or_skip(statuses)
    worst_v = min(values) if values else None
    what = "host-to-device" if key.startswith("h2d") else "device-to-host"
    if worst_v is None:
        msg = f"{what} pinned not measured"
    elif status == Status.SKIP:
        msg = f"{what} pinned {worst_v:.1f} GB/s; PCIe link unknown (NVML), no verdict"
    else:
        msg = f"{what} pinned {worst_v:.1f} GB/s on the slowest GPU"
    if slow:
        msg += f"; {len(slow)} GPU(s) more than {_tolerance(config):.0%} below their peers' median"
    return _f(status, msg, value=worst_v, unit="GB/s", expected=expected, hint=hint, details=tuple(details))


@workload_check("workload.E005", "Host-to-device bandwidth, pinned", 1.0, "bandwidth", reads_config=True)
def h2d_pinned(run: WorkloadRun, gpus: list, on_gpu: bool, config: Any) -> Outcome:
    return _pinned(run, gpus, on_gpu, "h2d_pinned", config)


@workload_check("workload.E006", "Device-to-host bandwidth, pinned", 1.0, "bandwidth", reads_config=True)
def d2h_pinned(run: WorkloadRun, gpus: list, on_gpu: bool, config: Any) -> Outcome:
    return _pinned(run, gpus, on_gpu, "d2h_pinned", config)


@workload_check("workload.E007", "Host<->device bandwidth, pageable", 0.5, "bandwidth", reads_config=True)
def pageable(run: WorkloadRun, gpus: list, on_gpu: bool, config: Any = None) -> Outcome:
    th = grading.lines(config)
    rows, early = _bandwidth_rows(run, on_gpu)
    if early is not None:
        return early
    statuses, details, values = [], [], []
    for row in rows:
        theo, _ = _link_rates(gpu_for(gpus, row.index))
        for key in ("h2d_pageable", "d2h_pageable"):
            m = row.figure(key)
            v = m.value
            if v is None:
                if m.error is not None:
                    statuses.append(Status.ERROR)
                    details.append(f"GPU {row.index} {key}: {m.error}")
                continue
            values.append(v)
            pinned = row.figure(key.replace("pageable", "pinned")).value
            ratio = f", {v / pinned:.0%} of pinned" if pinned else ""
            details.append(f"GPU {row.index} {key}: {v:.1f} GB/s{ratio}")
            if theo:
                statuses.append(Status.WARN if v < th.pageable_warn_fraction * theo else Status.PASS)
    status = verdict_or_skip(statuses)
    worst_v = min(values) if values else None
    return _f(
        status,
        f"pageable copies {worst_v:.1f} GB/s at the slowest (pinned memory is the fast path: "
        "DataLoader(pin_memory=True))"
        if worst_v
        else "pageable copies not measured",
        value=worst_v,
        unit="GB/s",
        expected=f">= {th.pageable_warn_fraction:.0%} of the link's theoretical rate",
        hint="pageable copies are staged by one CPU thread: check memory bandwidth, NUMA placement and "
        "transparent hugepages"
        if status == Status.WARN
        else None,
        details=tuple(details),
    )


@workload_check("workload.E008", "Device memory bandwidth", 1.0, "bandwidth", reads_config=True)
def device_copy(run: WorkloadRun, gpus: list, on_gpu: bool, config: Any) -> Outcome:
    rows, early = _bandwidth_rows(run, on_gpu)
    if early is not None:
        return early
    statuses, details, values, expected = [], [], [], None
    by_gpu: dict = {}
    lines: dict = {}
    softened = False
    for row in rows:
        m = row.figure("device_copy")
        if m.error is not None:
            statuses.append(Status.ERROR)
            details.append(f"GPU {row.index}: {m.error}")
            continue
        v = m.value
        if v is None:
            continue
        values.append(v)
        by_gpu[row.index] = v
        lines[row.index] = len(details)
        fig = S.copy_figure(row.name, config)
        th = grading.lines(config)
        st, frac = grading.judge_fraction(
            v, fig.value if fig else None, bool(fig and fig.basis == S.ESTIMATE), th
        )
        st, note = grading.on_plateau(st, "device_copy_bytes", m.size, th)
        statuses.append(st)
        if fig:
            expected = f">= {th.achievable_pass_fraction * fig.value:.0f} ({th.achievable_pass_fraction:.0%} of {fig.value:g} GB/s, {_basis(fig)})"
            softened |= _soft(fig, frac, th)
            details.append(
                f"GPU {row.index} {row.name}: {v:.0f} GB/s = {frac:.0%} ({_basis(fig)}: {fig.source})" + note
            )
        else:
            details.append(f"GPU {row.index} {row.name}: {v:.0f} GB/s ({_no_line(row.name, 'copy')})")
    slow = _peers(by_gpu, details, lines, "GB/s", config)
    statuses += slow
    status = verdict_or_skip(statuses)
    worst_v = min(values) if values else None
    msg = f"device copy {worst_v:.0f} GB/s (read + write) on the slowest GPU" if worst_v else "not measured"
    if slow:
        msg += f"; {len(slow)} GPU(s) more than {_tolerance(config):.0%} below their peers' median"
    if softened:
        msg += "; far below its SKU's copy figure, which is only an estimate: a warning, not a fail"
    return _f(
        status,
        msg,
        value=worst_v,
        unit="GB/s",
        expected=expected,
        hint=_HINT_COPY if status in (Status.WARN, Status.FAIL) else None,
        details=tuple(details),
    )
