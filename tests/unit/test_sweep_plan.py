"""The sweep's schedule and peer rule (hostcheck.inside.sweep_plan): rounds of disjoint pairs, the bisection levels,
the modified z-score of Iglewicz and Hoaglin (NIST's Engineering Statistics Handbook 1.3.5.17), a node against its
best partner and a link against both its ends, what is measured again, and the test faults' parser."""

from __future__ import annotations

import itertools
import math

import pytest

from hostcheck.inside import sweep_plan as plan

RULES = plan.Rules()


def _disjoint(rounds):
    for rnd in rounds:
        ends = [x for p in rnd for x in p]
        assert len(ends) == len(set(ends)), rnd


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 64, 65])
def test_all_pairs_meets_every_pair_once_in_disjoint_rounds(n):
    rounds = plan.all_pair_rounds(n)
    _disjoint(rounds)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == sorted(itertools.combinations(range(n), 2))
    # The circle method: n-1 rounds for an even count, n for an odd one.
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 12, 64, 100, 1024, 1000])
def test_hypercube_rounds_are_disjoint_log2_many_and_give_everyone_partners(n):
    rounds = plan.hypercube_rounds(n)
    _disjoint(rounds)
    assert len(rounds) == math.ceil(math.log2(n))
    partners = {i: set() for i in range(n)}
    for a, b in (p for r in rounds for p in r):
        partners[a].add(b)
        partners[b].add(a)
    assert all(partners[i] for i in range(n))
    if n & (n - 1) == 0:  # a power of two: every node meets one partner per bit
        assert all(len(p) == math.log2(n) for p in partners.values())


def test_the_schedule_switches_to_the_hypercube_above_all_pairs_max():
    assert plan.schedule(64, 64).mode == plan.ALL and plan.schedule(64, 64).rounds["pairs"] == 63
    big = plan.schedule(1024, 64)
    assert big.mode == plan.HYPERCUBE and big.rounds == {"compute": 1, "allreduce": 10, "pairs": 10}
    assert plan.schedule(16384, 64).rounds == {"compute": 1, "allreduce": 14, "pairs": 14}


@pytest.mark.parametrize("n", [2, 3, 4, 7, 8, 1024, 1000])
def test_bisection_levels_halve_down_to_groups_of_two(n):
    levels = plan.levels(n)
    assert levels[0] == [list(range(n))]
    for blocks in levels:
        assert sorted(x for b in blocks for x in b) == list(range(n))  # every node once per level
        assert max(map(len, blocks)) - min(map(len, blocks)) <= 1 and min(map(len, blocks)) >= 2
    assert len(levels) == int(math.log2(n))


def test_pack_puts_pairs_in_disjoint_rounds():
    rounds = plan.pack([(0, 1), (1, 2), (2, 3), (0, 1), (3, 0)])
    _disjoint(rounds)
    assert sorted(p for r in rounds for p in r) == [(0, 1), (0, 1), (0, 3), (1, 2), (2, 3)]


def test_the_modified_z_score_is_iglewicz_and_hoaglins_against_the_peers():
    # NIST 1.3.5.17: M = 0.6745 (x - median) / MAD, here over each member's peers (the others). Values 10, 11, 12, 13,
    # 30: the peers of 30 are 10-13, median 11.5, MAD median(1.5, 0.5, 0.5, 1.5) = 1.
    got = plan.peers({i: v for i, v in enumerate([10, 11, 12, 13, 30])})
    assert got[4].median == 11.5 and got[4].z == pytest.approx(0.6745 * 18.5)
    # The peers of 10: 11, 12, 13, 30, median 12.5, MAD median(1.5, 0.5, 0.5, 17.5) = 1.
    assert got[0].median == 12.5 and got[0].z == pytest.approx(-0.6745 * 2.5)
    assert got[0].ratio == pytest.approx(10 / 12.5) and got[0].members == 5


def test_a_slow_member_does_not_drag_its_own_reference_down():
    # Four nodes, one at 1%: against the others' median and MAD it is far out; against all four (itself included)
    # the MAD would take its distance in and hide it (modified z-score about -3.1).
    got = plan.peers({0: 800.0, 1: 600.0, 2: 900.0, 3: 6.0})
    assert got[3].median == 800.0 and got[3].z < -5
    assert set(plan.low({0: 800.0, 1: 600.0, 2: 900.0, 3: 6.0}, 0.93, RULES)) == {3}


def test_where_the_peers_mad_is_zero_their_mean_deviation_scales_the_score():
    # Peers 605, 605, 388: MAD 0; mean absolute deviation 72.3, times sqrt(pi/2).
    got = plan.peers({0: 388.0, 1: 388.0, 2: 605.0, 3: 605.0})
    assert got[0].median == 605.0 and got[0].z == pytest.approx((388 - 605) / (1.2533141 * 217 / 3), rel=1e-5)
    assert got[0].z > -3.5 and plan.low({0: 388.0, 1: 388.0, 2: 605.0, 3: 605.0}, 0.93, RULES) == {}


