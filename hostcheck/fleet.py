"""Fleet report: many nodes' ``hostcheck --json`` reports -> one Markdown and one self-contained HTML page.

    hostcheck fleet REPORT_DIR [--out DIR] [--min-score N] [--expect HOST ...]

Each ``REPORT_DIR/<host>.json`` is one node's report. A node named by ``--expect`` without a readable report
counts as not ready ("no report"). Exit 0 when every node is ready, 1 when any is not, 2 on bad usage.
The command line around it (usage errors, signals, --debug) is hostcheck.command.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
from argparse import ArgumentError
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

FAILING = ("fail", "error")
EXIT_READY, EXIT_NOT_READY, EXIT_USAGE = 0, 1, 2

SUMMARY = "many nodes' --json reports -> fleet.md and fleet.html (docs/fleet.md)"
DESCRIPTION = (
    "Fleet report: many nodes' `hostcheck --json` reports -> one Markdown and one self-contained HTML page, "
    "worst node first. REPORT_DIR/<host>.json is one node's report."
)
EPILOG = (
    "A node named by --expect without a readable report counts as not ready. Exit codes: 0 every node "
    "ready, 1 any not ready, 2 usage error or no reports, 129/130/143 SIGHUP/SIGINT/SIGTERM. Docs: docs/fleet.md."
)


@dataclass(frozen=True)
class NodeSummary:
    host: str
    score: int | None
    ready: bool
    problem: str = ""  # why there is no usable report
    findings: tuple[dict[str, Any], ...] = field(default=())  # failing/warning checks, worst first
    gpus: int = 0
    versions: dict[str, Any] = field(default_factory=dict)

    @property
    def sort_key(self) -> tuple[int, int, str]:
        # Worst first: not ready before ready, then lowest score (no report counts as -1).
        return (1 if self.ready else 0, -1 if self.score is None else self.score, self.host)


def _finding_rank(check: dict[str, Any]) -> int:
    return {"error": 0, "fail": 1, "warn": 2}.get(check.get("status", ""), 3)


def _label(name: str, hostname: str | None) -> str:
    # The inventory name is what the admin acts on; the node's own hostname only when it differs.
    return name if not hostname or hostname == name else f"{name} ({hostname})"


def summarise(host: str, data: dict[str, Any], min_score: int | None = None) -> NodeSummary:
    """Judge one node's JSON report; pure, so it is tested without files."""
    score = data.get("score") or {}
    value = score.get("value")
    ready = bool(score.get("ready"))
    if min_score is not None and (value is None or value < min_score):
        ready = False
    findings = sorted(
        (c for c in data.get("checks", []) if c.get("status") in (*FAILING, "warn")),
        key=lambda c: (_finding_rank(c), -float(c.get("weight") or 0), c.get("id", "")),
    )
    return NodeSummary(
        host=_label(host, data.get("host", {}).get("hostname")),
        score=value,
        ready=ready,
        findings=tuple(findings),
        gpus=len(data.get("host", {}).get("gpus") or []),
        versions={k: data.get("versions", {}).get(k) for k in ("driver", "torch", "torch_cuda")},
    )


def load(report_dir: Path, expect: list[str], min_score: int | None) -> list[NodeSummary]:
    nodes: dict[str, NodeSummary] = {}
    for path in sorted(report_dir.glob("*.json")):
        host = path.stem
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or "checks" not in data:
                raise ValueError("not a hostcheck report")
            nodes[host] = summarise(host, data, min_score)
        except (OSError, ValueError) as exc:
            nodes[host] = NodeSummary(host, None, False, problem=f"unreadable report: {exc}")
    for host in expect:
        nodes.setdefault(
            host, NodeSummary(host, None, False, problem="no report (unreachable or hostcheck failed)")
        )
    return sorted(nodes.values(), key=lambda n: n.sort_key)


def _fmt_score(n: NodeSummary) -> str:
    return "-" if n.score is None else str(n.score)


