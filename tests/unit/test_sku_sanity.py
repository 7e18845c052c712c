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
    _row(data, "h200")["copy"] = {"value": 4.3, "basis": "estimate", "source": "planted: 1000x too low"}


def _h200_below_h100(data):
    _row(data, "h200")["copy"] = {"value": 2500.0, "basis": "estimate", "source": "planted: below H100"}


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
        (_h200_below_h100, "h200 copy 2500 GB/s below h100-sxm's 2540"),
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


# ------------------------------------------------------------------------------ under the datasheet's peak


def beyond_the_part(skus, allreduce, peer_copy, nvlink) -> list[str]:
    """Every line above what its SKU can do by its datasheet (the row's peaks), one line each. A matmul figure over
    the dense peak, a copy over the memory bandwidth, an all_reduce busbw over the NVLink bandwidth one way (a ring
    all_reduce moves at most that: a line must hold without NVLink SHARP, which not every node has), a GPU-to-GPU
    copy over the NVLink bandwidth one way, more NVLinks than NVML numbers (NVML_NVLINK_MAX_LINKS, 18)."""
    out: list[str] = []
    by_key = {s.key: s for _, s in skus}
    for s in by_key.values():
        for dt, f in s.matmul.items():
            peak = s.peak_matmul.get(dt)
            if peak is None:
                out.append(f"{s.key}: {dt} figure {f.value:g} without a datasheet peak to hold it under")
            elif f.value > peak:
                out.append(f"{s.key}: {dt} figure {f.value:g} above the datasheet's dense {peak:g} TFLOP/s")
        if s.copy_gbs is not None:
            if s.peak_copy_gbs is None:
                out.append(f"{s.key}: copy figure without the datasheet's memory bandwidth")
            elif s.copy_gbs.value > s.peak_copy_gbs:
                out.append(
                    f"{s.key}: copy {s.copy_gbs.value:g} GB/s above the datasheet's {s.peak_copy_gbs:g}"
                )
        if not s.peak_urls or not all(u.startswith("https://") for u in s.peak_urls):
            out.append(f"{s.key}: its peaks cite no datasheet page")
    nvlink_lines = [
        (f"{key} x{n}: all_reduce line", key, line.busbw_gbs) for (key, n), line in allreduce.items()
    ]
    nvlink_lines += [(f"{key}: GPU-to-GPU copy line", key, line.gbs) for key, line in peer_copy.items()]
    for what, key, gbs in nvlink_lines:
        nv = by_key[key].peak_nvlink_gbs
        if not nv:
            out.append(f"{what} without the datasheet's NVLink bandwidth")
        elif gbs > nv:
            out.append(f"{what} {gbs:g} above NVLink's {nv:g} GB/s one way")
    for key, line in nvlink.items():
        if line.links > 18:
            out.append(f"{key}: {line.links} NVLinks, more than NVML numbers")
        if line.links and by_key[key].peak_nvlink_gbs == 0:
            out.append(f"{key}: NVLinks expected on a part whose datasheet has none")
    return out


def test_every_line_is_under_its_skus_datasheet_peak():
    assert beyond_the_part(S.SKUS, S.ALLREDUCE, S.PEER_COPY, S.NVLINK) == []


def _azure_nc_h100_v5(data):
    # Azure's NC H100 v5 figure (2 x H100 NVL): 335 GB/s, above the 300 GB/s one way an H100 NVL pair's bridges carry.
    data["peer_copy"]["rows"].append(
        {
            "sku": "h100-nvl",
            "gbs": 335.0,
            "warn_band": 1.05,
            "basis": "public",
            "source": "https://a",
            "why": "x",
        }
    )


def _nvls_line(data):
    # Azure's ND H100 v5 all_reduce line, reached only with NVLink SHARP: above NVLink's 450 GB/s one way.
    data["allreduce"]["rows"][0]["busbw_gbs"] = 460.0


def _sparse_peak(data):
    _row(data, "h100-sxm")["matmul"]["bf16"]["value"] = (
        1979.0  # the with-sparsity figure taken for achievable
    )


@pytest.mark.parametrize(
    ("plant", "said"),
    [
        (_azure_nc_h100_v5, "h100-nvl: GPU-to-GPU copy line 335 above NVLink's 300"),
        (_nvls_line, "h100-sxm x8: all_reduce line 460 above NVLink's 450"),
        (_sparse_peak, "h100-sxm: bf16 figure 1979 above the datasheet's dense 989.4"),
    ],
)
def test_a_line_beyond_the_part_is_caught(tmp_path, plant, said):
    data = json.loads(S.DATA_PATH.read_text())
    plant(data)
    path = tmp_path / "gpu_skus.json"
    path.write_text(json.dumps(data))
    skus = S._load(path)[2]
    keys = {s.key for _, s in skus}
    found = beyond_the_part(skus, S._allreduce(path, keys), S._peer_copy(path, keys), S._nvlink(path, keys))
    assert any(said in line for line in found), found


def test_the_gpudirect_line_is_under_the_port_rate():
    from hostcheck.thresholds import NodeThresholds

    t = NodeThresholds()
    # NDR is 400 Gb/s; the line sits at the lower of Azure's two published NDR acceptance lines for the same
    # ConnectX-7 port (ND H200 v5: 360; ND H100 v5: 380), so a healthy node outside one cloud does not fail.
    assert t.gdr_write_ndr_gbps == 360.0 <= 400.0
    assert t.gdr_write_line_fraction == pytest.approx(t.gdr_write_ndr_gbps / 400.0)
