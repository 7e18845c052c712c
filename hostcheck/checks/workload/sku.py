"""Per-SKU achievable figures: dense matmul TFLOP/s per dtype and device-memory copy bandwidth.

"Achievable" is what a healthy GPU of that SKU reaches in the probe's own measurement (4096^3 matmul,
CUDA events, after a warm-up; a device-to-device copy counted as read + write), not the datasheet peak.
The table lives in ``hostcheck/data/gpu_skus.json``: one row per SKU, in order (first match wins), each figure
with its source. Each figure says where it comes from:

- ``measured``: measured by this project on a real node (docs/workload.md).
- ``published``: a published measurement of the best achievable figure (ml-engineering, Stas Bekman).
- ``estimate``: datasheet dense peak x the efficiency measured on the reference H100 SXM node for that
  dtype (the data file's ``reference``). Estimates can warn but never fail (see judge.judge_fraction); replace
  one with a measurement when a node of that SKU is at hand (``benchmarks/matmul_h2d_long_vs_short.py``
  prints the figures).
- ``site``: the site's own figure, from ``[[gpu_models]]`` in the configuration file. It comes first:
  the first entry whose ``match`` hits the device name gives the figures it names, the built-in table the
  rest. A site figure judges like a measured one (it can fail): the site vouches for it.

The data file is read once, at import; a malformed one raises ``ValueError`` naming the row.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DTYPES = ("bf16", "fp16", "tf32", "fp32")
DATA_PATH = Path(__file__).resolve().parents[2] / "data" / "gpu_skus.json"

MEASURED = "measured"
PUBLISHED = "published"
ESTIMATE = "estimate"
SITE = "site"
_BASES = (MEASURED, PUBLISHED, ESTIMATE)
_ROW_KEYS = {"match", "match_why", "key", "name", "matmul_peaks", "matmul", "copy_peak", "copy", "note"}


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


def _est(peak: float, dtype: str, src: str, eff: dict[str, float]) -> Figure:
    return Figure(round(peak * eff[dtype], 1), ESTIMATE, f"{src}: {peak:g} dense x {eff[dtype]:.3f}")


def _est_copy(peak_tbs: float, src: str, eff_copy: float) -> Figure:
    return Figure(round(peak_tbs * 1000 * eff_copy), ESTIMATE, f"{src}: {peak_tbs:g} TB/s x {eff_copy:.3f}")


# ------------------------------------------------------------------------------------------- data file


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _text(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


def _need(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise ValueError(f"{where}: {what}")


def _named(fig: Any, where: str) -> Figure:
    """A figure the data file names: value, basis and source."""
    _need(isinstance(fig, dict), where, "a figure is an object with value, basis and source")
    _need(_positive(fig.get("value")), where, "value must be a positive number")
    _need(fig.get("basis") in _BASES, where, f"basis must be one of {', '.join(_BASES)}")
    _need(_text(fig.get("source")), where, "source must say where the figure comes from")
    return Figure(float(fig["value"]), fig["basis"], fig["source"])


def _efficiency(ref: Any) -> tuple[dict[str, float], float]:
    """Measured / datasheet dense peak on the reference node, per dtype and for the device copy."""
    _need(isinstance(ref, dict), "reference", "an object")
    for key in ("node", "source"):
        _need(_text(ref.get(key)), "reference", f"{key} must be a non-empty string")
    eff = {}
    for dt in DTYPES:
        r = (ref.get("matmul") or {}).get(dt) or {}
        _need(
            _positive(r.get("measured")) and _positive(r.get("peak")),
            f"reference.matmul.{dt}",
            "positive measured and peak",
        )
        eff[dt] = r["measured"] / r["peak"]
    c = ref.get("copy") or {}
    _need(
        _positive(c.get("measured_tbs")) and _positive(c.get("peak_tbs")),
        "reference.copy",
        "positive measured_tbs and peak_tbs",
    )
    return eff, c["measured_tbs"] / c["peak_tbs"]


def _sku(row: Any, where: str, eff: dict[str, float], eff_copy: float) -> tuple[str, Sku]:
    """One row: named figures win over the estimates derived from the datasheet peaks."""
    _need(isinstance(row, dict), where, "a row is an object")
    unknown = sorted(set(row) - _ROW_KEYS)
    _need(not unknown, where, f"unknown keys {unknown}")
    for key in ("match", "key", "name", "note"):
        _need(_text(row.get(key)), where, f"{key} must be a non-empty string")
    where = f"{where} ({row['key']})"
    try:
        re.compile(row["match"], re.IGNORECASE)
    except re.error as e:
        raise ValueError(f"{where}: match is not a regular expression: {e}") from None
    matmul: dict[str, Figure] = {}
    peaks = row.get("matmul_peaks") or {}
    if peaks:
        _need(_text(peaks.get("source")), f"{where}: matmul_peaks", "source must name the datasheet")
    for dt, peak in peaks.items():
        if dt != "source":
            _need(
                dt in DTYPES and _positive(peak),
                f"{where}: matmul_peaks.{dt}",
                "a dtype and a positive TFLOP/s",
            )
            matmul[dt] = _est(peak, dt, peaks["source"], eff)
    for dt, fig in (row.get("matmul") or {}).items():
        _need(dt in DTYPES, f"{where}: matmul.{dt}", f"not one of {', '.join(DTYPES)}")
        matmul[dt] = _named(fig, f"{where}: matmul.{dt}")
    _need(bool(matmul), where, "no matmul figure")
    copy = None
    if row.get("copy") is not None:
        copy = _named(row["copy"], f"{where}: copy")
    elif row.get("copy_peak") is not None:
        peak = row["copy_peak"]
        _need(
            _positive(peak.get("tbs")) and _text(peak.get("source")),
            f"{where}: copy_peak",
            "a positive tbs and its source",
        )
        copy = _est_copy(peak["tbs"], peak["source"], eff_copy)
    return row["match"], Sku(row["key"], row["name"], matmul, copy)


def _load(path: Path) -> tuple[dict[str, float], float, tuple[tuple[str, Sku], ...]]:
    """The reference efficiencies and the SKU rows of ``path``; ValueError naming the file and the row."""
    try:
        data = json.loads(path.read_text())
        _need(isinstance(data, dict) and data.get("schema") == 1, "top level", "an object with schema 1")
        for key in ("about", "source"):
            _need(_text(data.get(key)), "top level", f"{key} must be a non-empty string")
        eff, eff_copy = _efficiency(data.get("reference"))
        rows = data.get("skus")
        _need(isinstance(rows, list) and bool(rows), "skus", "a non-empty list of rows")
        skus = tuple(_sku(row, f"skus[{i}]", eff, eff_copy) for i, row in enumerate(rows))
        keys = [s.key for _, s in skus]
        _need(len(keys) == len(set(keys)), "skus", "duplicate keys")
    except (AttributeError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    return eff, eff_copy, skus


#: EFF, EFF_COPY: efficiency of the reference H100 SXM per dtype (measured / datasheet dense peak) and of its
#: device copy. SKUS: (pattern, Sku) in the data file's order; the first pattern that matches the device name
#: (case-insensitively, NVML's / torch's name) wins, so specific rows come before general ones.
EFF, EFF_COPY, SKUS = _load(DATA_PATH)


@dataclass(frozen=True)
class AllReduceLine:
    """workload.E013's line for one SKU and GPU count: busbw GB/s at a message of ``bytes`` or more."""

    sku: str
    gpus: int
    busbw_gbs: float
    bytes: int
    basis: str  # "public" (can fail) or "own" (warns only)
    source: str


