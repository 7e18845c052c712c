"""Per-SKU achievable figures: dense matmul TFLOP/s per dtype and device-memory copy bandwidth.

"Achievable" is what a healthy GPU of that SKU reaches in the probe's own measurement (4096^3 matmul,
CUDA events, after a warm-up; a device-to-device copy counted as read + write), not the datasheet peak.
The table lives in ``hostcheck/data/gpu_skus.json``: one row per SKU, in order (first match wins), each figure
with its source. Each figure says where it comes from:

- ``measured``: measured by this project, and only with ``proof``: the JSON a recorded run of scripts/gpu-proof
  wrote, committed under docs/ (the loader refuses a measured figure without one; the tests check the file names
  the run's date, GPU, driver and torch and holds the figure).
- ``published``: a public measurement of the best achievable figure, its link in ``source`` (ml-engineering,
  Stas Bekman).
- ``estimate``: datasheet dense peak x the reference efficiency for that dtype (the data file's ``reference``:
  ml-engineering's published H100 SXM bf16 figure, the other dtypes like it, NVIDIA's H100 memory figure for the
  copy). Estimates can warn but never fail (see grading.judge_fraction).
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
_ROW_KEYS = {
    "match",
    "match_why",
    "key",
    "name",
    "matmul_peaks",
    "matmul",
    "copy_peak",
    "copy",
    "nvlink_peak",
    "note",
}
#: Where a measured figure's proof lies: a JSON file of a recorded scripts/gpu-proof run, in the run's folder
#: docs/gpu-proof/<date>-<gpu>/ (beside its machine.json: the date, GPUs, driver and torch of the run).
PROOF = re.compile(r"docs/gpu-proof/[0-9]{4}-[0-9]{2}-[0-9]{2}-[a-z0-9-]+/[A-Za-z0-9][A-Za-z0-9._-]*\.json")


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
    #: The datasheet's peaks no line may exceed: dense TFLOP/s per dtype, memory GB/s, NVLink GB/s per direction
    #: (0: no NVLink; None: not given), and the page each comes from.
    peak_matmul: dict = field(default_factory=dict)
    peak_copy_gbs: float | None = None
    peak_nvlink_gbs: float | None = None
    peak_urls: tuple[str, ...] = ()


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


def _basis(fig: dict, where: str) -> None:
    """A figure's basis and where it comes from: measured only with the proof of a recorded gpu-proof run, published
    only with the public link."""
    _need(fig.get("basis") in _BASES, where, f"basis must be one of {', '.join(_BASES)}")
    _need(_text(fig.get("source")), where, "source must say where the figure comes from")
    if fig["basis"] == MEASURED:
        _need(
            isinstance(fig.get("proof"), str) and PROOF.fullmatch(fig["proof"]) is not None,
            where,
            "a measured figure needs proof: a JSON file in docs/gpu-proof/<date>-<gpu>/, the folder scripts/gpu-proof --record wrote",
        )
    if fig["basis"] == PUBLISHED:
        _need(
            "https://" in fig["source"],
            where,
            "a published figure's source names its public link (https://...)",
        )


def _named(fig: Any, where: str) -> Figure:
    """A figure the data file names: value, basis and source (and proof, for a measured one)."""
    _need(isinstance(fig, dict), where, "a figure is an object with value, basis and source")
    unknown = sorted(set(fig) - {"value", "basis", "source", "proof"})
    _need(not unknown, where, f"unknown keys {unknown}")
    _need(_positive(fig.get("value")), where, "value must be a positive number")
    _basis(fig, where)
    return Figure(float(fig["value"]), fig["basis"], fig["source"])


def _likes(ref: dict) -> dict[str, str]:
    """dtype -> the dtype whose efficiency it takes (the reference's 'like'), for the dtypes that have none."""
    rows = ref.get("matmul") or {}
    return {dt: rows[dt]["like"] for dt in DTYPES if isinstance(rows.get(dt), dict) and "like" in rows[dt]}


def _efficiency(ref: Any) -> tuple[dict[str, float], float]:
    """Achievable / datasheet dense peak of the reference SKU, per dtype and for the device copy. A dtype with no
    achievable figure of its own is 'like' another (its efficiency, an estimate)."""
    _need(isinstance(ref, dict), "reference", "an object")
    for key in ("node", "about"):
        _need(_text(ref.get(key)), "reference", f"{key} must be a non-empty string")
    eff: dict[str, float] = {}
    rows = ref.get("matmul") or {}
    for dt in DTYPES:
        r = rows.get(dt) or {}
        where = f"reference.matmul.{dt}"
        _need(_positive(r.get("peak")) and _text(r.get("why")), where, "a positive peak and why")
        if "like" in r:
            _need(
                r["like"] in DTYPES and "achievable" in rows.get(r["like"], {}),
                where,
                "like: a dtype with a figure",
            )
            continue
        _need(_positive(r.get("achievable")), where, "a positive achievable figure, or like: another dtype")
        _basis(r, where)
        eff[dt] = r["achievable"] / r["peak"]
    for dt in DTYPES:
        if dt not in eff:
            eff[dt] = eff[rows[dt]["like"]]
    c = ref.get("copy") or {}
    _need(
        _positive(c.get("achievable_tbs")) and _positive(c.get("peak_tbs")) and _text(c.get("why")),
        "reference.copy",
        "positive achievable_tbs and peak_tbs, and why",
    )
    _basis(c, "reference.copy")
    return eff, c["achievable_tbs"] / c["peak_tbs"]


def _sku(
    row: Any, where: str, eff: dict[str, float], eff_copy: float, likes: dict[str, str] | None = None
) -> tuple[str, Sku]:
    """One row: named figures win over the estimates derived from the datasheet peaks. A dtype 'like' another
    (the reference's) takes this row's efficiency of that dtype where the row names a figure for it."""
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
    urls = []
    for block in ("matmul_peaks", "copy_peak", "nvlink_peak"):
        b = row.get(block)
        if b is not None:
            _need(
                isinstance(b, dict)
                and _text(b.get("source"))
                and str(b.get("url", "")).startswith("https://"),
                f"{where}: {block}",
                "source must name the datasheet and url its public page (https://...)",
            )
            urls.append(b["url"])
    for dt, peak in peaks.items():
        if dt not in ("source", "url"):
            _need(
                dt in DTYPES and _positive(peak),
                f"{where}: matmul_peaks.{dt}",
                "a dtype and a positive TFLOP/s",
            )
            matmul[dt] = _est(peak, dt, peaks["source"], eff)
    for dt, fig in (row.get("matmul") or {}).items():
        _need(dt in DTYPES, f"{where}: matmul.{dt}", f"not one of {', '.join(DTYPES)}")
        matmul[dt] = _named(fig, f"{where}: matmul.{dt}")
    for dt, like in (likes or {}).items():
        named = (row.get("matmul") or {}).get(like)
        if dt in peaks and dt not in (row.get("matmul") or {}) and named and _positive(peaks.get(like)):
            own = {**eff, dt: named["value"] / peaks[like]}
            matmul[dt] = _est(peaks[dt], dt, f"{peaks['source']} (as this SKU's {like})", own)
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
    nv = row.get("nvlink_peak")
    if nv is not None:
        g = nv.get("gbs_per_direction")
        _need(
            isinstance(g, (int, float)) and not isinstance(g, bool) and g >= 0,
            f"{where}: nvlink_peak",
            "gbs_per_direction: GB/s one way, 0 without NVLink",
        )
    cp = row.get("copy_peak")
    return row["match"], Sku(
        row["key"],
        row["name"],
        matmul,
        copy,
        peak_matmul={dt: float(v) for dt, v in peaks.items() if dt in DTYPES},
        peak_copy_gbs=float(cp["tbs"]) * 1000 if cp else None,
        peak_nvlink_gbs=float(nv["gbs_per_direction"]) if nv is not None else None,
        peak_urls=tuple(urls),
    )


def _load(path: Path) -> tuple[dict[str, float], float, tuple[tuple[str, Sku], ...]]:
    """The reference efficiencies and the SKU rows of ``path``; ValueError naming the file and the row."""
    try:
        data = json.loads(path.read_text())
        _need(isinstance(data, dict) and data.get("schema") == 1, "top level", "an object with schema 1")
        for key in ("about", "source"):
            _need(_text(data.get(key)), "top level", f"{key} must be a non-empty string")
        eff, eff_copy = _efficiency(data.get("reference"))
        likes = _likes(data["reference"])
        rows = data.get("skus")
        _need(isinstance(rows, list) and bool(rows), "skus", "a non-empty list of rows")
        skus = tuple(_sku(row, f"skus[{i}]", eff, eff_copy, likes) for i, row in enumerate(rows))
        keys = [s.key for _, s in skus]
        _need(len(keys) == len(set(keys)), "skus", "duplicate keys")
    except (AttributeError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    return eff, eff_copy, skus


#: EFF, EFF_COPY: the reference SKU's efficiency per dtype (its published or 'like' achievable figure / datasheet
#: dense peak) and of its device copy. SKUS: (pattern, Sku) in the data file's order; the first pattern that
#: matches the device name (case-insensitively, NVML's / torch's name, anchored at its start) wins, so specific
#: rows come before general ones; a name none matches is an unknown SKU.
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


#: How a SKU's NVLinks are wired: on the board (all up), a card bridged to its pair ('links' up of more NVML
#: lists), or a PCIe card (none expected; links up only through an optional bridge).
FORMS = ("sxm", "nvl", "pcie")


@dataclass(frozen=True)
class NvLinkLine:
    """nvlink.E001/E002's line for one SKU: how its NVLinks are wired, how many must be up, each link's speed
    (MB/s, NVML's figure; None where no source gives it), and whether the count or the speed is only an estimate."""

    sku: str
    form: str
    links: int
    link_mbps: int | None
    link_mbps_estimate: bool
    source: str
    links_estimate: bool = False


def _count(v: Any, least: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


def _nvlink(path: Path, keys: set[str]) -> dict[str, NvLinkLine]:
    """The data file's NVLink lines by SKU key; ValueError naming the row. A count or a speed is public (it can
    fail) or an estimate (it warns)."""
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
            form = row.get("form")
            _need(form in FORMS, where, f"form must be one of {', '.join(FORMS)}")
            _need(
                _count(row.get("links"), 0) and (row["links"] == 0) == (form == "pcie"),
                where,
                "links: a positive integer (0 for a pcie card and only there)",
            )
            _need(
                row.get("links_basis", "public") in ("public", "estimate"),
                where,
                "links_basis must be public or estimate",
            )
            mbps = row.get("link_mbps")
            if mbps is not None:
                _need(_count(mbps, 1), where, "link_mbps: a positive integer")
                _need(
                    row.get("link_mbps_basis") in ("public", "estimate"),
                    where,
                    "link_mbps_basis must be public or estimate",
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
            out[row["sku"]] = NvLinkLine(
                row["sku"],
                form,
                row["links"],
                mbps,
                row.get("link_mbps_basis") == "estimate",
                row["source"],
                row.get("links_basis") == "estimate",
            )
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