def test_a_member_is_named_only_past_both_the_line_and_the_z_score():
    # Planted: one member at 50% of a tight group. Absent: the same group without it.
    tight = {i: 100.0 + i * 0.1 for i in range(8)}
    assert set(plan.low({**tight, 9: 50.0}, 0.93, RULES)) == {9}
    assert plan.low(tight, 0.93, RULES) == {}
    # 2% below a tight group: far out by z-score, but within the 7% line.
    assert plan.low({**tight, 9: 98.0}, 0.93, RULES) == {}
    # 20% below a group that spreads +-25%: past the line, not by z-score.
    wide = {i: v for i, v in enumerate([75, 125, 80, 120, 90, 110, 100, 105])}
    assert plan.low({**wide, 9: 80.0}, 0.93, RULES) == {}


def test_equal_peers_make_any_other_value_an_outlier_and_equal_values_none():
    assert set(plan.low({0: 1.0, 1: 1.0, 2: 1.0, 3: 0.5}, 0.93, RULES)) == {3}
    assert plan.low({0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}, 0.93, RULES) == {}


def test_too_few_peers_judge_nothing():
    assert plan.low({0: 1.0, 1: 1.0, 2: 0.1}, 0.93, RULES) == {}  # 2 peers, the rule needs 3
    assert set(plan.low({0: 1.0, 1: 1.0, 2: 1.0, 3: 0.1}, 0.93, RULES)) == {3}


def test_latency_is_judged_on_the_high_side():
    assert set(plan.high({0: 10e-6, 1: 11e-6, 2: 10e-6, 3: 50e-6}, 2.1, RULES)) == {3}
    assert plan.high({0: 10e-6, 1: 11e-6, 2: 10e-6, 3: 15e-6}, 2.1, RULES) == {}


def _full(n, rate=lambda a, b: 10.0):
    return {p: rate(*p) for p in itertools.combinations(range(n), 2)}


def test_a_node_slow_with_every_partner_is_the_node_not_its_links():
    bw = _full(6, lambda a, b: 2.0 if 3 in (a, b) else 10.0)
    net = plan.network(bw, _full(6, lambda a, b: 1e-5), RULES)
    assert set(net.slow_nodes) == {3} and net.links == set()


def test_a_slow_link_names_both_ends_and_neither_node():
    bw = _full(6, lambda a, b: 2.0 if (a, b) == (1, 4) else 10.0)
    net = plan.network(bw, _full(6, lambda a, b: 1e-5), RULES)
    assert net.nodes == set() and set(net.slow_links) == {(1, 4)}
    lat = _full(6, lambda a, b: 9e-5 if (a, b) == (0, 5) else 1e-5)
    net = plan.network(_full(6), lat, RULES)
    assert set(net.laggy_links) == {(0, 5)} and net.nodes == set()


def test_nothing_is_named_in_a_healthy_matrix():
    net = plan.network(
        _full(8, lambda a, b: 10.0 + (a * 7 + b) % 5 * 0.05), _full(8, lambda a, b: 1e-5), RULES
    )
    assert net.nodes == set() and net.links == set()


def test_bisection_points_at_the_node_in_a_slow_group_at_every_level():
    groups = []
    for level, blocks in enumerate(plan.levels(16)):
        for index, block in enumerate(blocks):
            groups.append(
                {"level": level, "index": index, "nodes": block, "algbw": 1.0 if 5 in block else 10.0}
            )
    pointed, slow = plan.bisected(groups, RULES)
    # Levels 1 (2 groups) is too few to judge; levels 2 (4 groups) and 3 (8 groups) point at the pair holding 5.
    assert pointed == {4, 5} and set(slow) == {(2, 1), (3, 2)}
    healthy = [{**g, "algbw": 10.0} for g in groups]
    assert plan.bisected(healthy, RULES) == (set(), {})


def test_retest_repeats_bad_links_twice_and_gives_suspects_fresh_partners():
    bw = _full(6, lambda a, b: 2.0 if (a, b) == (1, 4) else 10.0)
    lat = _full(6, lambda a, b: 1e-5)
    assert plan.retest(6, bw, lat, set(), plan.ALL, RULES) == [(1, 4), (1, 4)]
    # Hypercube: only the pairs measured are known; suspects meet nodes nothing points at.
    sched = plan.hypercube_rounds(16)
    measured = {p: (2.0 if 9 in p else 10.0) for r in sched for p in r}
    again = plan.retest(16, measured, {p: 1e-5 for p in measured}, set(), plan.HYPERCUBE, RULES)
    fresh = [p for p in again if 9 in p and p not in measured]
    assert len(fresh) == 2 and all(p not in measured for p in fresh)
    assert (
        plan.retest(
            16, {p: 10.0 for p in measured}, {p: 1e-5 for p in measured}, set(), plan.HYPERCUBE, RULES
        )
        == []
    )


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("", {}),
        ("send_bps=2e6", {"send_bps": 2e6}),
        (" compute_factor=3 , send_bps=1000", {"compute_factor": 3.0, "send_bps": 1000.0}),
    ],
)
def test_the_test_fault_parses(text, want):
    assert plan.parse_fault(text) == want


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("rm -rf /", "want one of"),
        ("send_bps=fast", "not a number"),
        ("send_bps=nan", "out of range"),
        ("send_bps=-1", "out of range"),
        ("compute_factor=0.5", "out of range"),
        ("cpu=3", "want one of"),
    ],
)
def test_a_bad_test_fault_is_refused(text, said):
    with pytest.raises(ValueError, match=said):
        plan.parse_fault(text)
