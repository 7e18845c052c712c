"""Judge a sweep's record: every node and link against its peers, the culprits named with their evidence.

Pure: the record (rank 0's, checked against :data:`RECORD_SCHEMA` first: it comes from the training Python) and
the lines in, frozen values out; tested from generated records of 8 to 1,024 nodes. The rule itself (median,
MAD, modified z-score, a node's best partner, a link against both its ends) is hostcheck.inside.sweep_plan's,
which the worker uses to pick what to measure again. What is named:

- sweep.S001: a rank (a GPU, or a CPU node) whose matmul rate is below its peers': the node and the GPU;
- sweep.S002: a node slow with every partner (its best rate, or its lowest latency, is past the line);
- sweep.S003: a link slow between two nodes that reach their peers well elsewhere: both ends;
- sweep.S004: a node that never joined, or died during the sweep (its last heartbeat says where);
- sweep.S005 (an error, not a suspect): a node whose ranks failed during the sweep: what it did not measure.

A kind of judgement that lacks peers (``sweep_min_peers``) names nothing and says so in the notes. Ranks compare
with ranks of the same device (an A100 is no slow H100). On gloo the links of a node slow at compute are not
judged: gloo's transport runs on the CPU the node lacks. Where a rank failed or died, only what stands on its own
(a rank's compute, measured alone before any exchange) is drained; and nothing is drained from a sweep where a test
fault was planted (:meth:`Judgement.drained`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hostcheck.inside import sweep_plan as plan
from hostcheck.registry import Status

#: Each finding's id and what it names.
FINDINGS = {
    "sweep.S001": "a rank computes slower than its peers",
    "sweep.S002": "a node is slow with every partner",
    "sweep.S003": "a link is slow between two nodes that are fine elsewhere",
    "sweep.S004": "a node never joined or died during the sweep",
    "sweep.S005": "a node's ranks failed during the sweep: what it did not measure",
}
#: A node slow with every partner (the matrix marks its row).
NODE_NET = "sweep.S002"
#: The findings that name a node whose fault hostcheck measured: what --slurm-drain drains.
DRAINED = ("sweep.S001", "sweep.S002", "sweep.S003")
#: What stands on its own when a rank failed or died: each rank's matmul runs alone, before any exchange.
STANDS_ALONE = ("sweep.S001",)

HINTS = {
    "sweep.S001": "check the node's clocks and throttling (nvidia-smi -q -d PERFORMANCE,CLOCK), its power and "
    "cooling, and a CPU quota or governor on CPU nodes; `hostcheck check --profile full` on it names the GPU's "
    "own faults",
    "sweep.S002": "check its NICs, cables and switch ports: link rate and error counters (ibstat, ethtool -S, "
    "`hostcheck check --only fabric` on the node), and the NCCL/gloo interface it picked (NCCL_SOCKET_IFNAME, "
    "GLOO_SOCKET_IFNAME)",
    "sweep.S003": "check the path between the two nodes: the cables and switch ports on that route, their error "
    "counters and the routing (both ends reach other nodes at full rate)",
    "sweep.S004": "check the node is up and its task started (Slurm marks an unresponsive node DOWN by itself); "
    "its last words are in the launcher's log",
    "sweep.S005": "read the error on that node (the launcher's log holds its ranks' output), fix it and run the "
    "sweep again: its links and the figures it did not reach are unmeasured, not passed",
}


@dataclass(frozen=True)
class Finding:
    id: str
    status: Status
    #: node, rank or link.
    kind: str
    nodes: tuple[int, ...]
    hosts: tuple[str, ...]
    #: The finding in a few words (the Slurm drain reason's body).
    brief: str
    message: str
    hint: str
    value: float | None = None
    expected: float | None = None
    unit: str = ""
    evidence: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status.value,
            "kind": self.kind,
            "nodes": list(self.nodes),
            "hosts": list(self.hosts),
            "brief": self.brief,
            "message": self.message,
            "hint": self.hint,
            "value": _round(self.value),
            "expected": _round(self.expected),
            "unit": self.unit,
            "evidence": list(self.evidence),
        }


@dataclass(frozen=True)
class Judgement:
    """What the sweep found: the named findings, per-node figures and notes on what could not be judged."""

    findings: tuple[Finding, ...]
    nodes: tuple[dict[str, Any], ...]
    pairs: tuple[dict[str, Any], ...]
    groups: tuple[dict[str, Any], ...]
    notes: tuple[str, ...] = ()
    judged: tuple[str, ...] = field(default=())
    #: Node ranks whose ranks failed or died mid-sweep: the figures their partners measured with them are cut short.
    broken: tuple[int, ...] = ()
    #: Node ranks that carry a test fault (HOSTCHECK_SWEEP_TEST_FAULT).
    planted: tuple[int, ...] = ()

    @property
    def suspects(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.status == Status.FAIL)

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.status == Status.ERROR)

    def drained(self) -> tuple[tuple[Finding, ...], str]:
        """What --slurm-drain may drain, and why the rest is held back ("" when nothing is). A planted test fault
        drains nobody (the figures are a test's); a failed or dead rank leaves the pairs and groups it was in cut
        short, so only the findings that stand on their own (STANDS_ALONE) are drained."""
        named = tuple(f for f in self.suspects if f.id in DRAINED)
        if self.planted:
            return (), "a test fault was planted (HOSTCHECK_SWEEP_TEST_FAULT): nothing drained"
        if self.broken:
            kept = tuple(f for f in named if f.id in STANDS_ALONE)
            held = len(named) - len(kept)
            return kept, (
                f"ranks failed or died mid-sweep: {held} network finding(s) not drained (their pairs were cut short)"
                if held
                else ""
            )
        return named, ""

    @property
    def named_hosts(self) -> list[str]:
        out: list[str] = []
        for f in self.suspects:
            out += [h for h in f.hosts if h not in out]
        return out


def _round(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(f"{v:.6g}")


def rate(v: float) -> str:
    """A rate in bytes/s as people read it: 812 MB/s, 48.1 GB/s."""
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if v >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.3g} B/s"


def seconds(v: float) -> str:
    return f"{v * 1e6:.3g} us" if v < 1e-3 else f"{v * 1e3:.3g} ms"


def flops(v: float) -> str:
    return f"{v / 1e12:.3g} TFLOP/s" if v >= 1e11 else f"{v / 1e9:.3g} GFLOP/s"


def labels(nodes: Mapping[int, Mapping[str, Any]]) -> dict[int, str]:
    """Each node as the report names it: its host name, with its node rank where two nodes share one (ranks on
    one machine in a test) or none is known (a node that never joined)."""
    hosts = {i: str(n.get("host") or "") for i, n in nodes.items()}
    seen: dict[str, int] = {}
    for h in hosts.values():
        seen[h] = seen.get(h, 0) + 1
    return {i: h if h and seen[h] == 1 else f"{h or 'node'} (node {i})" for i, h in hosts.items()}


def _host(nodes: Mapping[int, Mapping[str, Any]], i: int) -> str:
    return str(nodes[i]["label"])


# long: one pass over the record, each kind of finding in turn with its evidence and notes
def judge(record: Mapping[str, Any], rules: plan.Rules) -> Judgement:
    """Name what the record shows (see the module's doc)."""
    raw = {int(n["node"]): n for n in record["nodes"]}
    named_as = labels(raw)
    nodes = {i: {**n, "label": named_as[i]} for i, n in raw.items()}
    findings: list[Finding] = []
    notes: list[str] = []
    judged: list[str] = []

    for i, n in sorted(nodes.items()):
        if n.get("state") == "missing":
            findings.append(_gone(i, n, "never joined the sweep within the join timeout"))
        elif n.get("state") == "died":
            findings.append(
                _gone(i, n, f"stopped answering during the sweep (last seen: {n.get('last_phase') or '?'})")
            )
        elif n.get("state") == "failed":
            findings.append(_failed(i, n))
    # A rank that failed while measuring again leaves its node "measured" but its retest pairs missing.
    erred = {int(e["node"]) for e in record.get("errors") or [] if "node" in e}
    broken = tuple(sorted(i for i, n in nodes.items() if n.get("state") in ("died", "failed") or i in erred))
    planted = tuple(sorted(i for i, n in nodes.items() if n.get("fault")))
    if broken:
        notes.append(
            f"{len(broken)} node(s) with ranks that failed or died mid-sweep: what they and their partners did not "
            "measure is not judged, the sweep is not a pass, and only compute findings are drained"
        )

    # Compute: every rank against every other rank of the same device kind.
    compute = {(int(c["node"]), int(c["local"])): float(c["flops_per_s"]) for c in record["compute"]}
    kinds: dict[str, dict[tuple[int, int], float]] = {}
    for key, value in compute.items():
        kinds.setdefault(str(nodes[key[0]].get("device") or "?"), {})[key] = value
    slow: dict[tuple[int, int], plan.Peer] = {}
    peers: dict[tuple[int, int], plan.Peer] = {}
    for device, members in sorted(kinds.items()):
        if len(members) - 1 < rules.min_peers:
            notes.append(
                f"compute not judged for {device}: {len(members)} ranks measured, the rule needs "
                f"{rules.min_peers + 1}"
            )
            continue
        judged += [] if "compute" in judged else ["compute"]
        slow.update(plan.low(members, rules.compute_fraction, rules))
        peers.update(plan.peers(members))
    for (i, local), p in sorted(slow.items()):
        gpu = f" GPU {local}" if int(nodes[i].get("gpus") or 0) else ""
        device = str(nodes[i].get("device") or "?")
        findings.append(
            Finding(
                "sweep.S001",
                Status.FAIL,
                "rank",
                (i,),
                (_host(nodes, i),),
                f"{_host(nodes, i)}{gpu} matmul {p.ratio:.0%} of peers",
                f"{_host(nodes, i)}{gpu}: matmul at {flops(p.value)}, {p.ratio:.0%} of the median of all "
                f"{p.members} {device} ranks ({flops(p.median)}; modified z-score {p.z:.1f})",
                HINTS["sweep.S001"],
                p.value,
                p.median,
                "FLOP/s",
                _fault(nodes[i]),
            )
        )

    # The network: each node's best partner, then the links between nodes that are fine elsewhere.
    gpus = {i: int(n.get("gpus") or 0) for i, n in nodes.items()}
    kept, dropped = plan.complete(record["pairs"], gpus)
    if dropped:
        shown = ", ".join(f"{_host(nodes, int(p['a']))}<->{_host(nodes, int(p['b']))}" for p in dropped[:5])
        notes.append(f"{len(dropped)} pair measurement(s) missing a GPU rail, not judged: {shown}")
    bw, lat, count = plan.best_repeats(kept)
    # gloo's transport runs on the CPU: a node slow at compute is slow on every link, its partners are not.
    excused = {i for i, _local in slow} if record["backend"] == "gloo" else set()
    net = plan.network(bw, lat, rules, excused)
    if excused:
        shown = ", ".join(_host(nodes, i) for i in sorted(excused))
        notes.append(f"links of {shown} not judged: slow at compute, and gloo moves its bytes on that CPU")
    if net.few:
        shown = ", ".join(f"{_host(nodes, i)} ({k})" for i, k in sorted(net.few.items())[:5])
        notes.append(
            f"past the line with too few partners to be named slow with all of them (the rule needs "
            f"{max(2, rules.min_peers)}): {shown}"
        )
    if len(net.capacity) - 1 < rules.min_peers:
        notes.append(
            f"nodes' network not judged: {len(net.capacity)} nodes paired, the rule needs {rules.min_peers + 1}"
        )
    else:
        judged.append("nodes")
    linked = len(bw) - sum(1 for p in bw if net.nodes & set(p))
    if linked - 1 < rules.min_peers:
        notes.append(
            f"links not judged: {linked} links between nodes not named, the rule needs {rules.min_peers + 1}"
        )
    else:
        judged.append("links")
    partners: dict[int, int] = {}
    for a, b in bw:
        partners[a] = partners.get(a, 0) + 1
        partners[b] = partners.get(b, 0) + 1
    for i in sorted(net.nodes):
        findings.append(_node_net(i, nodes, net, partners.get(i, 0)))
    once = sorted(k for k in net.links if count.get(k, 0) < 2)
    for key in sorted(net.links - set(once)):
        findings.append(_link(key, nodes, net, bw, lat, count))
    if once:  # as ClusterKit: only what stays outside the tolerance when measured again is named
        shown = ", ".join(f"{_host(nodes, a)}<->{_host(nodes, b)}" for a, b in once[:5])
        notes.append(f"{len(once)} link(s) outside the line once but not measured again, not named: {shown}")

    # The bisection: evidence for the nodes it points at, and the groups in the report.
    pointed, slow_groups = plan.bisected(record["groups"], rules)
    findings = [_with_bisection(f, pointed) for f in findings]
    groups = []
    for g in record["groups"]:
        flag = slow_groups.get((int(g["level"]), int(g["index"])))
        groups.append({**g, "slow": flag is not None, "ratio": _round(flag.ratio) if flag else None})
    # The matrix's cells against what the median node reaches: a node slow with everyone darkens its whole row.
    typical = statistics.median(net.capacity.values()) if net.capacity else 0.0
    ratios = {k: bw[k] / typical for k in bw} if typical > 0 else {}
    pairs = [{**p, "ratio": _round(ratios.get(plan.pair(int(p["a"]), int(p["b"]))))} for p in record["pairs"]]
    if record.get("retest_note"):
        notes.append(f"retest: {record['retest_note']}")
    named = {x for f in findings if f.status == Status.FAIL for x in f.nodes}
    # A node's compute is its slowest rank's (every step waits for it).
    slowest: dict[int, float] = {}
    ratio_of: dict[int, float] = {}
    for (i, _local), rate_ in compute.items():
        slowest[i] = min(slowest.get(i, math.inf), rate_)
    for (i, _local), p in peers.items():
        ratio_of[i] = min(ratio_of.get(i, math.inf), p.ratio)
    rows = []
    for i, n in sorted(nodes.items()):
        rows.append(
            {
                **n,
                "compute_flops_per_s": _round(slowest.get(i)),
                "compute_ratio": _round(ratio_of.get(i)),
                "capacity_bytes_per_s": _round(net.capacity.get(i)),
                "latency_floor_s": _round(net.floor.get(i)),
                "partners": partners.get(i, 0),
                "suspect": i in named,
            }
        )
    return Judgement(
        tuple(findings),
        tuple(rows),
        tuple(pairs),
        tuple(groups),
        tuple(notes),
        tuple(judged),
        broken,
        planted,
    )


def _fault(n: Mapping[str, Any]) -> tuple[str, ...]:
    fault = n.get("fault") or {}
    if not fault:
        return ()
    said = ", ".join(f"{k}={v}" for k, v in sorted(fault.items()))
    return (f"a test fault was planted on this node (HOSTCHECK_SWEEP_TEST_FAULT: {said})",)


def _gone(i: int, n: Mapping[str, Any], what: str) -> Finding:
    host = str(n["label"])
    return Finding(
        "sweep.S004",
        Status.FAIL,
        "node",
        (i,),
        (host,),
        f"{host} {'never joined' if n.get('state') == 'missing' else 'died'}",
        f"{host} (node rank {i}) {what}",
        HINTS["sweep.S004"],
    )


def _failed(i: int, n: Mapping[str, Any]) -> Finding:
    host = str(n["label"])
    error = str(n.get("error") or "?")
    return Finding(
        "sweep.S005",
        Status.ERROR,
        "node",
        (i,),
        (host,),
        f"{host} ranks failed mid-sweep",
        f"{host} (node rank {i}): a rank failed during the sweep ({error}); its figures after that point and the "
        "pairs and groups it was in are not measured, so they are not judged",
        HINTS["sweep.S005"],
    )


def _node_net(i: int, nodes: Mapping[int, Mapping[str, Any]], net: plan.Network, partners: int) -> Finding:
    host = _host(nodes, i)
    if i in net.slow_nodes:
        p = net.slow_nodes[i]
        brief = f"{host} slow with all {partners} partners, {p.ratio:.0%} of peers"
        message = (
            f"{host}: its best rate with any of its {partners} partners is {rate(p.value)}, {p.ratio:.0%} of the "
            f"peers' median best ({rate(p.median)}; modified z-score {p.z:.1f})"
        )
        value, expected, unit = p.value, p.median, "B/s"
    else:
        p = net.laggy_nodes[i]
        brief = f"{host} latency {p.ratio:.1f}x peers with all {partners} partners"
        message = (
            f"{host}: its lowest latency with any of its {partners} partners is {seconds(p.value)}, {p.ratio:.1f} "
            f"times the peers' median ({seconds(p.median)}; modified z-score {p.z:.1f})"
        )
        value, expected, unit = p.value, p.median, "s"
    return Finding(
        "sweep.S002",
        Status.FAIL,
        "node",
        (i,),
        (host,),
        brief,
        message,
        HINTS["sweep.S002"],
        value,
        expected,
        unit,
        _fault(nodes[i]),
    )


def _link(
    key: plan.Pair,
    nodes: Mapping[int, Mapping[str, Any]],
    net: plan.Network,
    bw: Mapping[plan.Pair, float],
    lat: Mapping[plan.Pair, float],
    count: Mapping[plan.Pair, int],
) -> Finding:
    a, b = key
    ha, hb = _host(nodes, a), _host(nodes, b)
    times = f"measured {count.get(key, 1)} times, best shown"
    if key in net.slow_links:
        p = net.slow_links[key]
        ends = min(net.capacity[a], net.capacity[b])
        brief = f"link {ha}<->{hb} {rate(bw[key])}, {p.value:.0%} of its ends"
        message = (
            f"link {ha} <-> {hb}: {rate(bw[key])} ({times}), {p.value:.0%} of what both ends reach with other "
            f"partners ({rate(ends)}); the links' median is {p.median:.0%} (modified z-score {p.z:.1f})"
        )
        value, expected, unit = bw[key], ends, "B/s"
    else:
        p = net.laggy_links[key]
        ends = max(net.floor[a], net.floor[b])
        brief = f"link {ha}<->{hb} latency {p.value:.1f}x its ends"
        message = (
            f"link {ha} <-> {hb}: latency {seconds(lat[key])} ({times}), {p.value:.1f} times what both ends reach "
            f"with other partners ({seconds(ends)}; modified z-score {p.z:.1f})"
        )
        value, expected, unit = lat[key], ends, "s"
    return Finding(
        "sweep.S003",
        Status.FAIL,
        "link",
        key,
        (ha, hb),
        brief,
        message,
        HINTS["sweep.S003"],
        value,
        expected,
        unit,
        _fault(nodes[a]) + _fault(nodes[b]),
    )


def _with_bisection(f: Finding, pointed: set[int]) -> Finding:
    hit = [x for x in f.nodes if x in pointed]
    if not hit or f.kind == "link":
        return f
    said = "the sub-group all_reduce bisection points at it too: its group was slow at every level judged"
    return Finding(**{**f.__dict__, "evidence": (*f.evidence, said)})
