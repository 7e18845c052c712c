"""hostcheck.bench.stats: medians, paired ratios, spread, the verdict rule, the interleaved run order."""

from __future__ import annotations

import pytest

from hostcheck.bench import stats as S


def test_median_and_quantiles():
    assert S.median([3.0, 1.0, 2.0]) == 2.0
    assert S.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert S.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.25) == 2.0
    assert S.quantile([1.0, 2.0, 3.0, 4.0], 0.75) == pytest.approx(3.25)
    assert S.quantile([7.0], 0.9) == 7.0
    with pytest.raises(ValueError):
        S.median([])


def test_paired_ratios_skip_failed_and_nonpositive_rounds():
    a = [100.0, None, 100.0, 0.0, 50.0]
    b = [130.0, 120.0, None, 10.0, 75.0]
    assert S.paired_ratios(a, b) == [(0, 1.3), (4, 1.5)]


def test_verdict_helps_needs_the_threshold_and_agreement():
    assert S.verdict([1.36, 1.30, 1.41, 1.33, 1.38]) == S.HELPS
    # A median gain of 8 % but two pairs of five disagree: not clear.
    assert S.verdict([1.08, 1.10, 0.97, 0.96, 1.09]) == S.NO_EFFECT
    # Every pair agrees but the gain is only 3 %.
    assert S.verdict([1.03, 1.02, 1.04, 1.03, 1.03]) == S.NO_EFFECT
    # 4 of 5 (0.8 >= 3/4) is agreement enough.
    assert S.verdict([1.2, 1.3, 0.99, 1.25, 1.22]) == S.HELPS


def test_verdict_hurts_is_symmetric():
    assert S.verdict([0.73, 0.70, 0.75, 0.79, 0.72]) == S.HURTS
    assert S.verdict([0.94, 0.95, 1.01, 0.90, 0.93]) == S.HURTS
    assert S.verdict([0.96, 0.97, 0.98]) == S.NO_EFFECT


def test_too_few_pairs_is_its_own_verdict():
    assert S.verdict([1.5, 1.6]) == S.TOO_FEW
    assert S.verdict([0.5]) == S.TOO_FEW
    assert S.verdict([1.5, 1.6], min_pairs=2) == S.HELPS


def test_summarize_reports_medians_of_the_paired_rounds_and_spread():
    a = [100.0, 110.0, 90.0, 100.0, None]
    b = [136.0, 150.0, 120.0, 135.0, 140.0]
    s = S.summarize(a, b)
    assert s.pairs == 4
    assert s.median_a == 100.0 and s.median_b == 135.5  # round 4 had no A: left out of both medians
    assert s.ratio == pytest.approx(S.median([1.36, 150 / 110, 120 / 90, 1.35]))
    assert s.ratio_min == pytest.approx(120 / 90) and s.ratio_max == pytest.approx(150 / 110)
    assert s.ratio_q1 <= s.ratio <= s.ratio_q3
    assert s.wins == 4 and s.losses == 0 and s.verdict == S.HELPS
    d = s.to_dict()
    assert d["verdict"] == "helps" and d["pairs"] == 4


def test_a_wide_spread_is_flagged_noisy():
    assert not S.summarize([100.0] * 3, [130.0, 140.0, 150.0]).noisy
    s = S.summarize([100.0] * 3, [119.0, 189.0, 299.0])
    assert s.noisy and s.verdict == S.HELPS  # the verdict rule is unchanged; advice leaves it out
    assert not S.summarize([100.0], [300.0]).noisy


def test_summarize_with_nothing_paired():
    s = S.summarize([None, 1.0], [2.0, None])
    assert s.pairs == 0 and s.ratio is None and s.verdict == S.TOO_FEW


def test_two_variants_run_abba():
    order = [(r, v) for r, v, _ in S.schedule(2, 4)]
    assert order == [(0, 0), (0, 1), (1, 1), (1, 0), (2, 0), (2, 1), (3, 1), (3, 0)]
    assert "".join("AB"[v] for _, v in order) == "ABBAABBA"


def test_shared_baseline_rounds_are_mirrored_and_warmup_comes_first():
    sched = S.schedule(3, 2, warmup=1)
    assert [(r, v, w) for r, v, w in sched] == [
        (0, 0, True),
        (0, 1, True),
        (0, 2, True),
        (1, 2, False),
        (1, 1, False),
        (1, 0, False),
        (2, 0, False),
        (2, 1, False),
        (2, 2, False),
    ]


def test_geomean():
    assert S.geomean([0.5, 2.0]) == pytest.approx(1.0)
