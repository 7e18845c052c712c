"""Pure statistics of interleaved A/B runs: run order, paired ratios, medians, spread, the verdict rule.

A comparison is a baseline A and a tuning B measured in rounds; in each round both run once, back to back,
and the round's ratio is B / A (above 1: the tuning is faster). Pairing cancels what drifts slowly (other
load, thermal state, page cache) because A and B of one round see the same machine.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

HELPS, HURTS, NO_EFFECT, TOO_FEW = "helps", "hurts", "no clear effect", "too few pairs"
#: The verdict rule's defaults (docs/bench.md): a median gain of 5 % that at least 3 pairs in 4 agree on.
THRESHOLD = 0.05
AGREE = 0.75
MIN_PAIRS = 3
#: Paired ratios spread wider than this (largest / smallest) mean the machine was busy or the runs unstable:
#: the comparison is flagged "noisy" and not used for advice.
NOISY_SPREAD = 1.5


def median(xs: Sequence[float]) -> float:
    if not xs:
        raise ValueError("median of nothing")
    return statistics.median(xs)


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default; ``statistics.quantiles``' "inclusive"
    method), q in [0, 1]. q is taken as the nearest fraction k/n with n <= 1000."""
    if not xs:
        raise ValueError("quantile of nothing")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    frac = Fraction(q).limit_denominator(1000)
    k, n = frac.numerator, frac.denominator
    if len(xs) == 1 or k == 0 or k == n:
        return min(xs) if k == 0 else max(xs) if k == n else xs[0]
    return statistics.quantiles(xs, n=n, method="inclusive")[k - 1]


def round_order(n_variants: int, round_index: int) -> list[int]:
    """Variant indices in run order for one round: forward on even rounds, reversed on odd ones.

    With two variants this is A B, B A, A B, ... (ABBA): a linear drift adds as much to A as to B over two
    rounds. With a shared baseline and several tunings it is the same idea, each round mirrored."""
    order = list(range(n_variants))
    return order if round_index % 2 == 0 else order[::-1]


def schedule(n_variants: int, rounds: int, warmup: int = 0) -> list[tuple[int, int, bool]]:
    """Every run of a group in order: (round, variant index, is_warmup). Warm-up rounds come first."""
    out = []
    for r in range(warmup + rounds):
        for v in round_order(n_variants, r):
            out.append((r, v, r < warmup))
    return out


def paired_ratios(a: Sequence[float | None], b: Sequence[float | None]) -> list[tuple[int, float]]:
    """(round, b/a) for every round where both sides gave a positive value."""
    out = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x is None or y is None or x <= 0 or y <= 0:
            continue
        out.append((i, y / x))
    return out


def verdict(
    ratios: Sequence[float], threshold: float = THRESHOLD, agree: float = AGREE, min_pairs: int = MIN_PAIRS
) -> str:
    """helps: median ratio >= 1 + threshold and at least ``agree`` of the pairs above 1;
    hurts: median <= 1 - threshold and at least ``agree`` of the pairs below 1; otherwise no clear effect.
    Fewer than ``min_pairs`` pairs: too few pairs to say (the figures are still reported)."""
    if len(ratios) < min_pairs:
        return TOO_FEW
    m = median(ratios)
    up = sum(1 for r in ratios if r > 1.0) / len(ratios)
    down = sum(1 for r in ratios if r < 1.0) / len(ratios)
    if m >= 1.0 + threshold and up >= agree:
        return HELPS
    if m <= 1.0 - threshold and down >= agree:
        return HURTS
    return NO_EFFECT


@dataclass(frozen=True)
class Summary:
    pairs: int
    median_a: float | None
    median_b: float | None
    #: Median of the paired ratios (not the ratio of the medians).
    ratio: float | None
    ratio_min: float | None
    ratio_max: float | None
    ratio_q1: float | None
    ratio_q3: float | None
    #: Pairs where B was faster / slower than A.
    wins: int
    losses: int
    verdict: str
    #: largest / smallest paired ratio above NOISY_SPREAD.
    noisy: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(
    a: Sequence[float | None],
    b: Sequence[float | None],
    threshold: float = THRESHOLD,
    agree: float = AGREE,
    min_pairs: int = MIN_PAIRS,
) -> Summary:
    """The figures of one comparison from its per-round values (None where a run failed)."""
    pairs = paired_ratios(a, b)
    ratios = [r for _, r in pairs]
    rounds = [i for i, _ in pairs]
    pa = [a[i] for i in rounds]
    pb = [b[i] for i in rounds]
    if not ratios:
        return Summary(0, None, None, None, None, None, None, None, 0, 0, TOO_FEW)
    return Summary(
        pairs=len(ratios),
        median_a=median(pa),  # type: ignore[arg-type]
        median_b=median(pb),  # type: ignore[arg-type]
        ratio=median(ratios),
        ratio_min=min(ratios),
        ratio_max=max(ratios),
        ratio_q1=quantile(ratios, 0.25),
        ratio_q3=quantile(ratios, 0.75),
        wins=sum(1 for r in ratios if r > 1.0),
        losses=sum(1 for r in ratios if r < 1.0),
        verdict=verdict(ratios, threshold, agree, min_pairs),
        noisy=len(ratios) >= 2 and max(ratios) / min(ratios) > NOISY_SPREAD,
    )


def geomean(xs: Sequence[float]) -> float:
    return statistics.geometric_mean(xs)
