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
import math
import os
import sys
from argparse import ArgumentError
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hostcheck import config, fleet_peers, infile
from hostcheck.exitcodes import EXIT_NOT_READY, EXIT_OK, EXIT_USAGE
from hostcheck.outfile import paths_error, write_report
from hostcheck.registry import Status
from hostcheck.render.markdown import md_cell
from hostcheck.schema import report_schema, type_errors

FAILING = (Status.FAIL, Status.ERROR)
#: A node's report is tens of KiB (a few hundred with every GPU's figures): past this it is not one.
MAX_REPORT_BYTES = 8 << 20
PAGES = ("fleet.md", "fleet.html", "fleet-peers.json", "fleet-peers.prom")

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
    return {Status.ERROR: 0, Status.FAIL: 1, Status.WARN: 2}.get(check.get("status", ""), 3)


def _label(name: str, hostname: str | None) -> str:
    # The inventory name is what the admin acts on; the node's own hostname only when it differs.
    return name if not hostname or hostname == name else f"{name} ({hostname})"


def summarise(host: str, data: dict[str, Any], min_score: int | None = None) -> NodeSummary:
    """Judge one node's JSON report; pure, so it is tested without files. Only a JSON true is ready and only an
    integer is a score: a report whose types are wrong never passes (load() names it first)."""
    score = data.get("score") if isinstance(data.get("score"), dict) else {}
    value = score.get("value")
    if isinstance(value, bool) or not isinstance(value, int):
        value = None
    ready = score.get("ready") is True
    if min_score is not None and (value is None or value < min_score):
        ready = False
    checks = [c for c in data.get("checks") or [] if isinstance(c, dict)]
    findings = sorted(
        (c for c in checks if c.get("status") in (*FAILING, Status.WARN)),
        key=lambda c: (_finding_rank(c), -_weight(c), str(c.get("id", ""))),
    )
    host_info = data.get("host") if isinstance(data.get("host"), dict) else {}
    versions = data.get("versions") if isinstance(data.get("versions"), dict) else {}
    gpus = host_info.get("gpus")
    return NodeSummary(
        host=_label(host, host_info.get("hostname")),
        score=value,
        ready=ready,
        findings=tuple(findings),
        gpus=len(gpus) if isinstance(gpus, list) else 0,
        versions={k: versions.get(k) for k in ("driver", "torch", "torch_cuda")},
    )


