"""``hostcheck fleet --sweep PATH``: a sweep's report (``hostcheck sweep --json``) on the fleet page, suspects first,
then the node-pair matrix as a heat map (each cell the pair's best rate over the median node's best rate with any
partner: a node slow with everyone shows as a dark row and column, a bad link as one dark cell).

The report is another machine's file: read through the one bounded reader without following a link, JSON without
NaN, checked against hostcheck/data/sweep-report.schema.json's types; every name is escaped on the page."""

from __future__ import annotations

from typing import Any

from hostcheck.check.render.markdown import html_text, md_cell
from hostcheck.fleet.reports import read_json
from hostcheck.schema import sweep_schema, type_errors

#: A sweep of 16,384 nodes in hypercube pairs is about 115,000 pairs plus the retests (docs/sweep.md: 34 MiB of
#: JSON); 64 MiB holds that with room, and bounds what a hostile file costs to parse (Python's json takes some ten
#: times the text in memory).
MAX_SWEEP_BYTES = 64 << 20
#: The heat map shows at most this many nodes: the suspects first, then their partners, then the rest in order.
HEATMAP_MAX = 64


def read_sweep(path: str) -> dict[str, Any]:
    """The sweep report at ``path``, checked (raises ValueError naming what is wrong)."""
    data = read_json(path, MAX_SWEEP_BYTES)
    if not isinstance(data, dict) or data.get("kind") != "sweep":
        raise ValueError("not a hostcheck sweep report")
    schema = sweep_schema()
    wrong = type_errors(data, schema) or missing_keys(data, schema, schema)
    if wrong:
        raise ValueError("; ".join(wrong))
    nodes = {n.get("node") for n in data.get("nodes") or []}
    if any(p.get("a") not in nodes or p.get("b") not in nodes for p in data.get("pairs") or []):
        raise ValueError("a pair names a node the report does not list")
    return data


def missing_keys(value: Any, schema: Any, root: dict[str, Any], where: str = "") -> list[str]:
    """The keys ``schema`` requires that ``value`` lacks, at every depth (the type check leaves ``required`` out:
    a node's report may lack a key, but the page reads a sweep report's required keys without a default)."""
    if not isinstance(schema, dict):
        return []
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return missing_keys(value, root.get("$defs", {}).get(ref[len("#/$defs/") :]), root, where)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            gone = missing_keys(item, schema["items"], root, f"{where}[{i}]")
            if gone:
                return gone
    if not isinstance(value, dict):
        return []
    gone = [k for k in schema.get("required") or [] if k not in value]
    if gone:
        return [f"{where or 'the report'} lacks {', '.join(gone)}"]
    for key, sub in (schema.get("properties") or {}).items():
        if key in value:
            got = missing_keys(value[key], sub, root, f"{where}.{key}" if where else key)
            if got:
                return got
    return []


def _label(n: dict[str, Any]) -> str:
    return str(n.get("label") or n.get("host") or f"node {n.get('node')}")


def named_hosts(data: dict[str, Any]) -> list[str]:
    return [str(h) for h in (data.get("verdict") or {}).get("hosts") or []]


