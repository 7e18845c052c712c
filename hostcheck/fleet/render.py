"""``hostcheck fleet``'s pages: the nodes' rows as Markdown and as one self-contained HTML page."""

from __future__ import annotations

from typing import Any

from hostcheck.check.render.markdown import html_text, md_cell
from hostcheck.fleet.reports import FAILING, NodeSummary


def _fmt_score(n: NodeSummary) -> str:
    return "-" if n.score is None else str(n.score)


def _short(findings: tuple[dict[str, Any], ...], limit: int = 5) -> list[dict[str, Any]]:
    return [f for f in findings if f.get("status") in FAILING][:limit] or list(findings[:limit])


def render_markdown(nodes: list[NodeSummary], generated: str, extra: str = "", lead: str = "") -> str:
    """``lead`` goes before the nodes' table (a sweep's suspects), ``extra`` after it."""
    ready = sum(n.ready for n in nodes)
    out = [
        "# gpunode fleet report",
        "",
        f"Generated {generated}. **{ready} ready, {len(nodes) - ready} not ready** of {len(nodes)} nodes.",
        *([lead] if lead else []),
        "",
        "| node | score | ready | GPUs | driver | torch | failing checks and fixes |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in nodes:
        if n.problem:
            detail = md_cell(n.problem)
        else:
            detail = "<br>".join(
                f"`{md_cell(f.get('id'))}` {md_cell(f.get('status'))}: {md_cell(f.get('message', ''))}"
                + (f" **Fix:** {md_cell(f['hint'])}" if f.get("hint") else "")
                for f in _short(n.findings)
            )
        cells = [
            md_cell(n.host),
            _fmt_score(n),
            "yes" if n.ready else "**no**",
            str(n.gpus),
            md_cell(n.versions.get("driver") or "-"),
            md_cell(n.versions.get("torch") or "-"),
            detail or "-",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n" + extra


_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
h1{font-size:1.4em}.counts span{display:inline-block;padding:.3em .8em;margin-right:.5em;border-radius:4px}
.ok{background:#d7f5dd}.bad{background:#fbd9d7}
table{border-collapse:collapse;width:100%}th,td{border:1px solid #ccc;padding:.4em;vertical-align:top;text-align:left}
th{background:#f2f2f2}tr.notready td.node{border-left:4px solid #c62828}tr.ready td.node{border-left:4px solid #2e7d32}
.st-fail,.st-error{color:#c62828;font-weight:bold}.st-warn{color:#b26a00;font-weight:bold}
code{background:#f5f5f5;padding:0 .2em}ul{margin:0;padding-left:1.2em}
#sweep-heatmap{width:auto}#sweep-heatmap td.hm{min-width:2.6em;text-align:center;font-size:.8em;padding:.2em}
"""


def render_html(nodes: list[NodeSummary], generated: str, extra: str = "", lead: str = "") -> str:
    """``lead`` goes before the nodes' table (a sweep's suspects and heat map), ``extra`` after it."""
    e = html_text
    ready = sum(n.ready for n in nodes)
    rows = []
    for n in nodes:
        if n.problem:
            detail = f"<span class='st-error'>{e(n.problem)}</span>"
        else:
            items = [
                f"<li><code>{e(str(f.get('id')))}</code> <span class='st-{e(str(f.get('status')))}'>"
                f"{e(str(f.get('status')))}</span> {e(str(f.get('message', '')))}"
                + (f"<br><b>Fix:</b> {e(str(f['hint']))}" if f.get("hint") else "")
                + "</li>"
                for f in _short(n.findings)
            ]
            detail = f"<ul>{''.join(items)}</ul>" if items else "-"
        rows.append(
            f"<tr class='{'ready' if n.ready else 'notready'}'><td class='node'>{e(n.host)}</td>"
            f"<td>{e(_fmt_score(n))}</td><td>{'yes' if n.ready else '<b>no</b>'}</td><td>{n.gpus}</td>"
            f"<td>{e(str(n.versions.get('driver') or '-'))}</td><td>{e(str(n.versions.get('torch') or '-'))}</td>"
            f"<td>{detail}</td></tr>"
        )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>gpunode fleet report</title>"
        f"<style>{_CSS}</style></head><body><h1>gpunode fleet report</h1>"
        f"<p>Generated {e(generated)}, {len(nodes)} nodes.</p>"
        f"<p class='counts'><span class='ok' id='ready-count'>{ready} ready</span>"
        f"<span class='bad' id='notready-count'>{len(nodes) - ready} not ready</span></p>{lead}"
        "<table><thead><tr><th>node</th><th>score</th><th>ready</th><th>GPUs</th><th>driver</th><th>torch</th>"
        f"<th>failing checks and fixes</th></tr></thead><tbody>{''.join(rows)}</tbody></table>{extra}</body></html>\n"
    )


def _fabric(n: NodeSummary) -> list[dict[str, Any]]:
    return [f for f in n.findings if str(f.get("id", "")).startswith(("fabric.", "nvlink."))]


def render_fabric_markdown(nodes: list[NodeSummary]) -> str:
    """Every node's fabric faults (fabric.* and nvlink.* findings, none left out: the table shows five per node)."""
    rows = [
        f"| {md_cell(n.host)} | "
        + "<br>".join(
            f"`{md_cell(f.get('id'))}` {md_cell(f.get('status'))}: {md_cell(f.get('message', ''))}"
            for f in _fabric(n)
        )
        + " |"
        for n in nodes
        if _fabric(n)
    ]
    if not rows:
        return ""
    return (
        "\n## Fabric faults\n\n| node | NVLinks, RDMA ports, GPU-NIC paths, NCCL variables |\n|---|---|\n"
        + "\n".join(rows)
        + "\n"
    )


def render_fabric_html(nodes: list[NodeSummary]) -> str:
    e = html_text
    rows = [
        f"<tr><td class='node'>{e(n.host)}</td><td><ul>"
        + "".join(
            f"<li><code>{e(str(f.get('id')))}</code> <span class='st-{e(str(f.get('status')))}'>"
            f"{e(str(f.get('status')))}</span> {e(str(f.get('message', '')))}</li>"
            for f in _fabric(n)
        )
        + "</ul></td></tr>"
        for n in nodes
        if _fabric(n)
    ]
    if not rows:
        return ""
    return (
        "<h2 id='fabric'>Fabric faults</h2><table><thead><tr><th>node</th><th>NVLinks, RDMA ports, GPU-NIC paths, "
        f"NCCL variables</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
