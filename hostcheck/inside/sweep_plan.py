"""The sweep's schedule and its peer rule: pure, standard library only.

Used twice, so it lives here (it runs in the training Python) and is the one module of hostcheck.inside besides
the bench's proofs that the orchestrator imports: the sweep worker (hostcheck.inside.sweep) lays out its rounds
with it and picks what to measure again, and ``hostcheck sweep`` (hostcheck.sweep.judge) judges the record with
the same rule and counts the rounds of a cluster for docs/sweep.md.

The schedule: every node at once for its compute rate; an all_reduce across the whole group and, level by
level, across its halves, quarters, ... (every sub-group of a level at once: about log2(N) rounds that bisect a
straggler); node pairs in rounds of disjoint pairs, all pairs (N-1 rounds) up to ``all_pairs_max`` nodes, else
the hypercube pairing (node i with i XOR 2^k, one round per bit: log2(N) rounds, every node with log2(N)
partners across every cut of the bisection); then, like NVIDIA's ClusterKit, the pairs and nodes outside the
tolerance are measured again, suspects with fresh partners, and only what stays bad is named.

The peer rule: a member is an outlier when it is past a line relative to the median of its peers (a fraction
below for a rate, a factor above for a latency) AND its modified z-score, 0.6745 (x - median) / MAD (Iglewicz
and Hoaglin; NIST's Engineering Statistics Handbook 1.3.5.17), is past ``z``: the first keeps a tight, healthy
cluster from naming a member that is 2% slow, the second a noisy one from naming its slowest member. With fewer
than ``min_peers`` peers nothing is judged. A node's network capacity is the best rate it reached with any
partner (a node with a bad NIC is slow with all of them); a link is judged by its rate over what both its ends
reach elsewhere, so a slow link names both ends and a node slow with every partner is named as the node.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

K = TypeVar("K")
Pair = tuple[int, int]
#: Iglewicz and Hoaglin's constant: MAD / 0.6745 estimates one standard deviation of normal data.
MAD_SCALE = 0.6745
#: sqrt(pi/2): the mean absolute deviation times it estimates one standard deviation of normal data.
MEAN_AD_SCALE = math.sqrt(math.pi / 2)
#: The pairing modes.
ALL, HYPERCUBE = "all", "hypercube"
#: What a test may plant in a worker (HOSTCHECK_SWEEP_TEST_FAULT): never set outside tests.
FAULT_KEYS = {
    "send_bps": "its sends throttled to this many bytes/s",
    "compute_factor": "its compute steps this many times slower",
}


# ------------------------------------------------------------------------------------------- the schedule


def pair(a: int, b: int) -> Pair:
    return (a, b) if a < b else (b, a)


def all_pair_rounds(n: int) -> list[list[Pair]]:
    """Every pair of ``n`` nodes once, in rounds of disjoint pairs (the circle method): n-1 rounds for an even
    n, n for an odd one (one node rests each round)."""
    if n < 2:
        return []
    ids = list(range(n)) + ([-1] if n % 2 else [])
    m = len(ids)
    rounds = []
    for _round in range(m - 1):
        rounds.append(
            sorted(pair(ids[i], ids[m - 1 - i]) for i in range(m // 2) if -1 not in (ids[i], ids[m - 1 - i]))
        )
        ids = [ids[0], ids[-1], *ids[1:-1]]
    return rounds


def hypercube_rounds(n: int) -> list[list[Pair]]:
    """One round per bit of ``n - 1``: node i with i XOR 2^k; a node whose partner does not exist rests, or is
    paired with another resting node it has not met yet."""
    rounds: list[list[Pair]] = []
    met: set[Pair] = set()
    for k in range(max(1, (n - 1).bit_length()) if n > 1 else 0):
        pairs = [(i, i ^ (1 << k)) for i in range(n) if i < i ^ (1 << k) < n]
        busy = {x for p in pairs for x in p}
        idle = [i for i in range(n) if i not in busy]
        while len(idle) >= 2:
            a = idle.pop(0)
            b = next((x for x in idle if pair(a, x) not in met), None)
            if b is not None:
                idle.remove(b)
                pairs.append((a, b))
        met.update(pair(a, b) for a, b in pairs)
        rounds.append(sorted(pair(a, b) for a, b in pairs))
    return rounds


def pack(pairs: Iterable[Pair]) -> list[list[Pair]]:
    """Pairs into rounds of disjoint pairs, each pair in the first round where neither end is busy."""
    rounds: list[list[Pair]] = []
    busy: list[set[int]] = []
    for a, b in pairs:
        for i, used in enumerate(busy):
            if a not in used and b not in used:
                rounds[i].append(pair(a, b))
                used.update((a, b))
                break
        else:
            rounds.append([pair(a, b)])
            busy.append({a, b})
    return [sorted(r) for r in rounds]


def levels(n: int) -> list[list[list[int]]]:
    """The bisection: level 0 is the whole group, level l its 2^l contiguous blocks of nodes (sizes differ by one
    at most), down to the last level whose blocks all hold two nodes or more."""
    out: list[list[list[int]]] = []
    parts = 1
    while n >= 2 and n // parts >= 2:
        size, extra = divmod(n, parts)
        blocks, start = [], 0
        for i in range(parts):
            end = start + size + (1 if i < extra else 0)
            blocks.append(list(range(start, end)))
            start = end
        out.append(blocks)
        parts *= 2
    return out


@dataclass(frozen=True)
class Schedule:
    """What one sweep of ``n`` nodes runs, round by round (the retest rounds come from what it measured)."""

    n: int
    mode: str
    pair_rounds: list[list[Pair]]
    levels: list[list[list[int]]]

    @property
    def rounds(self) -> dict[str, int]:
        return {"compute": 1 if self.n else 0, "allreduce": len(self.levels), "pairs": len(self.pair_rounds)}


def schedule(n: int, all_pairs_max: int) -> Schedule:
    mode = ALL if n <= all_pairs_max else HYPERCUBE
    rounds = all_pair_rounds(n) if mode == ALL else hypercube_rounds(n)
    return Schedule(n, mode, rounds, levels(n))


# ---------------------------------------------------------------------------------------------- the rule


@dataclass(frozen=True)
class Rules:
    """The lines (hostcheck/data/thresholds.json, rows sweep_*): the fraction of the peers' median below which a
    rate is slow, the factor above which a latency is, the modified z-score past which a member is an outlier,
    and how many peers a judgement needs."""

    bw_fraction: float = 0.93
    latency_factor: float = 2.1
    compute_fraction: float = 0.9
    z: float = 3.5
    min_peers: int = 3

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Rules:
        return cls(**{k: d[k] for k in cls().__dict__ if k in d})


@dataclass(frozen=True)
class Peer:
    """One member against all members: its value, their median, its ratio to it and its modified z-score."""

    value: float
    median: float
    ratio: float
    z: float
    members: int


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def peers(values: Mapping[K, float]) -> dict[K, Peer]:
    """Every member with a positive finite figure against the median and MAD of the others (its peers: a slow
    member never drags its own reference down, which matters most in a small group). Where the peers' MAD is 0 (half
    of them or more equal), their mean absolute deviation times sqrt(pi/2) stands in for MAD / 0.6745: both estimate
    one standard deviation of normal data. Linear after one sort per distinct median: 1,024 nodes' links stay fast."""
    good = {k: float(v) for k, v in values.items() if _finite(v)}
    keys = sorted(good, key=good.__getitem__)
    xs = [good[k] for k in keys]
    n = len(xs)
    if n < 2:
        return {k: Peer(v, v, 1.0, 0.0, n) for k, v in good.items()}
    spread: dict[float, tuple[list[float], dict[int, int], float]] = {}
    out = {}
    for i, k in enumerate(keys):
        m = _median_without(xs, i)
        if m not in spread:  # the deviations from this median, sorted, and where each member's landed
            order = sorted(range(n), key=lambda j, m=m: abs(xs[j] - m))
            devs = [abs(xs[j] - m) for j in order]
            spread[m] = (devs, {j: p for p, j in enumerate(order)}, sum(devs))
        devs, where, total = spread[m]
        mad = _median_without(devs, where[i])
        mean_ad = (total - devs[where[i]]) / (n - 1)
        out[k] = Peer(xs[i], m, xs[i] / m, _z(xs[i], m, mad, mean_ad), n)
    return out


