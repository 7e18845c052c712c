"""Human report: a table grouped by category, fixes under each shortfall, a summary line with the score
and the top fixes. Colour only when writing to a TTY (and NO_COLOR unset)."""

from __future__ import annotations

from hostcheck.registry import CATEGORIES, Status
from hostcheck.report import Report

_COLOURS = {
    Status.PASS: "\033[32m",
    Status.WARN: "\033[33m",
    Status.FAIL: "\033[31m",
    Status.ERROR: "\033[35m",
    Status.SKIP: "\033[2m",
}
_RESET = "\033[0m"
_BOLD = "\033[1m"


def render_text(report: Report, colour: bool = False, verbose: bool = False) -> str:
    def c(code: str, text: str) -> str:
        return f"{code}{text}{_RESET}" if colour else text

    h = report.host
    v = report.versions
    out = [
        c(_BOLD, f"hostcheck {v.get('hostcheck', '')} on {h.get('hostname', '?')}")
        + f"  {report.time}  ({report.duration_s:.1f} s)",
        f"  {h.get('os', '?')}, kernel {h.get('kernel', '?')}; driver {v.get('driver') or 'none'}"
        f" (CUDA {v.get('driver_cuda') or '-'}); torch {v.get('torch') or 'none'}"
        f" (CUDA {v.get('torch_cuda') or '-'}) in {v.get('training_python') or '(not probed)'}",
    ]
    width_title = max((len(r.title) for r in report.results), default=10)
    width_title = min(width_title, 48)
    # The longest id and one space more: baseline.E001 is a character longer than system.E001.
    width_id = max((len(r.id) for r in report.results), default=11) + 1
    for cat in CATEGORIES:
        rs = [r for r in report.results if r.category == cat]
        if not rs:
            continue
        out.append("")
        out.append(c(_BOLD, cat.upper()))
        for r in rs:
            status = c(_COLOURS[r.status], f"{r.status.value.upper():5}")
            title = r.title if len(r.title) <= width_title else r.title[: width_title - 1] + "~"
            out.append(f"  {status} {r.id:{width_id}} {title:{width_title}}  {r.message}")
            if r.status.severity > 0 and r.hint:
                out.append(f"  {'':5} {'':{width_id}} fix: {r.hint}")
            if verbose and r.details:
                out.extend(f"  {'':5} {'':{width_id}}   {d}" for d in r.details)
    vd = report.verdict
    counts = ", ".join(f"{n} {k}" for k, n in vd.counts.items() if n)
    state = c(_COLOURS[Status.PASS], "READY") if vd.ready else c(_COLOURS[Status.FAIL], "NOT READY")
    score = "n/a" if vd.score is None else f"{vd.score}/100"
    out.append("")
    out.append(
        c(_BOLD, f"score {score}  ")
        + state
        + f"  (fail level {vd.fail_level}, min score {vd.min_score}; {counts})"
    )
    if vd.top_fixes:
        out.append("top fixes:")
        out.extend(f"  {i}. [{cid}] {hint}" for i, (cid, hint) in enumerate(vd.top_fixes, 1))
    return "\n".join(out) + "\n"


def render_list(checks: list) -> str:
    lines = [f"{'ID':14} {'CATEGORY':9} {'WEIGHT':>6}  TITLE"]
    for ch in checks:
        lines.append(f"{ch.id:14} {ch.category:9} {ch.weight:>6g}  {ch.title}")
    return "\n".join(lines) + "\n"
