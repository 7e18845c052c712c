"""Fleet report: many nodes' ``hostcheck --json`` reports -> one Markdown and one self-contained HTML page.

    hostcheck fleet REPORT_DIR [--out DIR] [--min-score N] [--expect HOST ...]

Each ``REPORT_DIR/<host>.json`` is one node's report. A node named by ``--expect`` without a readable report
counts as not ready ("no report"). Exit 0 when every node is ready, 1 when any is not, 2 on bad usage.
The command line around it (usage errors, signals, --debug) is hostcheck.command.
"""

from __future__ import annotations

import argparse
import sys
from argparse import ArgumentError
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hostcheck import config
from hostcheck.exitcodes import EXIT_NOT_READY, EXIT_OK, EXIT_USAGE
from hostcheck.fleet import peers, sweep
from hostcheck.fleet.render import render_fabric_html, render_fabric_markdown, render_html, render_markdown
from hostcheck.fleet.reports import PAGES, load
from hostcheck.outfile import paths_error, write_report

SUMMARY = "many nodes' --json reports -> fleet.md and fleet.html (docs/fleet.md)"
DESCRIPTION = (
    "Fleet report: many nodes' `hostcheck --json` reports -> one Markdown and one self-contained HTML page, "
    "worst node first. REPORT_DIR/<host>.json is one node's report."
)
EPILOG = (
    "A node named by --expect without a readable report counts as not ready. Exit codes: 0 every node "
    "ready, 1 any not ready, 2 usage error or no reports, 129/130/143 SIGHUP/SIGINT/SIGTERM. Docs: docs/fleet.md."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """fleet's options."""
    p.add_argument("report_dir", type=Path, help="folder of <host>.json reports")
    p.add_argument("--out", type=Path, help="where to write fleet.md and fleet.html (default: report_dir)")
    p.add_argument("--min-score", type=int, help="a node below this score is not ready, whatever its verdict")
    p.add_argument("--expect", nargs="*", default=[], help="hosts that must have a report")
    p.add_argument(
        "--sweep",
        type=Path,
        metavar="PATH",
        help="a `hostcheck sweep --json` report: its suspects and heat map go first",
    )
    config.add_option(p)


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
    try:  # fleet_peer_tolerance: [thresholds] of --config, else of the file `hostcheck check` reads, where it exists
        cfg = config.from_args(args)
    except config.ConfigError as exc:
        raise ArgumentError(None, str(exc)) from None
    tolerance = cfg.thresholds.fleet_peer_tolerance
    swept: dict[str, Any] | None = None
    if args.sweep is not None:
        try:
            swept = sweep.read_sweep(str(args.sweep))
        except ValueError as exc:
            raise ArgumentError(None, f"--sweep {args.sweep}: {exc}") from None
    raw: dict[str, Any] = {}
    skip = (
        {args.sweep.name}
        if args.sweep is not None and args.sweep.parent.resolve() == args.report_dir.resolve()
        else set()
    )
    nodes = load(args.report_dir, args.expect, args.min_score, raw, skip)
    slow = peers.outliers(raw, tolerance)
    if not nodes and swept is None:
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
        md_extra = render_fabric_markdown(nodes) + peers.render_markdown(slow, tolerance)
        md_lead = sweep.render_markdown(swept) if swept is not None else ""
        write_report(pages[0][1], render_markdown(nodes, generated, md_extra, md_lead))
        html_extra = render_fabric_html(nodes) + peers.render_html(slow, tolerance)
        html_lead = sweep.render_html(swept) if swept is not None else ""
        write_report(pages[1][1], render_html(nodes, generated, html_extra, html_lead))
        write_report(pages[2][1], peers.render_json(slow, tolerance))
        write_report(pages[3][1], peers.render_prometheus(slow, tolerance))
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
    named = sweep.named_hosts(swept) if swept is not None else []
    if named:
        print("named by the sweep: " + ", ".join(_plain(h) for h in named))
    return EXIT_NOT_READY if not_ready or named else EXIT_OK