def _provenance(row: dict[str, Any], where: str) -> None:
    """A line's basis, source and why, as every SKU line block states them; ValueError naming the row."""
    _need(row.get("basis") in ("public", "own"), where, "basis must be public or own")
    _need(
        _text(row.get("source")) and _text(row.get("why")),
        where,
        "source and why must say where and why",
    )
    _need(
        row["basis"] != "public" or str(row["source"]).startswith("https://"),
        where,
        "a public line names its public source (https://...)",
    )


def _allreduce(path: Path, keys: set[str]) -> dict[tuple[str, int], AllReduceLine]:
    """The data file's all_reduce lines by (SKU key, GPU count); ValueError naming the row."""
    try:
        block = json.loads(path.read_text()).get("allreduce") or {"rows": []}
        _need(
            isinstance(block, dict) and isinstance(block.get("rows"), list),
            "allreduce",
            "an object with rows",
        )
        out: dict[tuple[str, int], AllReduceLine] = {}
        for i, row in enumerate(block["rows"]):
            where = f"allreduce.rows[{i}]"
            _need(isinstance(row, dict), where, "a row is an object")
            _need(row.get("sku") in keys, where, f"sku must be a key of skus, not {row.get('sku')!r}")
            g = row.get("gpus")
            _need(
                isinstance(g, int) and not isinstance(g, bool) and g >= 2,
                where,
                "gpus must be an integer >= 2",
            )
            _need(_positive(row.get("busbw_gbs")), where, "busbw_gbs must be a positive number")
            b = row.get("bytes")
            _need(
                isinstance(b, int) and not isinstance(b, bool) and b > 0,
                where,
                "bytes must be a positive integer",
            )
            _provenance(row, where)
            key = (row["sku"], g)
            _need(key not in out, where, "duplicate SKU and GPU count")
            out[key] = AllReduceLine(row["sku"], g, float(row["busbw_gbs"]), b, row["basis"], row["source"])
    except (AttributeError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    return out


#: (SKU key, GPU count) -> the all_reduce line (workload.E013); only the rows the data file names.
ALLREDUCE = _allreduce(DATA_PATH, {s.key for _, s in SKUS})


def allreduce_line(name: str | None, gpus: int) -> AllReduceLine | None:
    """The all_reduce line for ``gpus`` GPUs named ``name`` in one node, or None (no row: never extrapolated)."""
    sku = lookup(name)
    return ALLREDUCE.get((sku.key, gpus)) if sku is not None else None


@dataclass(frozen=True)
class NvLinkLine:
    """nvlink.E001/E002's line for one SKU: NVLinks per GPU and each link's speed (MB/s, NVML's figure)."""

    sku: str
    links: int
    link_mbps: int
    source: str


def _nvlink(path: Path, keys: set[str]) -> dict[str, NvLinkLine]:
    """The data file's NVLink lines by SKU key; ValueError naming the row. Only public lines: they can fail."""
    try:
        block = json.loads(path.read_text()).get("nvlink") or {"rows": []}
        _need(
            isinstance(block, dict) and isinstance(block.get("rows"), list), "nvlink", "an object with rows"
        )
        out: dict[str, NvLinkLine] = {}
        for i, row in enumerate(block["rows"]):
            where = f"nvlink.rows[{i}]"
            _need(isinstance(row, dict), where, "a row is an object")
            _need(row.get("sku") in keys, where, f"sku must be a key of skus, not {row.get('sku')!r}")
            for k in ("links", "link_mbps"):
                v = row.get(k)
                _need(
                    isinstance(v, int) and not isinstance(v, bool) and v > 0,
                    where,
                    f"{k}: a positive integer",
                )
            _need(
                row.get("basis") == "public", where, "basis must be public (a line that fails needs a source)"
            )
            _need(
                str(row.get("source", "")).startswith("https://") and _text(row.get("why")),
                where,
                "source, why",
            )
            _need(row["sku"] not in out, where, "duplicate SKU")
            out[row["sku"]] = NvLinkLine(row["sku"], row["links"], row["link_mbps"], row["source"])
    except (AttributeError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    return out


@dataclass(frozen=True)
class PeerCopyLine:
    """workload.E016's line for one SKU: GB/s of a copy between two NVLink-connected GPUs, and the warn band."""

    sku: str
    gbs: float
    warn_band: float
    basis: str  # "public" (can fail) or "own" (warns only)
    source: str


def _peer_copy(path: Path, keys: set[str]) -> dict[str, PeerCopyLine]:
    """The data file's GPU-to-GPU copy lines by SKU key; ValueError naming the row."""
    try:
        block = json.loads(path.read_text()).get("peer_copy") or {"rows": []}
        _need(
            isinstance(block, dict) and isinstance(block.get("rows"), list),
            "peer_copy",
            "an object with rows",
        )
        out: dict[str, PeerCopyLine] = {}
        for i, row in enumerate(block["rows"]):
            where = f"peer_copy.rows[{i}]"
            _need(isinstance(row, dict), where, "a row is an object")
            _need(row.get("sku") in keys, where, f"sku must be a key of skus, not {row.get('sku')!r}")
            _need(_positive(row.get("gbs")), where, "gbs must be a positive number")
            band = row.get("warn_band", 1.0)
            _need(_positive(band) and band >= 1.0, where, "warn_band must be a number >= 1")
            _provenance(row, where)
            _need(row["sku"] not in out, where, "duplicate SKU")
            out[row["sku"]] = PeerCopyLine(
                row["sku"], float(row["gbs"]), float(band), row["basis"], row["source"]
            )
    except (AttributeError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    return out


#: SKU key -> its NVLink line (nvlink.E001, E002); only the rows the data file names.
NVLINK = _nvlink(DATA_PATH, {s.key for _, s in SKUS})


def nvlink_line(name: str | None) -> NvLinkLine | None:
    """The NVLink line for a GPU named ``name``, or None (no row: never extrapolated)."""
    sku = lookup(name)
    return NVLINK.get(sku.key) if sku is not None else None


#: SKU key -> the GPU-to-GPU copy line (workload.E016); only the rows the data file names.
PEER_COPY = _peer_copy(DATA_PATH, {s.key for _, s in SKUS})


def peer_copy_line(name: str | None) -> PeerCopyLine | None:
    """The GPU-to-GPU copy line for GPUs named ``name``, or None (no row: never extrapolated)."""
    sku = lookup(name)
    return PEER_COPY.get(sku.key) if sku is not None else None


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
