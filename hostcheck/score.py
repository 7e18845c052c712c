"""Readiness score and verdict, computed from results only (never inside a check).

score = round(100 * sum(weight * credit(status)) / sum(weight of non-skipped checks)), 99 at most when any
check lost credit
credit: pass 1, warn 0.5, fail 0, error 0; skipped checks are left out of both sums.
Not ready when any result is at or above the fail level, or the score is below --min-score.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hostcheck.registry import Result, Status

CREDIT = {Status.PASS: 1.0, Status.WARN: 0.5, Status.FAIL: 0.0, Status.ERROR: 0.0}
#: The one list of fail levels (config.py, the command line and the report schema follow it): the least
#: Status.severity that makes a node not ready; none: nothing does.
FAIL_LEVELS = {"warn": 1, "fail": 2, "none": 99}


@dataclass(frozen=True)
class Verdict:
    score: int | None
    ready: bool
    fail_level: str
    min_score: int
    counts: dict[str, int] = field(default_factory=dict)
    blocking: tuple[str, ...] = ()
    top_fixes: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "value": self.score,
            "ready": self.ready,
            "fail_level": self.fail_level,
            "min_score": self.min_score,
            "counts": dict(self.counts),
            "blocking": list(self.blocking),
            "top_fixes": [{"id": i, "hint": h} for i, h in self.top_fixes],
        }


def score(results: list[Result]) -> int | None:
    num = den = 0.0
    for r in results:
        if r.status == Status.SKIP:
            continue
        num += r.weight * CREDIT[r.status]
        den += r.weight
    if den == 0:
        return None
    # 100 only when nothing lost credit: with many checks one warning would otherwise round up to 100.
    return min(round(100 * num / den), 99 if num < den else 100)


def verdict(results: list[Result], fail_level: str = "fail", min_score: int = 0, top: int = 3) -> Verdict:
    threshold = FAIL_LEVELS[fail_level]
    blocking = tuple(r.id for r in results if r.status.severity >= threshold)
    s = score(results)
    ready = not blocking and (s is None or s >= min_score) and not (min_score > 0 and s is None)
    ranked = sorted(
        (r for r in results if r.status.severity > 0 and r.hint),
        key=lambda r: (-r.status.severity, -r.weight, r.id),
    )
    fixes: list[tuple[str, str]] = []
    for r in ranked:  # one line per distinct fix: later checks often repeat an earlier one's fix
        if not any(r.hint == h or (r.hint or "").startswith(h) for _i, h in fixes):
            fixes.append((r.id, r.hint or ""))
    counts = Counter(r.status.value for r in results)
    return Verdict(
        score=s,
        ready=ready,
        fail_level=fail_level,
        min_score=min_score,
        counts={k.value: counts.get(k.value, 0) for k in Status},
        blocking=blocking,
        top_fixes=tuple(fixes[:top]),
    )
