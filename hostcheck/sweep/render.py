"""The sweep's report: the JSON document (``--json PATH``, schema_version 1, hostcheck/data/sweep-report.schema.json)
and the text rank 0 prints: suspects first with their evidence and fix, then every node, then the node-pair matrix."""

from __future__ import annotations

import json
from typing import Any

from hostcheck import SCHEMA_VERSION, __version__
from hostcheck.check.render.summary import clean
from hostcheck.exitcodes import EXIT_NOT_READY, EXIT_OK
from hostcheck.inside import sweep_plan as plan
from hostcheck.sweep.judge import NODE_NET, Judgement, flops, rate, seconds

#: The text shows the node-pair matrix up to this many nodes (the JSON and the fleet page hold all of it).
TEXT_MATRIX_MAX = 16


def exit_code(j: Judgement) -> int:
    """0 when every node was measured, judged and nothing named; 1 otherwise (named, a rank failed or died mid-sweep,
    or nothing judged): what was not measured never passes."""
    return EXIT_NOT_READY if j.suspects or j.errors or j.broken or not j.judged else EXIT_OK


def build_report(record: dict[str, Any], j: Judgement, meta: dict[str, Any]) -> dict[str, Any]:
    """The report's document: ``meta`` is what the orchestrator adds (launcher, time, thresholds, duration)."""
    suspects = sorted(j.suspects, key=lambda f: (f.id, f.nodes))
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "hostcheck", "version": __version__},
        "kind": "sweep",
        **meta,
        "backend": record["backend"],
        "run_id": record.get("run_id", ""),
        "world_ranks": record.get("world_ranks", 0),
        "mode": record["mode"],
        "rounds": record.get("rounds", {}),
        "sizes": record.get("sizes", {}),
        "verdict": {
            "named": len(suspects),
            "hosts": j.named_hosts,
            "judged": list(j.judged),
            "exit_code": exit_code(j),
        },
        "suspects": [f.to_dict() for f in suspects],
        "unmeasured": [f.to_dict() for f in sorted(j.errors, key=lambda f: f.nodes)],
        "nodes": list(j.nodes),
        "pairs": list(j.pairs),
        "groups": list(j.groups),
        "notes": list(j.notes),
        "errors": record.get("errors", []),
        "phases_s": record.get("phases_s", {}),
        "wall_s": record.get("wall_s", 0.0),
    }


def render_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=1, sort_keys=False) + "\n"


def render_text(report: dict[str, Any]) -> str:
    """For a person: what was run, what is named (with evidence and the fix), every node, the matrix."""
    nodes = report["nodes"]
    rounds = report.get("rounds", {})
    v = report["verdict"]
    pairing = "all pairs" if report["mode"] == plan.ALL else "hypercube pairs"
    out = [
        f"hostcheck sweep: {len(nodes)} nodes, {report['world_ranks']} ranks ({report['backend']}), {pairing}: "
        f"{rounds.get('pairs', 0)} rounds + {rounds.get('retest', 0)} retest, all_reduce {rounds.get('allreduce', 0)} "
        f"levels; {report['wall_s']:.1f} s",
    ]
    if report["suspects"]:
        out.append(f"NAMED: {', '.join(clean(h) for h in v['hosts'])}")
        for f in report["suspects"]:
            out.append(f"  {f['id']} {clean(f['message'])}")
            out += [f"      evidence: {clean(e)}" for e in f["evidence"]]
            out.append(f"      fix: {clean(f['hint'])}")
    elif report.get("unmeasured"):
        out.append("nothing named, but the sweep is incomplete (see below): not a pass")
    elif v["judged"]:
        out.append(f"nothing named ({', '.join(v['judged'])} judged against their peers)")
    else:
        out.append("nothing judged: too few peers (see the notes)")
    for f in report.get("unmeasured") or []:
        out.append(f"  NOT MEASURED {f['id']} {clean(f['message'])}")
        out.append(f"      fix: {clean(f['hint'])}")
    out.append("")
    out.append(f"{'node':<24} {'state':<9} {'compute':>14} {'best link':>12} {'latency':>10}")
    for n in nodes:
        mark = "*" if n.get("suspect") else " "
        comp = flops(n["compute_flops_per_s"]) if n.get("compute_flops_per_s") else "-"
        cap = rate(n["capacity_bytes_per_s"]) if n.get("capacity_bytes_per_s") else "-"
        lat = seconds(n["latency_floor_s"]) if n.get("latency_floor_s") else "-"
        out.append(
            f"{mark}{clean(n.get('label') or str(n['node']))[:23]:<23} {n['state']:<9} {comp:>14} {cap:>12} {lat:>10}"
        )
    if 2 <= len(nodes) <= TEXT_MATRIX_MAX:
        out += ["", "node-pair rates, MB/s (best of the repeats; * below the line):", *_matrix(report)]
    out += [f"note: {clean(n)}" for n in report["notes"]]
    out += [f"error: node {e['node']} rank {e['rank']}: {clean(e['error'])}" for e in report["errors"]]
    return "\n".join(out) + "\n"


def matrix(report: dict[str, Any]) -> dict[tuple[int, int], dict[str, Any]]:
    """The node pairs' best repeats by (a, b), a < b: rate, latency and ratio (the fleet page's heat map)."""
    cells: dict[tuple[int, int], dict[str, Any]] = {}
    for p in report["pairs"]:
        key = plan.pair(int(p["a"]), int(p["b"]))
        got = cells.get(key)
        if got is None or p["bytes_per_s"] > got["bytes_per_s"]:
            cells[key] = p
    return cells


def _matrix(report: dict[str, Any]) -> list[str]:
    cells = matrix(report)
    slow = {tuple(f["nodes"]) for f in report["suspects"] if f["kind"] == "link"}
    named = {x for f in report["suspects"] if f["id"] == NODE_NET for x in f["nodes"]}
    ids = [n["node"] for n in report["nodes"]]
    lines = ["      " + "".join(f"{i:>9}" for i in ids)]
    for a in ids:
        row = f"{a:>6}"
        for b in ids:
            cell = cells.get(plan.pair(a, b)) if a != b else None
            if cell is None:
                row += f"{'-':>9}"
                continue
            star = "*" if plan.pair(a, b) in slow or a in named or b in named else " "
            row += f"{cell['bytes_per_s'] / 1e6:>8.4g}{star}"
        lines.append(row)
    return lines
