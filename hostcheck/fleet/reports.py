"""``hostcheck fleet``'s input: each node's ``--json`` report read (bounded, never through a link), checked
against the report schema, and summarised to one row: its score, readiness, GPUs, versions and findings."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hostcheck import infile
from hostcheck.registry import Status
from hostcheck.schema import report_schema, type_errors

FAILING = (Status.FAIL, Status.ERROR)
#: A node's report is tens of KiB (a few hundred with every GPU's figures): past this it is not one.
MAX_REPORT_BYTES = 8 << 20
#: What ``hostcheck fleet`` writes (into the report folder by default): never read as a node's report.
PAGES = ("fleet.md", "fleet.html", "fleet-peers.json", "fleet-peers.prom")


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


def read_json(path: str, limit: int) -> Any:
    """Another machine's JSON file: through the one reader without following a link, at most ``limit`` bytes,
    UTF-8, without NaN or Infinity (raises ValueError naming what is wrong)."""
    try:
        text = infile.read_text(path, limit, follow=False)
    except infile.ReadError as exc:
        raise ValueError(exc.why) from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("not JSON: nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from None


def read_report(path: str) -> dict[str, Any]:
    """One node's report, read and checked (raises ValueError naming what is wrong).

    Nodes write into the report folder, so the file goes through the one reader without following a link (a
    link there may lead anywhere: /dev/zero, another node's file), at most MAX_REPORT_BYTES, UTF-8; then JSON
    without NaN or Infinity, and the fields checked against the report schema's types."""
    data = read_json(path, MAX_REPORT_BYTES)
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
    report_dir: Path,
    expect: list[str],
    min_score: int | None,
    raw: dict[str, Any] | None = None,
    skip: set[str] | frozenset[str] = frozenset(),
) -> list[NodeSummary]:
    """Every ``<host>.json`` in ``report_dir``, judged; a report that cannot be used is named, not ready, and
    costs no other node its row. ``raw`` (when given) receives each usable report by host; ``skip``: file names
    that are no node's (the sweep report given with --sweep)."""
    nodes: dict[str, NodeSummary] = {}
    # fleet-peers.json is this command's own output, written beside the reports by default: never a node.
    names = sorted(
        n
        for n in os.listdir(report_dir)
        if n.endswith(".json") and n != ".json" and n not in PAGES and n not in skip
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
