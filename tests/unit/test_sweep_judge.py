"""Judging a sweep (hostcheck.sweep.judge) from generated records of 8, 64 and 1,024 simulated nodes
(fixtures/sweep_sim.py: the real schedule and retest, seeded): one bad link, one bad node, two bad nodes, a slow GPU,
and a noisy healthy cluster, each named exactly, or nothing named. Then the record's guard against a hostile
training Python, the report against its schema, its text, and its heat map on the fleet page."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from fixtures.sweep_sim import Cluster

from hostcheck.inside import sweep_plan as plan
from hostcheck.registry import Status
from hostcheck.schema import SWEEP_SCHEMA
from hostcheck.sweep.judge import FINDINGS, judge
from hostcheck.sweep.record import record_errors
from hostcheck.sweep.render import build_report, exit_code, render_json, render_text

RULES = plan.Rules()
SCHEMA = json.loads(SWEEP_SCHEMA.read_text())
META = {"time": "2026-11-29T07:00:00Z", "launcher": "slurm", "master": "gpu0000:29500", "duration_s": 1.0}


def named(record):
    return sorted((f.id, f.nodes) for f in judge(record, RULES).suspects)


def _link(n):
    # A pair the schedule measures: all pairs up to 64 nodes, node 4 with 4 XOR 1 in the hypercube.
    return (4, 5)


CASES = {
    "noisy healthy": (dict(noise=0.03, compute_noise=0.02, dip_p=0.01), lambda n: []),
    "one bad link": (dict(slow_link={(4, 5): 0.3}), lambda n: [("sweep.S003", (4, 5))]),
    "one bad node": (dict(slow_nic={"mid": 0.4}), lambda n: [("sweep.S002", (n // 2 + 1,))]),
    "two bad nodes": (
        dict(slow_nic={1: 0.4, "last": 0.5}),
        lambda n: [("sweep.S002", (1,)), ("sweep.S002", (n - 2,))],
    ),
    "one slow GPU": (dict(slow_compute={3: 0.6}), lambda n: [("sweep.S001", (3,))]),
}


def _cluster(n, seed, kw):
    kw = dict(kw)
    if "slow_nic" in kw:
        kw["slow_nic"] = {
            (n // 2 + 1 if k == "mid" else n - 2 if k == "last" else k): v for k, v in kw["slow_nic"].items()
        }
    kw.setdefault("noise", 0.02)
    return Cluster(n, seed=seed, **kw)


@pytest.mark.parametrize("n", [8, 64, 1024])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_simulated_cluster_names_exactly_its_planted_fault(n, case):
    kw, want = CASES[case]
    record = _cluster(n, 7, kw).record()
    assert record_errors(record) == []
    assert named(record) == want(n)


@pytest.mark.parametrize("n", [8, 64, 1024])
def test_the_same_cluster_without_the_fault_names_nothing(n):
    for case, (kw, _want) in CASES.items():
        clean = {k: v for k, v in kw.items() if not k.startswith("slow")}
        assert named(_cluster(n, 7, clean).record()) == [], case


def test_a_thousand_nodes_take_the_hypercube_and_a_few_retest_rounds():
    record = _cluster(1024, 7, {"slow_link": {(4, 5): 0.3}}).record()
    assert record["mode"] == plan.HYPERCUBE and record["rounds"]["pairs"] == 10
    # The bad link measured three times in all (as ClusterKit names only what stays bad), each end with fresh partners.
    assert sum(1 for p in record["pairs"] if (p["a"], p["b"]) == (4, 5)) == 3
    assert record["rounds"]["retest"] <= 4


def test_a_link_outside_the_line_once_and_never_measured_again_is_a_note_not_a_suspect():
    record = _cluster(8, 7, {"slow_link": {(4, 5): 0.3}}).record()
    record["pairs"] = [p for p in record["pairs"] if p["stage"] == "main"]
    j = judge(record, RULES)
    assert j.suspects == () and any("not measured again" in n for n in j.notes)


def test_missing_and_dead_nodes_are_named_with_where_they_were_last_seen():
    record = _cluster(8, 7, {}).record()
    record["nodes"][6] = {"node": 6, "state": "missing", "host": "gpu0006", "gpus": 0, "ranks": []}
    record["nodes"][2] = {**record["nodes"][2], "state": "died", "last_phase": "main pairs round 3 of 7"}
    got = {f.nodes: f for f in judge(record, RULES).suspects if f.id == "sweep.S004"}
    assert set(got) == {(2,), (6,)}
    assert "never joined" in got[(6,)].message and "main pairs round 3 of 7" in got[(2,)].message


def test_too_few_nodes_judge_nothing_and_say_so():
    record = _cluster(3, 7, {"slow_nic": {1: 0.1}}).record()
    j = judge(record, RULES)
    assert j.suspects == () and j.judged == ()
    assert any("compute not judged" in n for n in j.notes) and exit_code(j) == 1


def test_a_site_can_tighten_or_widen_the_lines():
    record = _cluster(8, 7, {"slow_compute": {3: 0.8}}).record()
    assert named(record) == [("sweep.S001", (3,))]
    wide = plan.Rules(compute_fraction=0.7)
    assert judge(record, wide).suspects == ()


# --------------------------------------------------------------------------------------------- the record


def _record():
    return _cluster(8, 7, {"slow_link": {(4, 5): 0.3}}).record()


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda r: r.pop("pairs"), "lacks pairs"),
        (lambda r: r["pairs"][0].update(bytes_per_s="fast"), "pairs[0].bytes_per_s"),
        (lambda r: r["pairs"][0].update(latency_s=float("nan")), "pairs[0].latency_s"),
        (lambda r: r["pairs"][0].update(a=99), "names a node the record does not list"),
        (lambda r: r["compute"][0].pop("flops_per_s"), "compute[0] lacks flops_per_s"),
        (lambda r: r["nodes"][0].update(state="sleeping"), "nodes[0].state"),
        (lambda r: r.update(mode="ring"), "mode"),
        (lambda r: r["groups"][0].update(nodes=[1, "x"]), "groups[0].nodes[1]"),
    ],
)
def test_a_record_of_the_wrong_shape_is_refused_naming_what(change, said):
    record = _record()
    assert record_errors(record) == []
    change(record)
    assert any(said in e for e in record_errors(record)), record_errors(record)


def test_the_report_validates_against_its_schema_and_names_the_suspects_first():
    record = _record()
    j = judge(record, RULES)
    report = build_report(record, j, {**META, "thresholds": RULES.to_dict()})
    jsonschema.validate(json.loads(render_json(report)), SCHEMA)
    assert report["verdict"] == {
        "named": 1,
        "hosts": ["gpu0004", "gpu0005"],
        "judged": ["compute", "nodes", "links"],
        "exit_code": 1,
    }
    text = render_text(report)
    assert text.splitlines()[1] == "NAMED: gpu0004, gpu0005"
    assert (
        "sweep.S003 link gpu0004 <-> gpu0005" in text and "fix: check the path between the two nodes" in text
    )
    healthy = _cluster(8, 7, {}).record()
    report = build_report(healthy, judge(healthy, RULES), META)
    jsonschema.validate(report, SCHEMA)
    assert report["verdict"]["exit_code"] == 0 and "nothing named" in render_text(report)


def test_the_schema_lists_the_findings_and_statuses_the_code_defines():
    finding = SCHEMA["$defs"]["finding"]["properties"]
    assert finding["id"]["enum"] == list(FINDINGS)
    assert finding["status"]["enum"] == [s.value for s in Status]


# --------------------------------------------------------------------------------------------- fleet


def _write_sweep(tmp_path: Path, record) -> Path:
    report = build_report(record, judge(record, RULES), {**META, "thresholds": RULES.to_dict()})
    path = tmp_path / "sweep.json"
    path.write_text(render_json(report))
    return path


def test_fleet_shows_the_sweeps_suspects_first_and_the_heat_map(tmp_path):
    from hostcheck.command import main

    record = _cluster(8, 7, {"slow_nic": {6: 0.4}}).record()
    record["nodes"][3]["host"] = "<script>alert(1)</script>"
    sweep = _write_sweep(tmp_path, record)
    reports = tmp_path / "reports"
    reports.mkdir()
    out = tmp_path / "out"
    assert main(["fleet", str(reports), "--sweep", str(sweep), "--out", str(out)]) == 1
    page = (out / "fleet.html").read_text()
    assert "<script>alert" not in page and "&lt;script&gt;" in page
    # Suspects before the nodes' table, the named node's row first in the heat map and dark against every partner.
    assert page.index("id='sweep-suspects'") < page.index("<th>node</th>")
    heat = page[page.index("id='sweep-heatmap'") :]
    assert heat.index("<tr><th>gpu0006</th>") < heat.index("<tr><th>gpu0000</th>")
    row = heat[heat.index("<tr><th>gpu0006</th>") :].split("</tr>")[0]
    assert row.count("hsl(") == 7 and "#c8e6c9" not in row
    assert "sweep.S002" in (out / "fleet.md").read_text()


def test_fleet_takes_a_healthy_sweep_and_refuses_a_broken_one(tmp_path):
    from hostcheck.command import main

    sweep = _write_sweep(tmp_path, _cluster(8, 7, {}).record())
    reports = tmp_path / "reports"
    reports.mkdir()
    # The sweep report inside the report folder is not read as a node's.
    (reports / "sweep.json").write_text(sweep.read_text())
    assert main(["fleet", str(reports), "--sweep", str(reports / "sweep.json")]) == 0
    assert "Nothing named." in (reports / "fleet.html").read_text()
    bad = json.loads(sweep.read_text())
    bad["pairs"][0]["bytes_per_s"] = "fast"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    assert main(["fleet", str(reports), "--sweep", str(tmp_path / "bad.json")]) == 2
    (tmp_path / "link.json").symlink_to(sweep)
    assert main(["fleet", str(reports), "--sweep", str(tmp_path / "link.json")]) == 2


# --------------------------------------------------------------------------------------------- incomplete sweeps


def test_a_node_whose_ranks_failed_is_an_error_and_the_sweep_does_not_pass():
    record = _cluster(8, 7, {}).record()
    assert exit_code(judge(record, RULES)) == 0
    # What the worker writes for a rank that raised mid-sweep (hostcheck.inside.sweep: state failed, its error).
    record["nodes"][3] = {**record["nodes"][3], "state": "failed", "error": "pairs: Connection reset by peer"}
    record["errors"] = [{"rank": 3, "node": 3, "error": "pairs: Connection reset by peer"}]
    j = judge(record, RULES)
    assert j.suspects == () and [(f.id, f.status, f.nodes) for f in j.errors] == [
        ("sweep.S005", Status.ERROR, (3,))
    ]
    assert "Connection reset by peer" in j.errors[0].message and exit_code(j) == 1
    report = build_report(record, j, {**META, "thresholds": RULES.to_dict()})
    jsonschema.validate(json.loads(render_json(report)), SCHEMA)
    text = render_text(report)
    assert "nothing named, but the sweep is incomplete" in text and "NOT MEASURED sweep.S005" in text
    assert report["verdict"]["exit_code"] == 1 and report["unmeasured"][0]["nodes"] == [3]


def test_where_ranks_failed_only_a_finding_that_stands_alone_is_drained():
    record = _cluster(8, 7, {"slow_nic": {6: 0.4}, "slow_compute": {1: 0.5}}).record()
    drained, held = judge(record, RULES).drained()
    assert sorted(f.id for f in drained) == ["sweep.S001", "sweep.S002"] and held == ""
    record["nodes"][3] = {**record["nodes"][3], "state": "died", "last_phase": "main pairs round 2 of 7"}
    j = judge(record, RULES)
    drained, held = j.drained()
    # The slow-NIC node is still named (exit 1), but its pairs were cut short: not drained; the slow GPU is.
    assert [f.id for f in drained] == ["sweep.S001"] and "1 network finding(s) not drained" in held
    assert ("sweep.S002", (6,)) in [(f.id, f.nodes) for f in j.suspects]


def test_a_planted_test_fault_drains_nobody():
    record = _cluster(8, 7, {"slow_nic": {6: 0.4}}).record()
    assert [f.nodes for f in judge(record, RULES).drained()[0]] == [(6,)]
    record["nodes"][6]["fault"] = {"send_bps": 8e6}
    drained, held = judge(record, RULES).drained()
    assert drained == () and "HOSTCHECK_SWEEP_TEST_FAULT" in held


def _rails(record, gpus, short=None):
    """The record as nodes of ``gpus`` GPUs each report it: a pair's rate summed over min(gpus_a, gpus_b) rails
    (hostcheck.inside.sweep_plan.node_pairs); ``short`` is a node pair one rail short (a rank that never posted)."""
    for n in record["nodes"]:
        n["gpus"] = gpus.get(n["node"], 8)
    for p in record["pairs"]:
        rails = min(gpus.get(p["a"], 8), gpus.get(p["b"], 8))
        if short and plan.pair(p["a"], p["b"]) == short:
            rails -= 1
        p["rails"] = rails
        p["bytes_per_s"] *= rails
    return record


def test_a_node_with_fewer_gpus_is_judged_per_rail_and_not_named():
    record = _rails(_cluster(8, 7, {}).record(), {5: 4})
    assert judge(record, RULES).suspects == ()
    slow = _rails(_cluster(8, 7, {"slow_nic": {5: 0.4}}).record(), {5: 4})
    assert named(slow) == [("sweep.S002", (5,))]


def test_a_pair_missing_a_rail_is_dropped_and_said_not_judged_as_slow():
    record = _rails(_cluster(8, 7, {}).record(), {}, short=(2, 6))
    j = judge(record, RULES)
    assert j.suspects == () and any(
        "missing a GPU rail, not judged" in n and "gpu0002<->gpu0006" in n for n in j.notes
    )


def test_a_node_with_too_few_partners_is_not_named_slow_with_all_of_them():
    # A slow node whose rails went missing with all partners but one: one partner is no evidence of "every partner".
    record = _cluster(8, 7, {"slow_nic": {6: 0.4}}).record()
    assert named(record) == [("sweep.S002", (6,))]
    for p in record["pairs"]:
        if 6 in (p["a"], p["b"]) and 0 not in (p["a"], p["b"]):
            p["rails"] = 0
    for n in record["nodes"]:
        n["gpus"] = 1
    j = judge(record, RULES)
    assert [f.id for f in j.suspects] == [] and any(
        "too few partners" in n and "gpu0006 (1)" in n for n in j.notes
    )


def test_mixed_gpu_models_are_judged_within_their_own_kind():
    record = _cluster(8, 7, {"slow_compute": {0: 0.6, 1: 0.6, 2: 0.6, 3: 0.6}}).record()
    for n in record["nodes"]:
        n["device"] = "NVIDIA A100-SXM4-80GB" if n["node"] < 4 else "NVIDIA H100 80GB HBM3"
    assert judge(record, RULES).suspects == ()
    # One A100 slower than the other three A100s is still named, against its own kind.
    record["compute"][2]["flops_per_s"] *= 0.5
    j = judge(record, RULES)
    assert [(f.id, f.nodes) for f in j.suspects] == [("sweep.S001", (2,))]
    assert "of the median of all 4 NVIDIA A100-SXM4-80GB ranks" in j.suspects[0].message


def test_on_gloo_a_node_slow_at_compute_has_its_links_excused():
    # gloo moves bytes on the CPU: a node with a tenth of a CPU is slow on every link, and slower with some partners
    # than others; the sweep names it at compute, and neither it nor a partner by its links.
    record = _cluster(8, 7, {"slow_compute": {3: 0.1}, "slow_link": {(3, 5): 0.3}}).record()
    assert ("sweep.S003", (3, 5)) in named(record) and record["backend"] == "nccl"
    record["backend"] = "gloo"
    j = judge(record, RULES)
    assert [(f.id, f.nodes) for f in j.suspects] == [("sweep.S001", (3,))]
    assert any("links of gpu0003 not judged" in n for n in j.notes)


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r["compute"][0].update(flops_per_s=10**400),
        lambda r: r["pairs"][0].update(bytes_per_s=10**400),
        lambda r: r["pairs"][0].update(rails=10**400),
        lambda r: r.update(wall_s=-(10**400)),
    ],
)
def test_a_number_no_float_holds_is_refused_before_judging(change):
    record = _record()
    change(record)
    assert record_errors(record), "a 400-digit integer must not reach float()"


# --------------------------------------------------------------------------------------------- --slurm-drain


def _drained_through(tmp_path, record):
    from test_sweep_cli import FAKE_SCONTROL

    from hostcheck.config import SlurmSettings
    from hostcheck.sweep import cli

    log = tmp_path / "scontrol.log"
    fake = tmp_path / "scontrol"
    fake.write_text(FAKE_SCONTROL.format(log=log))
    fake.chmod(0o755)
    assert cli._drain(judge(record, RULES), SlurmSettings(scontrol=str(fake))) is False
    text = log.read_text() if log.exists() else ""
    return sorted(line.split()[1] for line in text.splitlines() if line.startswith("update"))


def test_drain_takes_the_named_nodes_and_holds_back_a_planted_faults(tmp_path, capsys):
    record = _cluster(8, 7, {"slow_link": {(4, 5): 0.3}}).record()
    assert _drained_through(tmp_path, record) == ["nodename=gpu0004", "nodename=gpu0005"]
    reasons = [
        ln.split("reason=", 1)[1]
        for ln in (tmp_path / "scontrol.log").read_text().splitlines()
        if "reason=" in ln
    ]
    assert reasons and all(
        r.startswith("hostcheck: sweep.S003 link gpu0004<->gpu0005") and len(r) <= 80 for r in reasons
    )
    (tmp_path / "scontrol.log").unlink()
    record["nodes"][4]["fault"] = {"send_bps": 8e6}
    assert _drained_through(tmp_path, record) == []
    assert "a test fault was planted (HOSTCHECK_SWEEP_TEST_FAULT): nothing drained" in capsys.readouterr().err


def test_a_node_with_a_planted_fault_refuses_slurm_drain(monkeypatch, capsys):
    from hostcheck.command import main

    for k, v in {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HOSTCHECK_SWEEP_TEST_FAULT", "send_bps=8e6")
    assert main(["sweep", "--slurm-drain", "--device", "cpu"]) == 2
    assert "--slurm-drain with HOSTCHECK_SWEEP_TEST_FAULT set" in capsys.readouterr().err
