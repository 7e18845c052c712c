"""Pure judging functions for the workload checks: no I/O, no torch, tested from plain numbers.

Every line they judge by is a row of hostcheck/data/thresholds.json (value, unit, basis, source, why), read
through hostcheck/thresholds.py; each function takes the effective lines (``th``: the configuration's
``thresholds``, a site's [thresholds] applied) and defaults to the shipped ones:

- fraction of achievable (matmul, device copy, pinned host<->device): pass at ``achievable_pass_fraction``
  (nccl-tests' 0.9), fail below ``achievable_fail_fraction`` (DCGM's 0.75), warn between;
- PCIe: the pinned copy's achievable figure is ``pinned_copy_efficiency`` x the link's theoretical rate, which
  puts the pass line on Azure HPC health checks' H100 floor (48 GB/s on gen5 x16);
- all_reduce bus bandwidth: fail below Meta GCM's floors (``busbw_floor_nvlink_gbs``/``busbw_floor_pcie_gbs``),
  warn within ``busbw_warn_band`` of them (Azure's band); a SKU line of gpu_skus.json fails only for a message at
  least the line's size;
- plateau sizes (``plateau_*``): a fail measured below them is only a warning (they can only soften a verdict);
- AMP: slower than fp32 fails, under ``amp_speedup_warn`` warns; GradScaler skipping more than
  ``scaler_skipped_warn_fraction`` of the steps warns; DataLoader workers under
  ``dataloader_speedup_warn`` x num_workers=0 warn, with ``dataloader_min_cpus`` CPUs or more.
"""

from __future__ import annotations

import math
from typing import Any

from hostcheck.registry import Status
from hostcheck.thresholds import NodeThresholds

#: The shipped lines (hostcheck/data/thresholds.json); the checks pass their configuration's effective ones.
DEFAULT = NodeThresholds()

#: GB/s per lane after encoding (the PCIe specifications' transfer rates, not a threshold): gen1/2 8b/10b,
#: gen3-5 128b/130b, gen6 PAM4 + FLIT (242/256).
PCIE_GBS_PER_LANE = {
    1: 2.5 * 8 / 10 / 8,
    2: 5.0 * 8 / 10 / 8,
    3: 8.0 * 128 / 130 / 8,
    4: 16.0 * 128 / 130 / 8,
    5: 32.0 * 128 / 130 / 8,
    6: 64.0 * 242 / 256 / 8,
}


def lines(config: Any) -> Any:
    """The effective lines of a configuration (its [thresholds] applied), the shipped ones without one."""
    return getattr(config, "thresholds", None) or DEFAULT


def fraction_status(fraction: float | None, th: Any = DEFAULT) -> Status | None:
    """Fraction of achievable -> pass (>= 0.90), warn (>= 0.75), fail; None when there is no reference."""
    if fraction is None:
        return None
    if fraction >= th.achievable_pass_fraction:
        return Status.PASS
    if fraction >= th.achievable_fail_fraction:
        return Status.WARN
    return Status.FAIL


def judge_fraction(
    measured: float | None, achievable: float | None, estimate: bool = False, th: Any = DEFAULT
):
    """(status, fraction) for a measurement against an achievable figure.

    No reference (unknown SKU, dtype without a fast path) -> (None, None): measured, no verdict.
    A reference that is only an estimate can warn but not fail. A measured, published or site figure (the
    site's own [[gpu_models]] entry in the configuration, which it vouches for) can fail.
    """
    if measured is None or not achievable or achievable <= 0:
        return None, None
    frac = measured / achievable
    status = fraction_status(frac, th)
    if estimate and status == Status.FAIL:
        status = Status.WARN
    return status, frac


def on_plateau(status: Status | None, kind: str, size, th: Any = DEFAULT) -> tuple[Status | None, str]:
    """(status, note): a fail measured below ``kind``'s plateau size (the ``plateau_<kind>`` line: matmul_n,
    pinned_bytes, device_copy_bytes) becomes a warning, with a note saying so; a size that is not recorded counts
    as on the plateau (the probe's defaults are)."""
    least = getattr(th, f"plateau_{kind}")
    if status != Status.FAIL or not isinstance(size, int) or isinstance(size, bool) or size >= least:
        return status, ""
    what = f"n = {size}" if kind == "matmul_n" else f"{size / 2**20:g} MiB"
    return (
        Status.WARN,
        f" ({what} is below the {least if kind == 'matmul_n' else least >> 20} the line needs: a warning only)",
    )


