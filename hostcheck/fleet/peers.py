"""The fleet comparison: a node whose GPU figures are more than a tolerance below the median of the other nodes
with the same GPU model (``hostcheck fleet``; ``[thresholds] fleet_peer_tolerance``, 10% by default).

A node can clear every SKU line and still be the slow member of a fleet that trains one job: every step waits
for it. Each node's figure is the median over its GPUs of that model (one slow GPU is the node check's
peer rule, workload.E001-E008); all_reduce bus bandwidth (workload.E013) is compared between nodes with the
same model and GPU count. No public tool gives a tolerance for this comparison, so a flag is a warning: listed
on the fleet page with the numbers, never a reason for "not ready". Reports are other machines' files: every
value is checked before use, and anything unexpected is left out, never raised.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hostcheck.check.render.markdown import html_text, md_cell
from hostcheck.check.render.prometheus import Families
from hostcheck.checks.workload.peers import peer_ratios
from hostcheck.registry import Status

#: (report part, key, figure name, display unit, scale from the base unit)
GPU_FIGURES = (
    ("matmul_flops_per_second", "bf16", "matmul_bf16", "TFLOP/s", 1e12),
    ("copy_bytes_per_second", "device_copy", "device_copy", "GB/s", 1e9),
    ("copy_bytes_per_second", "h2d_pinned", "h2d_pinned", "GB/s", 1e9),
)
ALLREDUCE = "allreduce_busbw"
_MAX_GPUS = 1024


@dataclass(frozen=True)
class FleetOutlier:
    host: str
    #: The GPU model (and, for all_reduce, "x N" GPUs) the node is compared within.
    group: str
    figure: str
    value: float
    median: float
    ratio: float
    unit: str
    tolerance: float

    def text(self) -> str:
        return (
            f"{self.figure} {self.value:.4g} {self.unit} = {self.ratio:.0%} of the fleet median "
            f"{self.median:.4g} {self.unit} for {self.group} (more than {self.tolerance:.0%} below)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "group": self.group,
            "figure": self.figure,
            "value": self.value,
            "median": self.median,
            "ratio": round(self.ratio, 4),
            "unit": self.unit,
            "tolerance": self.tolerance,
        }


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:  # an integer too large for a float: no figure
        return None
    return f if math.isfinite(f) and f > 0 else None


def _name(v: Any) -> str | None:
    return v[:200] if isinstance(v, str) and v.strip() else None


def node_figures(data: Any) -> dict[tuple[str, str], tuple[float, str]]:
    """(group, figure) -> (value in its display unit, unit) for one node's JSON report."""
    if not isinstance(data, Mapping):
        return {}
    gpus = data.get("gpus")
    gpus = [g for g in gpus[:_MAX_GPUS] if isinstance(g, Mapping)] if isinstance(gpus, list) else []
    per: dict[tuple[str, str], list[float]] = {}
    units: dict[str, str] = {}
    for g in gpus:
        model = _name(g.get("name"))
        if model is None:
            continue
        for part, key, figure, unit, scale in GPU_FIGURES:
            table = g.get(part)
            v = _num(table.get(key)) if isinstance(table, Mapping) else None
            if v is not None:
                per.setdefault((model, figure), []).append(v / scale)
                units[figure] = unit
    out = {k: (statistics.median(v), units[k[1]]) for k, v in per.items()}
    models = {_name(g.get("name")) for g in gpus} - {None}
    checks = data.get("checks")
    e013 = (
        next(
            (c for c in checks if isinstance(c, Mapping) and c.get("id") == "workload.E013"),
            None,
        )
        if isinstance(checks, list)
        else None
    )
    bus = (
        _num(e013.get("value"))
        if e013 is not None and e013.get("status") in (Status.PASS, Status.WARN, Status.FAIL)
        else None
    )
    if bus is not None and len(models) == 1:
        out[(f"{models.pop()} x {len(gpus)}", ALLREDUCE)] = (bus, "GB/s")
    return out


def outliers(reports: Mapping[str, Any], tolerance: float) -> list[FleetOutlier]:
    """Every node more than ``tolerance`` below the median of the other nodes of its group, per figure."""
    table: dict[tuple[str, str], dict[str, float]] = {}
    units: dict[str, str] = {}
    for host, data in reports.items():
        for key, (value, unit) in node_figures(data).items():
            table.setdefault(key, {})[host] = value
            units[key[1]] = unit
    out = []
    for (group, figure), values in sorted(table.items()):
        for host, ratio in sorted(peer_ratios(values).items()):
            if ratio < 1.0 - tolerance:
                v = values[host]
                out.append(FleetOutlier(host, group, figure, v, v / ratio, ratio, units[figure], tolerance))
    return out


def render_markdown(found: list[FleetOutlier], tolerance: float) -> str:
    """The fleet page's section on nodes slower than their peers (Markdown)."""
    head = [
        "",
        "## Nodes slower than their fleet peers",
        "",
        f"A node more than {tolerance:.0%} below the median of the other nodes with the same GPU model "
        "(`fleet_peer_tolerance`); a warning, not a readiness verdict.",
        "",
    ]
    if not found:
        return "\n".join([*head, "None.", ""])
    rows = ["| node | GPUs | figure | node | fleet median | ratio |", "|---|---|---|---|---|---|"]
    for o in found:
        cells = [
            o.host,
            o.group,
            o.figure,
            f"{o.value:.4g} {o.unit}",
            f"{o.median:.4g} {o.unit}",
            f"{o.ratio:.0%}",
        ]
        rows.append("| " + " | ".join(md_cell(c) for c in cells) + " |")
    return "\n".join([*head, *rows, ""])


def render_html(found: list[FleetOutlier], tolerance: float) -> str:
    """The same section for the HTML page (escaped: host and model names come from the reports)."""
    e = html_text
    intro = (
        f"<h2>Nodes slower than their fleet peers</h2><p>A node more than {tolerance:.0%} below the median of "
        "the other nodes with the same GPU model (<code>fleet_peer_tolerance</code>); a warning, not a "
        "readiness verdict.</p>"
    )
    if not found:
        return intro + "<p id='fleet-peers'>None.</p>"
    rows = "".join(
        f"<tr><td>{e(o.host)}</td><td>{e(o.group)}</td><td>{e(o.figure)}</td><td>{o.value:.4g} {e(o.unit)}</td>"
        f"<td>{o.median:.4g} {e(o.unit)}</td><td class='st-warn'>{o.ratio:.0%}</td></tr>"
        for o in found
    )
    return (
        intro + "<table id='fleet-peers'><thead><tr><th>node</th><th>GPUs</th><th>figure</th><th>node</th>"
        f"<th>fleet median</th><th>ratio</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def render_json(found: list[FleetOutlier], tolerance: float) -> str:
    """``hostcheck fleet --peers-json``: the comparison as data (docs/fleet.md)."""
    import json

    doc = {"schema_version": 1, "tolerance": tolerance, "outliers": [o.to_dict() for o in found]}
    return json.dumps(doc, indent=2) + "\n"


def render_prometheus(found: list[FleetOutlier], tolerance: float) -> str:
    """``hostcheck fleet --peers-prometheus``: a node_exporter textfile for the control node."""
    out = Families()
    out.add("hostcheck_fleet_peer_tolerance", {}, tolerance)
    out.add("hostcheck_fleet_peer_outliers", {}, len(found))
    for o in found:
        labels = {"node": o.host, "group": o.group, "figure": o.figure}
        out.add("hostcheck_fleet_peer_ratio", labels, round(o.ratio, 4))
    return out.render()
