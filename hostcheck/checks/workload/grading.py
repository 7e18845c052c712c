"""Pure judging functions for the workload checks: no I/O, no torch, tested from plain numbers.

Thresholds and where they come from:

- Fraction of achievable (matmul, device copy, pinned host<->device): pass at or above 0.90, warn from
  0.75, fail below. nccl-tests fails when busbw is below 0.9 x NCCL_TESTS_MIN_BW (NVIDIA/nccl-tests);
  DCGM's diagnostic sets its memory bandwidth floor at 0.75 x measured (its per-SKU limits: H100 80GB HBM3
  1,905,000 MB/s).
- PCIe: theoretical per-lane GB/s after line encoding; pinned copies reach about 0.85 of it (the
  reference H100 node: 54 GB/s pinned on gen5 x16 = 63.0 GB/s theoretical, 0.857), so the achievable
  pinned figure is 0.85 x theoretical and the pass line 0.90 x 0.85 = 0.765 x theoretical = 48.2 GB/s on
  gen5 x16, which is Azure HPC health checks' H100 host<->device floor of 48 GB/s (Azure/azurehpc-health-checks).
- all_reduce bus bandwidth: fail below Meta GCM's critical NCCL floor (180 GB/s with NVLink, 18 GB/s
  without), warn within 1.05 x of it (Azure HPC health checks' warn band, 1.0-1.05x). Where gpu_skus.json has a
  line for the SKU and GPU count (Azure's per-SKU checks: 8 x H100 460 GB/s at 16 GiB), below it fails when the
  message was at least the line's size, and warns otherwise.
- Plateau sizes (PLATEAU): a line is the figure of a measurement large enough to reach the plateau; a fail
  measured below matmul n = 4096 (the reference H100 read 98% of its 8192^3 figure there), a 64 MiB pinned copy
  or a 256 MiB device copy is only a warning (our own sizes: they can only soften a verdict).
- AMP speedup: our own rule, from the reference H100 (CNN 3.1x fp16 + channels_last, transformer 6.1x
  bf16): below 1.0x fails (AMP is slower), below 1.3x warns, else passes.
"""

from __future__ import annotations

import math

from hostcheck.registry import Status

PASS_FRACTION = 0.90
WARN_FRACTION = 0.75

#: GB/s per lane after encoding: gen1/2 8b/10b, gen3-5 128b/130b, gen6 PAM4 + FLIT (242/256).
PCIE_GBS_PER_LANE = {
    1: 2.5 * 8 / 10 / 8,
    2: 5.0 * 8 / 10 / 8,
    3: 8.0 * 128 / 130 / 8,
    4: 16.0 * 128 / 130 / 8,
    5: 32.0 * 128 / 130 / 8,
    6: 64.0 * 242 / 256 / 8,
}
#: Achievable pinned copy / theoretical link rate (reference H100: 54 / 63.0 = 0.857).
PINNED_EFFICIENCY = 0.85
#: Pageable copies go through a staging buffer; below this fraction of the link they warn (our heuristic:
#: the reference node's 17 GB/s pageable is 0.27 of gen5 x16).
PAGEABLE_WARN_FRACTION = 0.10

#: Meta GCM's NCCL critical floors, GB/s bus bandwidth (facebookresearch/gcm health checks).
BUSBW_FLOOR_NVLINK = 180.0
BUSBW_FLOOR_PCIE = 18.0
#: Azure HPC health checks warn within 1.0-1.05 x of a floor.
BUSBW_WARN_BAND = 1.05

AMP_FAIL_BELOW = 1.0
AMP_WARN_BELOW = 1.3


def fraction_status(fraction: float | None) -> Status | None:
    """Fraction of achievable -> pass (>= 0.90), warn (>= 0.75), fail; None when there is no reference."""
    if fraction is None:
        return None
    if fraction >= PASS_FRACTION:
        return Status.PASS
    if fraction >= WARN_FRACTION:
        return Status.WARN
    return Status.FAIL