def busbw(algbw: float, n: int) -> float:
    """all_reduce bus bandwidth from algorithm bandwidth: algbw x 2(n-1)/n (nccl-tests' convention)."""
    if n < 1:
        raise ValueError("n must be >= 1")
    return algbw * 2.0 * (n - 1) / n


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (10^9 bytes) for one collective on nbytes taking seconds."""
    if seconds <= 0:
        raise ValueError("seconds must be > 0")
    return nbytes / seconds / 1e9


def pcie_theoretical_gbs(gen: int | None, width: int | None) -> float | None:
    """Theoretical unidirectional PCIe bandwidth, GB/s: per-lane rate of the generation x lanes."""
    if not isinstance(gen, int) or not isinstance(width, int) or gen not in PCIE_GBS_PER_LANE or width <= 0:
        return None
    return PCIE_GBS_PER_LANE[gen] * width


def pinned_achievable_gbs(gen: int | None, width: int | None, th: Any = DEFAULT) -> float | None:
    theo = pcie_theoretical_gbs(gen, width)
    return None if theo is None else theo * th.pinned_copy_efficiency


def busbw_floor(nvlink: bool | None, th: Any = DEFAULT) -> float | None:
    if nvlink is None:
        return None
    return th.busbw_floor_nvlink_gbs if nvlink else th.busbw_floor_pcie_gbs


def busbw_status(
    value: float | None, n: int, nvlink: bool | None, th: Any = DEFAULT, floor_can_fail: bool = True
) -> Status | None:
    """Verdict on an all_reduce busbw (GB/s) within one node; None when there is nothing to judge. A floor the
    GPUs' interconnect is not known to reach (an unknown SKU, or one whose datasheet is below it) only warns."""
    floor = busbw_floor(nvlink, th)
    if value is None or n < 2 or floor is None:
        return None
    if value < floor:
        return Status.FAIL if floor_can_fail else Status.WARN
    if value < floor * th.busbw_warn_band:
        return Status.WARN
    return Status.PASS


def allreduce_status(
    value: float | None,
    nbytes: int | None,
    floor: float | None,
    line_gbs: float | None = None,
    line_bytes: int = 0,
    line_can_fail: bool = False,
    th: Any = DEFAULT,
    floor_can_fail: bool = True,
) -> Status | None:
    """Verdict on an all_reduce busbw (GB/s) against the interconnect's floor and, where the data has one, the
    SKU's line for this GPU count. Below the line fails only for a message at least as large as the line's
    (a smaller one does not reach the plateau: NVIDIA/nccl-tests#212) and a line with a public source;
    otherwise it warns. None when there is nothing to judge."""
    if value is None or (floor is None and line_gbs is None):
        return None
    if floor is not None and value < floor:
        return Status.FAIL if floor_can_fail else Status.WARN
    if line_gbs is not None:
        if value < line_gbs:
            return (
                Status.FAIL if line_can_fail and nbytes is not None and nbytes >= line_bytes else Status.WARN
            )
        # No warn band over the line: 8 x H100's healthy peak (about 480) is within 1.05 x Azure's 460.
        return Status.PASS
    return Status.WARN if floor is not None and value < floor * th.busbw_warn_band else Status.PASS


def amp_speedup_status(speedup: float | None, th: Any = DEFAULT) -> Status | None:
    if speedup is None:
        return None
    if speedup < 1:  # AMP slower than fp32: no speedup at all, not a threshold
        return Status.FAIL
    if speedup < th.amp_speedup_warn:
        return Status.WARN
    return Status.PASS


def scaler_status(skipped: int, steps: int, th: Any = DEFAULT) -> Status:
    """GradScaler health: stuck (every step skipped) fails, more than ``scaler_skipped_warn_fraction`` (half)
    of the steps skipped warns."""
    if steps <= 0:
        return Status.ERROR
    if skipped >= steps:
        return Status.FAIL
    if skipped > steps * th.scaler_skipped_warn_fraction:
        return Status.WARN
    return Status.PASS


def loss_numerics(losses) -> tuple[Status, str]:
    """(status, why) for a short training run's loss curve: every loss finite and the last below the first."""
    vals = [float(x) for x in losses]
    if len(vals) < 2:
        return Status.ERROR, "fewer than two losses recorded"
    bad = [i for i, v in enumerate(vals) if not math.isfinite(v)]
    if bad:
        return Status.FAIL, f"non-finite loss at step {bad[0]}"
    if not vals[-1] < vals[0]:
        return Status.FAIL, f"loss did not fall ({vals[0]:.4g} -> {vals[-1]:.4g})"
    return Status.PASS, f"loss {vals[0]:.4g} -> {vals[-1]:.4g}"


def dataloader_status(
    best_ips: float | None, zero_ips: float | None, cpus: int, th: Any = DEFAULT
) -> Status | None:
    """Workers should beat num_workers=0 by 1.2x when there are at least 4 CPUs (measured on a 2-core VM: 2 workers = 1.56x
    on 2 cores). None when it cannot be judged (too few CPUs to expect a gain)."""
    if not best_ips or not zero_ips:
        return None
    if cpus < th.dataloader_min_cpus:
        return None
    return Status.PASS if best_ips >= th.dataloader_speedup_warn * zero_ips else Status.WARN