def _weight(check: dict[str, Any]) -> float:
    w = check.get("weight")
    return float(w) if isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) else 0.0


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def read_report(path: str) -> dict[str, Any]:
    """One node's report, read and checked (raises ValueError naming what is wrong).

    Nodes write into the report folder, so the file goes through the one reader without following a link (a
    link there may lead anywhere: /dev/zero, another node's file), at most MAX_REPORT_BYTES, UTF-8; then JSON
    without NaN or Infinity, and the fields checked against the report schema's types."""
    try:
        text = infile.read_text(path, MAX_REPORT_BYTES, follow=False)
    except infile.ReadError as exc:
        raise ValueError(exc.why) from None
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("not JSON: nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or "checks" not in data:
        raise ValueError("not a hostcheck report")
    wrong = type_errors(data, report_schema())
    if wrong:
        raise ValueError("; ".join(wrong))
    return data


def _host_of(name: str) -> tuple[str, str]:
    """(the host a report file names, why the name cannot be used or ''). A name that is not UTF-8 is shown with
    its bytes escaped (\\xff) and never used as it is."""
    stem = name[: -len(".json")]
    try:
        stem.encode("utf-8")
    except UnicodeEncodeError:
        return os.fsencode(stem).decode("utf-8", "backslashreplace"), "its file name is not UTF-8"
    if not stem.isprintable():
        return stem.encode("unicode_escape").decode("ascii"), "its file name holds control characters"
    return stem, ""


def load(
    report_dir: Path, expect: list[str], min_score: int | None, raw: dict[str, Any] | None = None
) -> list[NodeSummary]:
    """Every ``<host>.json`` in ``report_dir``, judged; a report that cannot be used is named, not ready, and
    costs no other node its row. ``raw`` (when given) receives each usable report by host."""
    nodes: dict[str, NodeSummary] = {}
    # fleet-peers.json is this command's own output, written beside the reports by default: never a node.
    names = sorted(
        n for n in os.listdir(report_dir) if n.endswith(".json") and n != ".json" and n not in PAGES
    )
    for name in names:
        host, bad_name = _host_of(name)
        if bad_name:
            nodes[host] = NodeSummary(host, None, False, problem=f"unreadable report: {bad_name}")
            continue
        try:
            data = read_report(os.path.join(report_dir, name))
            nodes[host] = summarise(host, data, min_score)
            if raw is not None:
                raw[host] = data
        except ValueError as exc:
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


def render_markdown(nodes: list[NodeSummary], generated: str, extra: str = "") -> str:
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
"""


def render_html(nodes: list[NodeSummary], generated: str, extra: str = "") -> str:
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
        f"<th>failing checks and fixes</th></tr></thead><tbody>{''.join(rows)}</tbody></table>{extra}</body></html>\n"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    """fleet's options."""
    p.add_argument("report_dir", type=Path, help="folder of <host>.json reports")
    p.add_argument("--out", type=Path, help="where to write fleet.md and fleet.html (default: report_dir)")
    p.add_argument("--min-score", type=int, help="a node below this score is not ready, whatever its verdict")
    p.add_argument("--expect", nargs="*", default=[], help="hosts that must have a report")


def _plain(text: str) -> str:
    """A node's name on the terminal: printable ASCII (any standard output encoding takes it, a control
    character in a hostname cannot move the cursor)."""
    return text if text.isascii() and text.isprintable() else text.encode("unicode_escape").decode("ascii")


def run(args: argparse.Namespace) -> int:
    """``hostcheck fleet``: read the reports, write fleet.md and fleet.html, exit by readiness."""
    if not args.report_dir.is_dir():
        raise ArgumentError(None, f"{args.report_dir} is not a folder")
    if args.min_score is not None and not 0 <= args.min_score <= 100:
        raise ArgumentError(None, "--min-score must be between 0 and 100")
    try:  # fleet_peer_tolerance: [thresholds] of the file `hostcheck check` reads, where it exists
        cfg = config.load(None, explicit=False)
    except config.ConfigError as exc:
        raise ArgumentError(None, str(exc)) from None
    tolerance = cfg.thresholds.fleet_peer_tolerance
    raw: dict[str, Any] = {}
    nodes = load(args.report_dir, args.expect, args.min_score, raw)
    slow = fleet_peers.outliers(raw, tolerance)
    if not nodes:
        print(f"hostcheck fleet: error: no reports in {args.report_dir}", file=sys.stderr)
        return EXIT_USAGE
    out = args.out or args.report_dir
    if out.exists() and not out.is_dir():
        raise ArgumentError(None, f"--out {out}: not a folder (fleet writes {' and '.join(PAGES)} into it)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArgumentError(None, f"--out {out}: cannot create it ({exc.strerror or exc})") from None
    # The one report writer: atomic, never through a link (nodes may write into the report folder).
    pages = [(name, str(out / name)) for name in PAGES]
    bad = paths_error(pages)
    if bad:
        raise ArgumentError(None, bad)
    generated = datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    try:
        write_report(
            pages[0][1], render_markdown(nodes, generated, fleet_peers.render_markdown(slow, tolerance))
        )
        write_report(pages[1][1], render_html(nodes, generated, fleet_peers.render_html(slow, tolerance)))
        write_report(pages[2][1], fleet_peers.render_json(slow, tolerance))
        write_report(pages[3][1], fleet_peers.render_prometheus(slow, tolerance))
    except OSError as exc:
        print(f"hostcheck fleet: error: writing the pages: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    not_ready = [_plain(n.host) for n in nodes if not n.ready]
    print(
        f"{len(nodes) - len(not_ready)} ready, {len(not_ready)} not ready; report: {_plain(str(out / 'fleet.html'))}"
    )
    if not_ready:
        print("not ready: " + ", ".join(not_ready))
    if slow:
        print(
            "slower than their fleet peers: "
            + "; ".join(f"{_plain(o.host)} {_plain(o.text())}" for o in slow)
        )
    return EXIT_NOT_READY if not_ready else EXIT_OK
