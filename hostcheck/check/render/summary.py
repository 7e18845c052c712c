"""One line for a report: ``--summary`` (node-problem-detector shows at most 80 characters of a plugin's
output) and the reason of a Slurm drain.

The line names the worst finding by its check id, so an admin reading ``sinfo -R`` can look the fix up with
``hostcheck check --only <id>``.
"""

from __future__ import annotations

import re

from hostcheck.registry import Result
from hostcheck.report import Report

LIMIT = 80


def worst(report: Report) -> list[Result]:
    """The findings that make the node not ready, worst first (status, then weight)."""
    blocking = set(report.verdict.blocking)
    found = [r for r in report.results if r.id in blocking]
    return sorted(found, key=lambda r: (-r.status.severity, -r.weight, r.id))


def clean(text: str) -> str:
    """Printable ASCII on one line: Slurm and terminals get nothing they could misread."""
    text = text.encode("ascii", "replace").decode()
    return re.sub(r"[^\x20-\x7e]+", " ", re.sub(r"\s+", " ", text)).strip()


def fit(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 3)].rstrip() + "..."


def headline(report: Report, limit: int = LIMIT, prefix: str = "") -> str:
    """``gpu.E005 GPU 3: row remap pending (+2 more)`` when not ready; ``ready, score 97`` when ready. A finding's
    ``brief`` (device and key number) stands for it where the check gave one, else its message's start."""
    lead = f"{prefix}: " if prefix else ""
    v = report.verdict
    if v.ready:
        return fit(clean(f"{lead}ready, score {v.score if v.score is not None else 'n/a'}"), limit)
    found = worst(report)
    if not found:  # only the minimum score stands in the way
        return fit(clean(f"{lead}score {v.score} below the minimum {v.min_score}"), limit)
    more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
    first = found[0]
    body = clean(f"{lead}{first.id} {first.brief or first.message}")
    return fit(body, limit - len(more)) + more


def render_summary(report: Report) -> str:
    return headline(report) + "\n"
