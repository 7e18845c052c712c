"""Sanity of hostcheck/data/gpu_skus.json: every figure within a plausible band of its unit and of its peers.

A figure off by a unit (MB/s written where GB/s is meant) still loads: it is a positive number with a source.
DCGM's own per-SKU file once carried an H200 memory-bandwidth floor of 2333 where 2,333,000 MB/s was meant, 1000x
too low, so every H200 passed that test. These rules catch that class of error; each is shown catching a planted
wrong row.
"""

from __future__ import annotations

import copy
import json
import statistics

import pytest

from hostcheck.checks.workload import sku as S

#: Device memory copy, GB/s read + write: an L4 reaches about 270, a Blackwell GPU about 7,000.
COPY_GBS = (100.0, 20000.0)
#: Dense matmul TFLOP/s: a V100's fp32 is 14, a Blackwell GPU's bf16 about 2,000.
MATMUL_TFLOPS = (5.0, 5000.0)
#: Every SKU's figure within this factor of the median of all SKUs' figures for the same quantity.
PEER_FACTOR = 12.0
#: bf16 TFLOP/s per TB/s of copy bandwidth (the FLOP per byte where a GPU turns compute-bound): 60-450 on
#: the SKUs here (RTX 3090 about 70, L4 about 400); a unit slip in either moves it 1000x.
RIDGE_FLOP_PER_BYTE = (30.0, 1000.0)
#: (newer or bigger, older or smaller): the first reaches at least the second's figure on every quantity
#: both have. H200 is an H100 with faster, larger HBM3e; A100 80GB has faster HBM2e than A100 40GB.
NOT_BELOW = (
    ("h200", "h100-sxm"),
    ("h200-nvl", "h100-nvl"),
    ("b200", "h100-sxm"),
    ("gb200", "h100-sxm"),
    ("h100-sxm", "a100-sxm-80"),
    ("h100-pcie", "a100-pcie-80"),
    ("a100-sxm-80", "a100-sxm-40"),
    ("a100-pcie-80", "a100-pcie-40"),
    ("a100-sxm-80", "v100-sxm2"),
    ("l40s", "l4"),
)
#: Within one SKU: a 16-bit tensor rate is at least TF32's, which is at least FP32's.
DTYPE_ORDER = (("bf16", "tf32"), ("fp16", "tf32"), ("tf32", "fp32"), ("bf16", "fp32"), ("fp16", "fp32"))


def implausible(skus) -> list[str]:
    """Every rule a table of Sku breaks, one line each (empty: the table is plausible)."""
    out: list[str] = []
    by_key = {s.key: s for _, s in skus}
    copies = [s.copy_gbs.value for s in by_key.values() if s.copy_gbs]
    copy_median = statistics.median(copies)
    for s in by_key.values():
        mm = {dt: f.value for dt, f in s.matmul.items()}
        for dt, v in mm.items():
            if not MATMUL_TFLOPS[0] <= v <= MATMUL_TFLOPS[1]:
                out.append(f"{s.key}: {dt} matmul {v:g} TFLOP/s is outside {MATMUL_TFLOPS}")
            peers = [o.matmul[dt].value for o in by_key.values() if dt in o.matmul]
            med = statistics.median(peers)
            if not med / PEER_FACTOR <= v <= med * PEER_FACTOR:
                out.append(
                    f"{s.key}: {dt} matmul {v:g} is more than {PEER_FACTOR:g}x from its peers' {med:g}"
                )
        for hi, lo in DTYPE_ORDER:
            if hi in mm and lo in mm and mm[hi] < mm[lo]:
                out.append(f"{s.key}: {hi} matmul {mm[hi]:g} below {lo} {mm[lo]:g}")
        if s.copy_gbs is None:
            out.append(f"{s.key}: no copy figure")
            continue
        c = s.copy_gbs.value
        if not COPY_GBS[0] <= c <= COPY_GBS[1]:
            out.append(f"{s.key}: copy {c:g} GB/s is outside {COPY_GBS}")
        if not copy_median / PEER_FACTOR <= c <= copy_median * PEER_FACTOR:
            out.append(
                f"{s.key}: copy {c:g} GB/s is more than {PEER_FACTOR:g}x from its peers' {copy_median:g}"
            )
        top = mm.get("bf16") or mm.get("fp16")
        if top:
            ridge = top / (c / 1000.0)
            if not RIDGE_FLOP_PER_BYTE[0] <= ridge <= RIDGE_FLOP_PER_BYTE[1]:
                out.append(f"{s.key}: {ridge:.0f} FLOP per byte of copy is outside {RIDGE_FLOP_PER_BYTE}")
    for hi, lo in NOT_BELOW:
        a, b = by_key.get(hi), by_key.get(lo)
        if a is None or b is None:
            out.append(f"{hi} / {lo}: a row of the comparison is missing")
            continue
        for dt in set(a.matmul) & set(b.matmul):
            if a.matmul[dt].value < b.matmul[dt].value:
                out.append(f"{hi} {dt} matmul {a.matmul[dt].value:g} below {lo}'s {b.matmul[dt].value:g}")
        if a.copy_gbs and b.copy_gbs and a.copy_gbs.value < b.copy_gbs.value:
            out.append(f"{hi} copy {a.copy_gbs.value:g} GB/s below {lo}'s {b.copy_gbs.value:g}")
    return out


def test_the_built_in_table_is_plausible():
    assert implausible(S.SKUS) == []


def _row(data, key):
    return next(r for r in data["skus"] if r["key"] == key)


def _dcgm_h200(data):
    # DCGM's slip, in our units: the H200's copy figure written in TB/s where GB/s is meant (1000x too low).
    _row(data, "h200").pop("copy_peak", None)
    _row(data, "h200")["copy"] = {"value": 4.3, "basis": "measured", "source": "planted: 1000x too low"}


def _h200_below_h100(data):
    _row(data, "h200").pop("copy_peak", None)
    _row(data, "h200")["copy"] = {"value": 2500.0, "basis": "published", "source": "planted: below H100"}


def _tf32_over_bf16(data):
    _row(data, "l40s")["matmul_peaks"]["tf32"] = 733  # the sparse tf32 figure taken for the dense one


def _copy_in_mbs(data):
    _row(data, "l4")["copy_peak"]["tbs"] = 300  # GB/s written into a TB/s field


def _matmul_in_gflops(data):
    _row(data, "a10")["matmul_peaks"]["fp32"] = 31200  # GFLOP/s written where TFLOP/s is meant


@pytest.mark.parametrize(
    ("plant", "said"),
    [
        (_dcgm_h200, "h200: copy 4.3 GB/s is outside"),
        (_h200_below_h100, "h200 copy 2500 GB/s below h100-sxm's 3000"),
        (_tf32_over_bf16, "l40s: bf16 matmul"),
        (_copy_in_mbs, "l4: copy"),
        (_matmul_in_gflops, "a10: fp32 matmul"),
    ],
)
def test_a_planted_wrong_row_is_caught(tmp_path, plant, said):
    data = json.loads(S.DATA_PATH.read_text())
    good = copy.deepcopy(data)
    plant(data)
    path = tmp_path / "gpu_skus.json"
    path.write_text(json.dumps(data))
    found = implausible(S._load(path)[2])  # it loads: a unit slip is a valid number
    assert any(said in line for line in found), found
    path.write_text(json.dumps(good))
    assert implausible(S._load(path)[2]) == []