def judge_fraction(measured: float | None, achievable: float | None, estimate: bool = False):
    """(status, fraction) for a measurement against an achievable figure.

    No reference (unknown SKU, dtype without a fast path) -> (None, None): measured, no verdict.
    A reference that is only an estimate can warn but not fail. A measured, published or site figure (the
    site's own [[gpu_models]] entry in the configuration, which it vouches for) can fail.
    """
    if measured is None or not achievable or achievable <= 0:
        return None, None
    frac = measured / achievable
    status = fraction_status(frac)
    if estimate and status == Status.FAIL:
        status = Status.WARN
    return status, frac


#: The sizes from which a measurement is on its plateau, so that a fail against a line means the GPU: the
#: reference H100 read 766 TFLOP/s at 4096^3 and 780 at 8192^3 (98%), and the copies' lines were measured at
#: 256 MiB (pinned) and 1 GiB (device copy). hostcheck's own figures: below them a fail is only a warning.
PLATEAU = {"matmul_n": 4096, "pinned_bytes": 64 << 20, "device_copy_bytes": 256 << 20}


def on_plateau(status: Status | None, kind: str, size) -> tuple[Status | None, str]:
    """(status, note): a fail measured below ``kind``'s plateau size (PLATEAU) becomes a warning, with a note
    saying so; a size that is not recorded counts as on the plateau (the probe's defaults are)."""
    least = PLATEAU[kind]
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


def pinned_achievable_gbs(gen: int | None, width: int | None) -> float | None:
    theo = pcie_theoretical_gbs(gen, width)
    return None if theo is None else theo * PINNED_EFFICIENCY


def busbw_floor(nvlink: bool | None) -> float | None:
    if nvlink is None:
        return None
    return BUSBW_FLOOR_NVLINK if nvlink else BUSBW_FLOOR_PCIE


def busbw_status(value: float | None, n: int, nvlink: bool | None) -> Status | None:
    """Verdict on an all_reduce busbw (GB/s) within one node; None when there is nothing to judge."""
    floor = busbw_floor(nvlink)
    if value is None or n < 2 or floor is None:
        return None
    if value < floor:
        return Status.FAIL
    if value < floor * BUSBW_WARN_BAND:
        return Status.WARN
    return Status.PASS


def allreduce_status(
    value: float | None,
    nbytes: int | None,
    floor: float | None,
    line_gbs: float | None = None,
    line_bytes: int = 0,
    line_can_fail: bool = False,
) -> Status | None:
    """Verdict on an all_reduce busbw (GB/s) against the interconnect's floor and, where the data has one, the
    SKU's line for this GPU count. Below the line fails only for a message at least as large as the line's
    (a smaller one does not reach the plateau: NVIDIA/nccl-tests#212) and a line with a public source;
    otherwise it warns. None when there is nothing to judge."""
    if value is None or (floor is None and line_gbs is None):
        return None
    if floor is not None and value < floor:
        return Status.FAIL
    if line_gbs is not None:
        if value < line_gbs:
            return (
                Status.FAIL if line_can_fail and nbytes is not None and nbytes >= line_bytes else Status.WARN
            )
        # No warn band over the line: 8 x H100's healthy peak (about 480) is within 1.05 x Azure's 460.
        return Status.PASS
    return Status.WARN if floor is not None and value < floor * BUSBW_WARN_BAND else Status.PASS


def amp_speedup_status(speedup: float | None) -> Status | None:
    if speedup is None:
        return None
    if speedup < AMP_FAIL_BELOW:
        return Status.FAIL
    if speedup < AMP_WARN_BELOW:
        return Status.WARN
    return Status.PASS


def scaler_status(skipped: int, steps: int) -> Status:
    """GradScaler health: stuck (every step skipped) fails, more than half skipped warns."""
    if steps <= 0:
        return Status.ERROR
    if skipped >= steps:
        return Status.FAIL
    if skipped * 2 > steps:
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


def dataloader_status(best_ips: float | None, zero_ips: float | None, cpus: int) -> Status | None:
    """Workers should beat num_workers=0 by 1.2x when there are at least 4 CPUs (measured on a 2-core VM: 2 workers = 1.56x
    on 2 cores). None when it cannot be judged (too few CPUs to expect a gain)."""
    if not best_ips or not zero_ips:
        return None
    if cpus < 4:
        return None
    return Status.PASS if best_ips >= 1.2 * zero_ips else Status.WARN