def _short(findings: tuple[dict[str, Any], ...], limit: int = 5) -> list[dict[str, Any]]:
    return [f for f in findings if f.get("status") in FAILING][:limit] or list(findings[:limit])


def render_markdown(nodes: list[NodeSummary], generated: str) -> str:
    ready = sum(n.ready for n in nodes)
    out = [
        "# gpunode fleet report",
        "",
        f"Generated {generated}. **{ready} ready, {len(nodes) - ready} not ready** of {len(nodes)} nodes.",
        "",
        "| node | score | ready | GPUs | driver | torch | failing checks and fixes |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in nodes:
        if n.problem:
            detail = n.problem
        else:
            detail = "<br>".join(
                f"`{f.get('id')}` {f.get('status')}: {f.get('message', '')}"
                + (f" **Fix:** {f['hint']}" if f.get("hint") else "")
                for f in _short(n.findings)
            )
        cells = [
            n.host,
            _fmt_score(n),
            "yes" if n.ready else "**no**",
            str(n.gpus),
            str(n.versions.get("driver") or "-"),
            str(n.versions.get("torch") or "-"),
            (detail or "-").replace("|", "\\|"),
        ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
h1{font-size:1.4em}.counts span{display:inline-block;padding:.3em .8em;margin-right:.5em;border-radius:4px}
.ok{background:#d7f5dd}.bad{background:#fbd9d7}
table{border-collapse:collapse;width:100%}th,td{border:1px solid #ccc;padding:.4em;vertical-align:top;text-align:left}
th{background:#f2f2f2}tr.notready td.node{border-left:4px solid #c62828}tr.ready td.node{border-left:4px solid #2e7d32}
.st-fail,.st-error{color:#c62828;font-weight:bold}.st-warn{color:#b26a00;font-weight:bold}
code{background:#f5f5f5;padding:0 .2em}ul{margin:0;padding-left:1.2em}
"""


def render_html(nodes: list[NodeSummary], generated: str) -> str:
    e = html.escape
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
        f"<span class='bad' id='notready-count'>{len(nodes) - ready} not ready</span></p>"
        "<table><thead><tr><th>node</th><th>score</th><th>ready</th><th>GPUs</th><th>driver</th><th>torch</th>"
        f"<th>failing checks and fixes</th></tr></thead><tbody>{''.join(rows)}</tbody></table></body></html>\n"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """fleet's options."""
    p.add_argument("report_dir", type=Path, help="folder of <host>.json reports")
    p.add_argument("--out", type=Path, help="where to write fleet.md and fleet.html (default: report_dir)")
    p.add_argument("--min-score", type=int, help="a node below this score is not ready, whatever its verdict")
    p.add_argument("--expect", nargs="*", default=[], help="hosts that must have a report")


def run(args: argparse.Namespace) -> int:
    """``hostcheck fleet``: read the reports, write fleet.md and fleet.html, exit by readiness."""
    if not args.report_dir.is_dir():
        raise ArgumentError(None, f"{args.report_dir} is not a folder")
    if args.min_score is not None and not 0 <= args.min_score <= 100:
        raise ArgumentError(None, "--min-score must be between 0 and 100")
    nodes = load(args.report_dir, args.expect, args.min_score)
    if not nodes:
        print(f"hostcheck fleet: error: no reports in {args.report_dir}", file=sys.stderr)
        return EXIT_USAGE
    out = args.out or args.report_dir
    out.mkdir(parents=True, exist_ok=True)
    generated = datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    (out / "fleet.md").write_text(render_markdown(nodes, generated))
    (out / "fleet.html").write_text(render_html(nodes, generated))
    not_ready = [n.host for n in nodes if not n.ready]
    print(f"{len(nodes) - len(not_ready)} ready, {len(not_ready)} not ready; report: {out / 'fleet.html'}")
    if not_ready:
        print("not ready: " + ", ".join(not_ready))
    return EXIT_NOT_READY if not_ready else EXIT_READY
