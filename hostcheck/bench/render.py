"""Text table and the versioned JSON document of a bench run. Pure: data in, text out."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hostcheck import __version__
from hostcheck.bench import BENCH_SCHEMA_VERSION
from hostcheck.bench.plan import Skip
from hostcheck.bench.run import ERROR, FINDING, BenchRun, Comparison
from hostcheck.bench.stats import median
from hostcheck.check.render import visible

COLUMNS = ("tuning", "workload", "A (baseline)", "B (tuning)", "A", "B", "ratio", "spread", "n", "verdict")


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "~"


def row(c: Comparison) -> tuple[str, ...]:
    s = c.summary
    a_med = s.median_a if s and s.pairs else _med(c.a.values)
    b_med = s.median_b if s and s.pairs else _med(c.b.values)
    if c.status == FINDING:
        a_med = None if c.a.error else a_med
        verdict = f"{c.verdict} (A breaks)" if c.a.error else f"{c.verdict} (B breaks)"
    elif c.status == ERROR:
        verdict = "error"
    else:
        verdict = c.verdict + (" (noisy)" if s and s.noisy else "")
    ratio = f"{s.ratio:.2f}x" if s and s.ratio is not None else "-"
    spread = f"{s.ratio_min:.2f}-{s.ratio_max:.2f}" if s and s.ratio_min is not None else "-"
    return (
        c.tuning,
        _cut(c.title, 34),
        _cut(c.a.label, 38),
        _cut(c.b.label, 42),
        _num(a_med),
        _num(b_med),
        ratio,
        spread,
        str(s.pairs if s else 0),
        verdict,
    )


def _med(values: Sequence[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return median(vs) if vs else None


def table(comparisons: Sequence[Comparison]) -> str:
    rows = [COLUMNS] + [row(c) for c in comparisons]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    right = {4, 5, 6, 8}
    out = []
    for r in rows:
        cells = [r[i].rjust(widths[i]) if i in right else r[i].ljust(widths[i]) for i in range(len(r))]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out) + "\n"


def render_text(doc: dict[str, Any], comparisons: Sequence[Comparison], skips: Sequence[Skip]) -> str:
    h = doc["host"]
    py = doc["python"]
    lines = [
        f"hostcheck bench on {h.get('hostname')}: {h.get('os')}, {h.get('cpus')} CPUs "
        f"({h.get('physical_cores')} cores), {', '.join(h.get('gpus') or []) or 'no GPU'}{_container(h)}",
        f"training Python {py.get('executable')} ({py.get('source')}): Python {py.get('version')}, "
        f"torch {py.get('torch')}, {py.get('pil')}",
        f"{doc['options']['pairs']} pairs per comparison after {doc['options']['warmup_pairs']} warm-up, "
        f"{doc['options']['images']} images per pipeline epoch; values in {_units(comparisons)}; "
        "ratio = B / A paired by round (above 1: B is faster), spread = min-max of the pairs",
    ]
    if doc["environment"]["stripped"]:
        gone = ", ".join(f"{k}={v}" for k, v in sorted(doc["environment"]["stripped"].items()))
        lines.append(f"removed from every run's environment (each comparison sets its own): {gone}")
    lines.append("")
    # Host and GPU names and the workers' error lines come from the node: shown with their control characters
    # escaped, so none of them starts a line of its own.
    text = "\n".join(visible(x) for x in lines) + "\n"
    if comparisons:
        text += table(comparisons)
    else:
        text += "(nothing measured)\n"
    extra = []
    for c in comparisons:
        if c.status == FINDING:
            extra.append(f"FINDING {c.key}: {c.message}")
        elif c.status == ERROR:
            extra.append(f"ERROR {c.key}: {c.message}")
        elif c.message:
            extra.append(f"note {c.key}: {c.message}")
    for p in doc.get("problems") or []:
        extra.append(f"ERROR {p}")
    for c in comparisons:
        for n in c.notes:
            extra.append(f"{c.b.key} [{c.group}]: {n}")
    seen = set()
    for s in skips:
        line = f"skipped {s.tuning} ({s.what}): {s.reason}" + (f"; hint: {s.hint}" if s.hint else "")
        if line not in seen:
            seen.add(line)
            extra.append(line)
    if extra:
        text += "\n" + "\n".join(visible(x) for x in _dedupe(extra)) + "\n"
    return text


def _dedupe(lines: list[str]) -> list[str]:
    seen: set[str] = set()
    return [x for x in lines if not (x in seen or seen.add(x))]


def _container(h: dict[str, Any]) -> str:
    return f", in a {h['container']} container" if h.get("container") else ""


def _units(comparisons: Sequence[Comparison]) -> str:
    units = sorted({c.unit for c in comparisons if c.unit})
    return "/".join(units) or "img/s"


def document(
    host: dict[str, Any],
    python: dict[str, Any],
    environment: dict[str, Any],
    options: dict[str, Any],
    bench: BenchRun,
    skips: Sequence[Skip],
    advice: dict[str, Any] | None,
    started: str,
    duration_s: float,
) -> dict[str, Any]:
    return {
        "schema": "hostcheck-bench",
        "schema_version": BENCH_SCHEMA_VERSION,
        "hostcheck": __version__,
        "time": started,
        "duration_s": round(duration_s, 1),
        "host": host,
        "python": python,
        "environment": environment,
        "options": options,
        "verdict_rule": {
            "helps": "median paired ratio >= 1.05 and at least 3 of 4 pairs above 1",
            "hurts": "median paired ratio <= 0.95 and at least 3 of 4 pairs below 1",
            "too few pairs": "fewer than 3 pairs",
            "noisy": "largest / smallest paired ratio above 1.5: shown, not used for advice",
        },
        "comparisons": [c.to_dict() for c in bench.comparisons],
        "skipped": [s.to_dict() for s in skips],
        "problems": list(bench.problems),
        "interrupted": bench.interrupted,
        "runs": [r.to_dict() for r in bench.runs],
        "processes": [dict(p) for p in bench.processes],
        "advice": advice,
    }


def render_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n"