def _median_without(xs: Sequence[float], skip: int) -> float:
    """The median of the sorted ``xs`` without its element at ``skip``."""
    m = len(xs) - 1

    def at(k: int) -> float:
        return xs[k] if k < skip else xs[k + 1]

    return at(m // 2) if m % 2 else (at(m // 2 - 1) + at(m // 2)) / 2


def _z(v: float, med: float, mad: float, mean_ad: float) -> float:
    if mad > 0:
        return MAD_SCALE * (v - med) / mad
    if mean_ad > 0:
        return (v - med) / (MEAN_AD_SCALE * mean_ad)
    # Every peer equal: any other value is as far out as it gets.
    return 0.0 if v == med else math.copysign(math.inf, v - med)


def low(values: Mapping[K, float], fraction: float, rules: Rules) -> dict[K, Peer]:
    """The members below ``fraction`` of the median and more than ``rules.z`` below it (a slow rate)."""
    if len(values) - 1 < rules.min_peers:
        return {}
    return {k: p for k, p in peers(values).items() if p.ratio < fraction and p.z < -rules.z}


def high(values: Mapping[K, float], factor: float, rules: Rules) -> dict[K, Peer]:
    """The members above ``factor`` times the median and more than ``rules.z`` above it (a slow latency)."""
    if len(values) - 1 < rules.min_peers:
        return {}
    return {k: p for k, p in peers(values).items() if p.ratio > factor and p.z > rules.z}


# ------------------------------------------------------------------------------------------ the network


def best_repeats(
    pairs: Iterable[Mapping[str, Any]], key: Any = None
) -> tuple[dict[Pair, float], dict[Pair, float], dict[Pair, int]]:
    """Per node pair (``key`` maps a node to the index it is judged by), the best of its measurements: the highest
    rate per rail (the rails summed over their count), the lowest latency, and how often it was measured (only what
    stays outside the line is named). Pass only pairs whose every rail reported (:func:`complete`)."""
    bw: dict[Pair, float] = {}
    lat: dict[Pair, float] = {}
    count: dict[Pair, int] = {}
    for p in pairs:
        a, b = int(p["a"]), int(p["b"])
        k = pair(key(a), key(b)) if key else pair(a, b)
        # Per rail: a pair of 4-GPU nodes moves half what a pair of 8-GPU nodes does, and is no slower for it.
        bw[k] = max(bw.get(k, 0.0), float(p["bytes_per_s"]) / max(1, int(p.get("rails") or 1)))
        lat[k] = min(lat.get(k, math.inf), float(p["latency_s"]))
        count[k] = count.get(k, 0) + 1
    return bw, lat, count


def node_pairs(results: Iterable[Mapping[str, Any]], stage: str) -> list[dict[str, Any]]:
    """The ranks' pair measurements of ``stage`` as node pairs: per round, the rails summed (rate) and the worst
    rail (latency), as the lower node's ranks measured them."""
    rails: dict[tuple[int, int, int], list[Mapping[str, Any]]] = {}
    for m in results:
        for p in m.get("pairs") or []:
            if p.get("stage", "main") == stage and m["node"] < p["peer"]:
                rails.setdefault((p["round"], m["node"], p["peer"]), []).append(p)
    return [
        {
            "a": a,
            "b": b,
            "stage": stage,
            "round": rnd,
            "bytes_per_s": sum(p["bytes_per_s"] for p in got),
            "latency_s": max(p["latency_s"] for p in got),
            "rails": len(got),
            "bytes": got[0]["bytes"],
        }
        for (rnd, a, b), got in sorted(rails.items())
    ]


def complete(
    pairs: Iterable[Mapping[str, Any]], gpus: Mapping[int, int]
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """The node pairs whose rails all reported (min of the two nodes' GPUs, one on a CPU node), and the others: a pair
    missing a rail (a rank failed or never posted) would read as a slow pair and name both ends."""
    kept, dropped = [], []
    for p in pairs:
        a, b = int(p["a"]), int(p["b"])
        want = min(max(1, int(gpus.get(a) or 0)), max(1, int(gpus.get(b) or 0)))
        (kept if int(p.get("rails", 1)) >= want else dropped).append(p)
    return kept, dropped


def best(measured: Mapping[Pair, float], higher: bool = True) -> dict[int, float]:
    """Each node's best figure with any partner: the highest rate (its capacity) or the lowest latency."""
    out: dict[int, float] = {}
    for (a, b), v in measured.items():
        if not _finite(v):
            continue
        for x in (a, b):
            if x not in out or (v > out[x] if higher else v < out[x]):
                out[x] = v
    return out


@dataclass(frozen=True)
class Network:
    """What the pairs say: each node's capacity and latency floor, the nodes slow with every partner (by rate or
    latency), and the links slow between two nodes that are otherwise fine (by rate or latency)."""

    capacity: dict[int, float] = field(default_factory=dict)
    floor: dict[int, float] = field(default_factory=dict)
    slow_nodes: dict[int, Peer] = field(default_factory=dict)
    laggy_nodes: dict[int, Peer] = field(default_factory=dict)
    slow_links: dict[Pair, Peer] = field(default_factory=dict)
    laggy_links: dict[Pair, Peer] = field(default_factory=dict)
    #: Nodes past the line with fewer partners than the rule needs: not named, measured again, said in the notes.
    few: dict[int, int] = field(default_factory=dict)

    @property
    def nodes(self) -> set[int]:
        return set(self.slow_nodes) | set(self.laggy_nodes)

    @property
    def links(self) -> set[Pair]:
        return set(self.slow_links) | set(self.laggy_links)


def network(
    bw: Mapping[Pair, float], lat: Mapping[Pair, float], rules: Rules, excused: Iterable[int] = ()
) -> Network:
    """Judge the pairs (each pair's best repeat: ``bw`` the highest rate per rail, ``lat`` the lowest latency). A node
    is named slow with every partner only when it met ``max(2, min_peers)`` of them; the links of the ``excused``
    nodes (a CPU node named slow at compute: gloo's transport runs on its CPU) are not judged."""
    cap, floor = best(bw, True), best(lat, False)
    met: dict[int, int] = {}
    for a, b in set(bw) | set(lat):
        met[a] = met.get(a, 0) + 1
        met[b] = met.get(b, 0) + 1
    need = max(2, rules.min_peers)
    flagged = [low(cap, rules.bw_fraction, rules), high(floor, rules.latency_factor, rules)]
    few = {k: met.get(k, 0) for f in flagged for k in f if met.get(k, 0) < need}
    slow_nodes, laggy_nodes = ({k: p for k, p in f.items() if k not in few} for f in flagged)
    explained = set(slow_nodes) | set(laggy_nodes) | set(excused)
    # A link against what both its ends reach with other partners; links of a node already named are its own.
    rate = {p: v / min(cap[p[0]], cap[p[1]]) for p, v in bw.items() if _finite(v) and not explained & set(p)}
    delay = {
        p: v / max(floor[p[0]], floor[p[1]]) for p, v in lat.items() if _finite(v) and not explained & set(p)
    }
    return Network(
        cap,
        floor,
        slow_nodes,
        laggy_nodes,
        low(rate, rules.bw_fraction, rules),
        high(delay, rules.latency_factor, rules),
        few,
    )


def bisected(
    groups: Sequence[Mapping[str, Any]], rules: Rules
) -> tuple[set[int], dict[tuple[int, int], Peer]]:
    """The sub-group all_reduces: per level, each group's rate against the others of its level. The nodes the
    bisection points at are those in a slow group at every level that could be judged; and the slow groups,
    keyed (level, index)."""
    by_level: dict[int, dict[int, float]] = {}
    members: dict[tuple[int, int], list[int]] = {}
    for g in groups:
        level, index, rate = g.get("level"), g.get("index"), g.get("algbw")
        if isinstance(level, int) and isinstance(index, int) and level > 0 and _finite(rate):
            by_level.setdefault(level, {})[index] = float(rate)
            members[(level, index)] = [int(x) for x in g.get("nodes") or []]
    slow: dict[tuple[int, int], Peer] = {}
    pointed: set[int] | None = None
    for level in sorted(by_level):
        flagged = low(by_level[level], rules.bw_fraction, rules)
        if len(by_level[level]) - 1 < rules.min_peers:
            continue
        slow.update({(level, i): p for i, p in flagged.items()})
        here = {x for i in flagged for x in members[(level, i)]}
        pointed = here if pointed is None else pointed & here
    return pointed or set(), slow


def retest(
    n: int,
    bw: Mapping[Pair, float],
    lat: Mapping[Pair, float],
    suspects: Iterable[int],
    mode: str,
    rules: Rules,
    fresh: int = 2,
) -> list[Pair]:
    """What to measure again: every link outside the tolerance, twice (as ClusterKit retests its bad pairs over
    rounds: a transient dip, another job's burst, rarely strikes one pair three times), and in hypercube mode each
    suspect node (and each end of such a link) with up to ``fresh`` partners it has not met, taken from the nodes
    nothing points at, so a node slow with everyone is told from a slow link."""
    net = network(bw, lat, rules)
    again = set(net.links)
    twice = sorted(again)
    if mode == HYPERCUBE:
        tested = set(bw) | set(lat)
        pointed = set(suspects) | net.nodes | set(net.few) | {x for p in net.links for x in p}
        healthy = [i for i in range(n) if i not in pointed]
        for s in sorted(pointed):
            picked = 0
            for step in range(1, len(healthy) + 1):
                if picked >= fresh:
                    break
                partner = healthy[(s * 7 + step) % len(healthy)]
                if pair(s, partner) not in tested and pair(s, partner) not in again:
                    again.add(pair(s, partner))
                    picked += 1
    return sorted(again) + twice


# ------------------------------------------------------------------------------------------ test faults


def parse_fault(text: str) -> dict[str, float]:
    """HOSTCHECK_SWEEP_TEST_FAULT: ``send_bps=2e6,compute_factor=3`` (a test's planted fault on one node's ranks).
    Raises ValueError naming what is wrong."""
    out: dict[str, float] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or key not in FAULT_KEYS:
            raise ValueError(f"{item[:40]!r}: want one of {', '.join(k + '=N' for k in FAULT_KEYS)}")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{key}={value[:40]!r}: not a number") from None
        if not math.isfinite(number) or number <= 0 or (key == "compute_factor" and number < 1):
            raise ValueError(f"{key}={value[:40]!r}: out of range")
        out[key] = number
    return out
