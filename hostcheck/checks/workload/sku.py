"""Per-SKU achievable figures: dense matmul TFLOP/s per dtype and device-memory copy bandwidth.

"Achievable" is what a healthy GPU of that SKU reaches in the probe's own measurement (4096^3 matmul,
CUDA events, after a warm-up; a device-to-device copy counted as read + write), not the datasheet peak.
Each figure says where it comes from:

- ``measured``: measured by this project on a real node (docs/workload.md).
- ``published``: a published measurement of the best achievable figure (ml-engineering, Stas Bekman).
- ``estimate``: datasheet dense peak x the efficiency measured on the reference H100 SXM node for that
  dtype. Estimates can warn but never fail (see judge.judge_fraction); replace one with a measurement
  when a node of that SKU is at hand (``benchmarks/matmul_h2d_long_vs_short.py`` prints the figures).
- ``site``: the site's own figure, from ``[[gpu_models]]`` in the configuration file. It comes first:
  the first entry whose ``match`` hits the device name gives the figures it names, the built-in table the
  rest. A site figure judges like a measured one (it can fail): the site vouches for it.

Efficiencies from the reference H100 SXM (H100 80GB HBM3 SXM, driver 580.159.04, torch 2.11.0+cu130, Ubuntu 24.04):
bf16 780/989 = 0.789, fp16 749/989 = 0.757, tf32 405/494.7 = 0.819, fp32 50/66.9 = 0.747,
device copy 3.0/3.35 TB/s = 0.896. Datasheet dense (no sparsity) peaks are NVIDIA's product datasheets
and architecture whitepapers (Volta, Ampere GA100 and GA102, Ada AD102/AD104, Hopper), quoted per entry.
Blackwell datasheets quote tensor figures "with sparsity" (2:4 structured); the dense peak is half of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

DTYPES = ("bf16", "fp16", "tf32", "fp32")

#: Efficiency of the reference H100 SXM per dtype (measured / datasheet dense peak), see the module doc.
EFF = {"bf16": 780 / 989.4, "fp16": 749 / 989.4, "tf32": 405 / 494.7, "fp32": 50 / 66.9}
EFF_COPY = 3.0 / 3.35

MEASURED = "measured"
PUBLISHED = "published"
ESTIMATE = "estimate"
SITE = "site"


@dataclass(frozen=True)
class Figure:
    value: float
    basis: str  # MEASURED | PUBLISHED | ESTIMATE | SITE
    source: str


@dataclass(frozen=True)
class Sku:
    key: str
    name: str
    #: dtype -> Figure (TFLOP/s); a dtype the SKU has no fast path for is absent (no verdict).
    matmul: dict = field(default_factory=dict)
    #: device copy bandwidth, GB/s (read + write), or None.
    copy_gbs: Figure | None = None


def _est(peak: float, dtype: str, src: str) -> Figure:
    return Figure(round(peak * EFF[dtype], 1), ESTIMATE, f"{src}: {peak:g} dense x {EFF[dtype]:.3f}")


def _est_copy(peak_tbs: float, src: str) -> Figure:
    return Figure(round(peak_tbs * 1000 * EFF_COPY), ESTIMATE, f"{src}: {peak_tbs:g} TB/s x {EFF_COPY:.3f}")


def _tc(peak16: float, peak_tf32: float | None, peak_fp32: float, src: str, bf16: bool = True) -> dict:
    """Matmul figures from datasheet dense peaks: 16-bit tensor core (fp32 accumulate), TF32, FP32."""
    out = {"fp16": _est(peak16, "fp16", src), "fp32": _est(peak_fp32, "fp32", src)}
    if bf16:
        out["bf16"] = _est(peak16, "bf16", src)
    if peak_tf32:
        out["tf32"] = _est(peak_tf32, "tf32", src)
    return out


def _a100_sxm() -> dict:
    # ml-engineering's best achievable A100 SXM bf16 matmul: 271.2 TFLOP/s (86.9% of 312); fp16 runs on the
    # same tensor cores: that figure x the reference H100's fp16/bf16 ratio (749/780).
    return dict(
        _tc(312, 156, 19.5, "A100 datasheet"),
        bf16=Figure(271.2, PUBLISHED, "ml-engineering best achievable matmul, A100 SXM"),
        fp16=Figure(round(271.2 * 749 / 780, 1), ESTIMATE, "ml-engineering A100 SXM bf16 x H100 fp16/bf16"),
    )


_MEASURED_H100 = "measured on the reference H100 SXM node (long run, 8192^3)"

# Order matters: the first pattern that matches the device name wins (specific before general).
# Patterns are matched case-insensitively against NVML's / torch's device name.
SKUS: tuple[tuple[str, Sku], ...] = (
    (
        r"GB200",  # before B200: "NVIDIA GB200" also contains "B200"
        Sku(
            "gb200",
            "GB200 (Blackwell GPU of a GB200 superchip)",
            # GB200 NVL72 spec, per Blackwell GPU: FP16/BF16 5 PFLOPS and TF32 2.5 PFLOPS with sparsity
            # (2,500 and 1,250 dense), FP32 80 TFLOPS; HBM3e 8 TB/s (576 TB/s for 72 GPUs). ml-engineering's
            # best achievable bf16 matmul on GB200 is 1822 TFLOP/s, 8% under this estimate.
            _tc(2500, 1250, 80, "GB200 NVL72 spec (per GPU)"),
            _est_copy(8.0, "GB200 NVL72 spec (per GPU)"),
        ),
    ),
    (
        r"\bB200\b",
        Sku(
            "b200",
            "B200",
            # HGX B200 spec, 8 GPUs: FP16/BF16 36 PFLOPS and TF32 18 PFLOPS with sparsity, FP32 600 TFLOPS,
            # so per GPU 2,250 / 1,125 dense and 75. Memory: the GB200 NVL72 spec's per-GPU HGX B200 column
            # gives HBM3e 7.7 TB/s (the DGX B200 datasheet totals 64 TB/s, 8 per GPU: the lower one is taken).
            # ml-engineering's best achievable bf16 matmul on B200 is 1745 TFLOP/s, 2% under this estimate.
            _tc(2250, 1125, 75, "HGX B200 spec (per GPU)"),
            _est_copy(7.7, "HGX B200 spec (per GPU)"),
        ),
    ),
    (
        r"H100.*(SXM|HBM3)",  # "NVIDIA H100 80GB HBM3" is the SXM5 part
        Sku(
            "h100-sxm",
            "H100 SXM",
            {
                # 4096^3 read 766 there, within 2% of 8192^3; ml-engineering publishes 794.5 (80.3% of 989).
                "bf16": Figure(780.0, MEASURED, _MEASURED_H100),
                "fp16": Figure(749.0, MEASURED, _MEASURED_H100),
                "tf32": Figure(405.0, MEASURED, _MEASURED_H100),
                "fp32": Figure(50.0, MEASURED, _MEASURED_H100),
            },
            Figure(3000.0, MEASURED, "device copy measured on the reference H100 SXM node (read + write)"),
        ),
    ),
    (
        r"H100.*NVL",
        Sku(
            "h100-nvl",
            "H100 NVL",
            # H100 NVL datasheet: BF16/FP16 835, TF32 417.5, FP32 60 TFLOPS dense; HBM3 3.9 TB/s.
            _tc(835, 417.5, 60, "H100 NVL datasheet"),
            _est_copy(3.9, "H100 NVL datasheet"),
        ),
    ),
    (
        r"H100.*PCI",
        Sku(
            "h100-pcie",
            "H100 PCIe",
            # H100 PCIe datasheet: BF16/FP16 756, TF32 378, FP32 51.2 TFLOPS dense; HBM2e 2.0 TB/s.
            _tc(756, 378, 51.2, "H100 PCIe datasheet"),
            _est_copy(2.0, "H100 PCIe datasheet"),
        ),
    ),
    (
        r"H200.*NVL",
        Sku(
            "h200-nvl",
            "H200 NVL",
            # H200 NVL datasheet: BF16/FP16 835, TF32 417.5, FP32 60 TFLOPS dense; HBM3e 4.8 TB/s.
            _tc(835, 417.5, 60, "H200 NVL datasheet"),
            _est_copy(4.8, "H200 NVL datasheet"),
        ),
    ),
    (
        r"H200",
        Sku(
            "h200",
            "H200 SXM",
            {
                # Same GH100 compute as H100 SXM (datasheet 989 / 494.7 / 67 dense): the H100 SXM
                # measurements apply; more memory bandwidth can only help.
                "bf16": Figure(780.0, ESTIMATE, "H200 datasheet compute = H100 SXM; " + _MEASURED_H100),
                "fp16": Figure(749.0, ESTIMATE, "H200 datasheet compute = H100 SXM; " + _MEASURED_H100),
                "tf32": Figure(405.0, ESTIMATE, "H200 datasheet compute = H100 SXM; " + _MEASURED_H100),
                "fp32": Figure(50.0, ESTIMATE, "H200 datasheet compute = H100 SXM; " + _MEASURED_H100),
            },
            # H200 SXM datasheet: HBM3e 4.8 TB/s.
            _est_copy(4.8, "H200 datasheet"),
        ),
    ),
    (
        r"A100.*SXM.*80|A100.*80.*SXM",
        Sku(
            "a100-sxm-80",
            "A100 80GB SXM",
            _a100_sxm(),
            # A100 80GB SXM datasheet: HBM2e 2,039 GB/s.
            _est_copy(2.039, "A100 80GB SXM datasheet"),
        ),
    ),
    (
        r"A100.*SXM",
        Sku(
            "a100-sxm-40",
            "A100 40GB SXM",
            _a100_sxm(),
            # A100 40GB datasheet: HBM2 1,555 GB/s.
            _est_copy(1.555, "A100 40GB datasheet"),
        ),
    ),
    (
        r"A100.*80.*PCI|A100.*PCI.*80",
        Sku(
            "a100-pcie-80",
            "A100 80GB PCIe",
            # A100 datasheet: BF16/FP16 312, TF32 156, FP32 19.5 dense (PCIe sustains less at 300 W).
            _tc(312, 156, 19.5, "A100 PCIe datasheet"),
            _est_copy(1.935, "A100 80GB PCIe datasheet"),
        ),
    ),
    (
        r"A100.*PCI",
        Sku(
            "a100-pcie-40",
            "A100 40GB PCIe",
            _tc(312, 156, 19.5, "A100 PCIe datasheet"),
            _est_copy(1.555, "A100 40GB PCIe datasheet"),
        ),
    ),
    (
        r"L40S",
        Sku(
            "l40s",
            "L40S",
            # L40S datasheet: BF16/FP16 362.05, TF32 183, FP32 91.6 TFLOPS dense; GDDR6 864 GB/s.
            _tc(362.05, 183, 91.6, "L40S datasheet"),
            _est_copy(0.864, "L40S datasheet"),
        ),
    ),
    (
        r"\bL4\b",
        Sku(
            "l4",
            "L4",
            # L4 datasheet: BF16/FP16 121, TF32 60, FP32 30.3 TFLOPS dense; GDDR6 300 GB/s.
            _tc(121, 60, 30.3, "L4 datasheet"),
            _est_copy(0.300, "L4 datasheet"),
        ),
    ),
    (
        r"\bA10\b",  # not A100, not A10G (a different, lower-clocked part)
        Sku(
            "a10",
            "A10",
            # A10 datasheet: BF16/FP16 125, TF32 62.5, FP32 31.2 TFLOPS dense; GDDR6 600 GB/s.
            _tc(125, 62.5, 31.2, "A10 datasheet"),
            _est_copy(0.600, "A10 datasheet"),
        ),
    ),
    (
        r"V100.*SXM",
        Sku(
            "v100-sxm2",
            "V100 SXM2",
            # V100 datasheet (SXM2): FP16 tensor 125, FP32 15.7 TFLOPS; no bf16 or tf32 path; HBM2 900 GB/s.
            _tc(125, None, 15.7, "V100 SXM2 datasheet", bf16=False),
            _est_copy(0.900, "V100 datasheet"),
        ),
    ),
    (
        r"V100",
        Sku(
            "v100-pcie",
            "V100 PCIe",
            # V100 datasheet (PCIe): FP16 tensor 112, FP32 14 TFLOPS; HBM2 900 GB/s.
            _tc(112, None, 14.0, "V100 PCIe datasheet", bf16=False),
            _est_copy(0.900, "V100 datasheet"),
        ),
    ),
    (
        r"RTX 4090",
        Sku(
            "rtx-4090",
            "GeForce RTX 4090",
            # Ada whitepaper (AD102, RTX 4090): FP16/BF16 tensor with FP32 accumulate 165.2 dense,
            # TF32 82.6, FP32 82.6 TFLOPS; GDDR6X 1,008 GB/s.
            _tc(165.2, 82.6, 82.6, "Ada whitepaper RTX 4090"),
            _est_copy(1.008, "RTX 4090 spec"),
        ),
    ),
    (
        r"RTX 3090",
        Sku(
            "rtx-3090",
            "GeForce RTX 3090",
            # Ampere GA102 whitepaper (RTX 3090): FP16/BF16 tensor with FP32 accumulate 71 dense,
            # TF32 35.6, FP32 35.6 TFLOPS; GDDR6X 936 GB/s.
            _tc(71, 35.6, 35.6, "GA102 whitepaper RTX 3090"),
            _est_copy(0.936, "RTX 3090 spec"),
        ),
    ),
)


def lookup(name: str | None) -> Sku | None:
    """The built-in SKU entry for a device name from NVML or torch, or None when unknown (no verdict)."""
    if not name or not isinstance(name, str):
        return None
    for pattern, sku in SKUS:
        if re.search(pattern, name, re.IGNORECASE):
            return sku
    return None


def site_model(name: str | None, config: Any = None) -> Any:
    """The first ``[[gpu_models]]`` entry of the configuration whose ``match`` hits the device name, or None."""
    if not name or not isinstance(name, str):
        return None
    for model in getattr(config, "gpu_models", None) or ():
        if re.search(model.match, name, re.IGNORECASE):
            return model
    return None


def _site_figure(value: float, model: Any, config: Any) -> Figure:
    return Figure(float(value), SITE, f"config file {config.path or '(none)'}: gpu_models {model.name!r}")


def matmul_figure(name: str | None, dtype: str, config: Any = None) -> Figure | None:
    """The achievable matmul TFLOP/s for a device: the site's figure first, then the built-in table."""
    model = site_model(name, config)
    if model is not None and model.matmul_tflops.get(dtype) is not None:
        return _site_figure(model.matmul_tflops[dtype], model, config)
    sku = lookup(name)
    return sku.matmul.get(dtype) if sku else None


def copy_figure(name: str | None, config: Any = None) -> Figure | None:
    """The achievable device copy GB/s for a device: the site's figure first, then the built-in table."""
    model = site_model(name, config)
    if model is not None and model.copy_gbs is not None:
        return _site_figure(model.copy_gbs, model, config)
    sku = lookup(name)
    return sku.copy_gbs if sku else None