def _order(data: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The nodes the heat map shows, suspects first, then their partners, then the rest; and how many there are."""
    nodes = [n for n in data.get("nodes") or [] if isinstance(n.get("node"), int)]
    named = {x for f in data.get("suspects") or [] for x in f.get("nodes") or []}
    near = {p[k] for p in data.get("pairs") or [] for k in ("a", "b") if {p["a"], p["b"]} & named}
    ranked = sorted(nodes, key=lambda n: (n["node"] not in named, n["node"] not in near, n["node"]))
    return ranked[:HEATMAP_MAX], len(nodes)


def _cells(data: dict[str, Any]) -> dict[tuple[int, int], dict[str, Any]]:
    cells: dict[tuple[int, int], dict[str, Any]] = {}
    for p in data.get("pairs") or []:
        key = (min(p["a"], p["b"]), max(p["a"], p["b"]))
        if key not in cells or p["bytes_per_s"] > cells[key]["bytes_per_s"]:
            cells[key] = p
    return cells


def _colour(ratio: Any, line: float) -> str:
    """Green at the line and above, through yellow to red at half of it and below."""
    if not isinstance(ratio, (int, float)):
        return "#eee"
    if ratio >= line:
        return "#c8e6c9"
    share = max(0.0, min(1.0, (ratio - line / 2) / (line / 2)))
    return f"hsl({int(share * 50)},85%,70%)"


def _rate(v: float) -> str:
    return f"{v / 1e9:.3g} GB/s" if v >= 1e9 else f"{v / 1e6:.3g} MB/s"


def render_html(data: dict[str, Any]) -> str:
    """The sweep's section of fleet.html: suspects with evidence and fix, then the heat map."""
    e = html_text
    line = float((data.get("thresholds") or {}).get("bw_fraction") or 0.93)
    suspects = data.get("suspects") or []
    head = (
        f"<h2 id='sweep'>Sweep: {len(data.get('nodes') or [])} nodes against their peers</h2>"
        f"<p>{e(str(data.get('time', '')))}, {e(str(data.get('backend', '')))}, {e(str(data.get('mode', '')))} pairs, "
        f"{e(str((data.get('rounds') or {}).get('pairs', 0)))} pair rounds.</p>"
    )
    if suspects:
        items = "".join(
            f"<li><code>{e(str(f['id']))}</code> <b class='st-fail'>{e(', '.join(map(str, f['hosts'])))}</b>: "
            f"{e(str(f['message']))}<br><b>Fix:</b> {e(str(f['hint']))}</li>"
            for f in suspects
        )
        head += f"<ul id='sweep-suspects'>{items}</ul>"
    else:
        head += "<p id='sweep-suspects'>Nothing named.</p>"
    shown, total = _order(data)
    cells = _cells(data)
    if len(shown) < 2:
        return head
    ids = [n["node"] for n in shown]
    rows = []
    for n in shown:
        tds = []
        for b in ids:
            cell = cells.get((min(n["node"], b), max(n["node"], b))) if b != n["node"] else None
            if cell is None:
                tds.append("<td class='hm'></td>")
                continue
            ratio = cell.get("ratio")
            tip = f"{_label(n)} - node {b}: {_rate(cell['bytes_per_s'])}, latency {cell['latency_s'] * 1e6:.3g} us"
            pct = f"{ratio:.0%}" if isinstance(ratio, (int, float)) else "?"
            tds.append(
                f"<td class='hm' style='background:{_colour(ratio, line)}' title='{e(tip)}'>{pct}</td>"
            )
        rows.append(f"<tr><th>{e(_label(n))}</th>{''.join(tds)}</tr>")
    cut = (
        f" The {HEATMAP_MAX} nodes shown of {total}: the suspects, their partners, then in order."
        if total > len(shown)
        else ""
    )
    return (
        head
        + f"<p>Each cell: the pair's best rate over the median node's best rate with any partner (green at "
        f"{line:.0%} and above).{cut}</p><table id='sweep-heatmap'><thead><tr><th></th>"
        + "".join(f"<th>{i}</th>" for i in ids)
        + f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def render_markdown(data: dict[str, Any]) -> str:
    """The sweep's section of fleet.md: the suspects (the page holds the heat map)."""
    out = ["", f"## Sweep: {len(data.get('nodes') or [])} nodes against their peers", ""]
    suspects = data.get("suspects") or []
    if not suspects:
        return "\n".join([*out, "Nothing named.", ""])
    out += ["| finding | nodes | what | fix |", "|---|---|---|---|"]
    for f in suspects:
        cells = [f["id"], ", ".join(map(str, f["hosts"])), f["message"], f["hint"]]
        out.append("| " + " | ".join(md_cell(c) for c in cells) + " |")
    return "\n".join([*out, ""])
