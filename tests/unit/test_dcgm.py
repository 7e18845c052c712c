"""DCGM wrapped (gpu.E030-E034): ``dcgmi diag -r <level> -j`` at the profile's level and ``dcgmi health -c -j``,
from fixtures transcribed from DCGM's sources (tests/unit/fixtures/dcgm/README.md). Each verdict with its fault
planted and absent; a test DCGM could not run kept apart from one that failed; a dcgmi that hangs, fails or talks
nonsense is an error (could not run), never a fail.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import hostcheck_scenarios as S
import pytest

from hostcheck import command
from hostcheck.checks import all_checks
from hostcheck.core import evaluate
from hostcheck.gather.base import TIMEOUT, CmdResult, Unavailable, run_cmd
from hostcheck.gather.dcgm import (
    FAIL,
    MAX_OUTPUT,
    PASS,
    SKIP,
    DcgmSnapshot,
    DiagReport,
    HealthReport,
    gather_dcgm,
    parse_diag,
    parse_health,
)
from hostcheck.profiles import DCGM_LEVEL_RUN_TIME, PROFILES
from hostcheck.registry import Status

FIX = Path(__file__).parent / "fixtures" / "dcgm"
DIAG_IDS = ("gpu.E030", "gpu.E031", "gpu.E032", "gpu.E033")
IDS = {*DIAG_IDS, "gpu.E034"}


def text(name: str) -> str:
    return (FIX / name).read_text()


def runner(diag: str | CmdResult | Unavailable = "diag_v4_r1_pass.json", health: str = "health_healthy.json"):
    """A fake dcgmi: fixture names, or a whole answer; the argv it was given is kept in ``runner.calls``."""
    calls: list[list[str]] = []

    def answer(v):
        return v if isinstance(v, (CmdResult, Unavailable)) else CmdResult(0, text(v), "")

    def run(argv, timeout):
        calls.append(list(argv))
        return answer(health if argv[1] == "health" else diag)

    run.calls = calls  # type: ignore[attr-defined]
    return run


def snap(level: int = 1, **kw) -> DcgmSnapshot:
    return gather_dcgm(level, dcgmi="/usr/bin/dcgmi", runner=runner(**kw))


def judge(dcgm: DcgmSnapshot | None) -> dict:
    s = S.make_snapshot()
    s = type(s)(**{**s.__dict__, "dcgm": dcgm})
    results, _ = evaluate(s, [c for c in all_checks() if c.id in IDS])
    return {r.id: r for r in results}


# --- parsing: DCGM 4.x and 3.x ---------------------------------------------------------------------------------


def test_v4_level1_all_pass_is_one_pass_and_the_absent_categories_skip():
    r = judge(snap(1))
    assert r["gpu.E030"].status is Status.PASS
    assert r["gpu.E030"].message == "2 DCGM deployment results passed (DCGM 4.6.0, dcgmi diag -r 1)"
    for cid in ("gpu.E031", "gpu.E032", "gpu.E033"):
        assert r[cid].status is Status.SKIP and "ran no" in r[cid].message
    assert r["gpu.E034"].status is Status.PASS


def test_a_failing_memory_test_fails_its_check_with_dcgms_message_and_code():
    r = judge(snap(3, diag="diag_v4_r3_memory_fail.json"))
    e = r["gpu.E032"]
    assert e.status is Status.FAIL
    assert e.message == "DCGM memory on GPU 1: Found 3 faulty memory elements on GPU 1 (DCGM error 52)"
    assert e.value == 1
    assert {r[c].status for c in ("gpu.E030", "gpu.E031", "gpu.E033")} == {Status.PASS}


def test_the_same_run_with_the_fault_absent_passes():
    doc = json.loads(text("diag_v4_r3_memory_fail.json"))
    for cat in doc["DCGM Diagnostic"]["test_categories"]:
        for t in cat["tests"]:
            t["test_summary"] = {"status": "Pass"}
            for res in t["results"]:
                res["status"] = "Pass"
                res.pop("warnings", None)
    r = judge(snap(3, diag=CmdResult(0, json.dumps(doc), "")))
    assert {r[c].status for c in DIAG_IDS} == {Status.PASS}
    assert "6 DCGM stress results passed" in r["gpu.E033"].message


def test_a_skipped_test_is_kept_apart_from_a_failed_one():
    r = judge(snap(2, diag="diag_v4_r2_memory_skipped.json"))
    e = r["gpu.E032"]
    assert e.status is Status.SKIP
    assert "could not run" in e.message and "ECC is not enabled on GPU 0 (DCGM error 55)" in e.message
    assert r["gpu.E030"].status is Status.PASS and r["gpu.E031"].status is Status.PASS


def test_a_warning_warns():
    r = judge(snap(2, diag="diag_v4_r2_pcie_warn.json"))
    assert r["gpu.E031"].status is Status.WARN
    assert "pcie on GPU 0: Detected more than 8 PCIe replays per minute for GPU 0 : 12 (DCGM error 3)" in (
        r["gpu.E031"].message
    )


def test_v3_shape_deployment_fail_and_a_skip_beside_a_pass():
    report = parse_diag(text("diag_v3_r2_mixed.json"), 2)
    assert isinstance(report, DiagReport) and report.version == "3.3.9"
    r = judge(snap(2, diag="diag_v3_r2_mixed.json"))
    e30 = r["gpu.E030"]
    assert e30.status is Status.FAIL
    assert (
        e30.message
        == "DCGM Persistence Mode on GPU 0: Persistence mode for GPU 0 is disabled. (DCGM error 29)"
    )
    assert r["gpu.E031"].status is Status.PASS
    e32 = r["gpu.E032"]  # GPU 1 passed, GPU 0 skipped: a pass that says what did not run
    assert e32.status is Status.PASS and "not run: GPU Memory on GPU 0 skip" in e32.message


def test_dcgms_runtime_error_is_one_error_and_the_other_categories_skip():
    r = judge(snap(1, diag="diag_v4_runtime_error.json"))
    assert r["gpu.E030"].status is Status.ERROR
    assert (
        "DCGM says: Error: Diagnostic can only be performed on a homogeneous group" in r["gpu.E030"].message
    )
    assert all(r[c].status is Status.SKIP and "gpu.E030 says why" in r[c].message for c in DIAG_IDS[1:])


@pytest.mark.parametrize(
    "out, why",
    [
        (text("diag_v4_r3_memory_fail.json")[:700], "could not be read"),
        ("\x00\xff\x13garbage\n", "no JSON"),
        ("", "no JSON"),
        ('{"DCGM Diagnostic": ' + "[" * 100000 + "]" * 100000 + "}", "deeper than"),
        ('{"something": "else"}', "no 'DCGM Diagnostic'"),
        ('{"DCGM Diagnostic": {"test_categories": "x"}}', "no test result"),
        ("[1, 2]", "no JSON"),
    ],
    ids=["truncated", "binary", "empty", "deep-nesting", "other-json", "no-results", "a-list"],
)
def test_output_that_is_not_dcgms_json_is_an_error_never_a_fail(out, why):
    got = parse_diag(out, 2)
    assert isinstance(got, Unavailable) and why in got.reason
    r = judge(snap(2, diag=CmdResult(1, out, "")))
    assert r["gpu.E030"].status is Status.ERROR and "could not run" in r["gpu.E030"].message
    assert not any(x.status is Status.FAIL for x in r.values())


def test_hostile_json_values_are_kept_bounded_and_typed():
    doc = {
        "DCGM Diagnostic": {
            "test_categories": [
                {
                    "category": ["x"],
                    "tests": [{"name": "n" * 10000, "results": [{"status": 7, "warnings": [5]}]}],
                },
                "junk",
                {
                    "category": "Hardware",
                    "tests": [None, {"results": [{"status": "Fail", "warnings": [{"warning": 3}]}]}],
                },
            ]
        }
    }
    got = parse_diag(json.dumps(doc), 1)
    assert isinstance(got, DiagReport)
    assert all(len(r.test) <= 500 for r in got.results)
    r = judge(snap(1, diag=CmdResult(1, json.dumps(doc), "")))
    assert r["gpu.E032"].status is Status.FAIL  # a Fail is a Fail, even with a number for its message
    assert r["gpu.E032"].status is not Status.ERROR


def test_results_past_the_cap_are_counted_and_never_a_pass():
    """More results than MAX_RESULTS (a hostile or broken dcgmi): the ones past it may hold a failure, so the checks
    warn and say how many were not read; with the same count within the cap, they pass."""
    from hostcheck.gather.dcgm import MAX_RESULTS

    def doc(n: int) -> str:
        rows = [{"status": "Pass", "entity_group": "GPU", "entity_id": i % 8} for i in range(n)]
        tests = [{"name": "memory", "results": rows}]
        return json.dumps(
            {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": tests}]}}
        )

    over = parse_diag(doc(MAX_RESULTS + 5), 3)
    assert len(over.results) == MAX_RESULTS and over.dropped == 5
    r = judge(snap(3, diag=CmdResult(0, doc(MAX_RESULTS + 5), "")))["gpu.E032"]
    assert r.status is Status.WARN and f"5 results past the first {MAX_RESULTS} not read" in r.message
    r = judge(snap(3, diag=CmdResult(0, doc(MAX_RESULTS), "")))["gpu.E032"]
    assert r.status is Status.PASS and r.message.startswith(f"{MAX_RESULTS} DCGM hardware results passed")


# --- running: not installed, hangs, floods, busy, the profile's level -----------------------------------------


def test_no_dcgmi_skips_every_check_naming_the_roles_option(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    d = gather_dcgm(2)
    assert d.dcgmi is None and d.diag is None
    r = judge(d)
    for cid in IDS:
        assert r[cid].status is Status.SKIP and r[cid].message == "DCGM not installed (no dcgmi)"
        assert "gpunode_driver_dcgm_enabled: true (docs/dcgm.md)" in r[cid].hint


def test_not_gathered_skips():
    assert {x.status for x in judge(None).values()} == {Status.SKIP}


def fake_dcgmi(tmp_path: Path, diag_body: str, health: str = "health_healthy.json") -> str:
    p = tmp_path / "dcgmi"
    p.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {tmp_path}/calls\n'
        f'case "$1" in health) cat {FIX / health};; diag) {diag_body};; esac\n'
    )
    p.chmod(0o755)
    return str(p)


def test_a_hanging_dcgmi_is_killed_at_its_limit_and_is_an_error(tmp_path):
    dcgmi = fake_dcgmi(tmp_path, f"echo $$ > {tmp_path}/pid; trap '' TERM INT; exec sleep 300")
    t0 = time.monotonic()
    d = gather_dcgm(2, timeout_s=1.5, dcgmi=dcgmi)
    assert time.monotonic() - t0 < 10
    assert isinstance(d.diag, Unavailable) and d.diag.kind == TIMEOUT
    pid = int((tmp_path / "pid").read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the hung dcgmi was left running")
    r = judge(d)
    assert r["gpu.E030"].status is Status.ERROR and "timed out" in r["gpu.E030"].message
    assert r["gpu.E034"].status is Status.PASS


def test_a_dcgmi_that_floods_is_stopped_at_the_output_cap(tmp_path):
    dcgmi = fake_dcgmi(tmp_path, "exec cat /dev/zero")
    d = gather_dcgm(1, timeout_s=30, dcgmi=dcgmi)
    assert isinstance(d.diag, Unavailable) and f"more than {MAX_OUTPUT} bytes" in d.diag.reason
    got = run_cmd(["sh", "-c", "head -c 100000 /dev/zero; echo done >&2"], 10, limit=1000)
    assert isinstance(got, Unavailable) and "more than 1000 bytes" in got.reason
    ok = run_cmd(["sh", "-c", "echo out; echo err >&2; exit 3"], 10, limit=1000)
    assert ok == CmdResult(3, "out\n", "err\n")


def test_the_deadline_bounds_dcgmi_and_dcgm_gets_its_own_timeout_first():
    run = runner()
    gather_dcgm(2, deadline=time.monotonic() + 100, dcgmi="/usr/bin/dcgmi", runner=run)
    diag = next(c for c in run.calls if c[1] == "diag")
    assert diag[:5] == ["/usr/bin/dcgmi", "diag", "-r", "2", "-j"]
    assert diag[5] == "--timeout" and 85 <= int(diag[6]) <= 90  # 100 s less the reserve, less DCGM's margin
    late = gather_dcgm(2, deadline=time.monotonic() + 3, dcgmi="/usr/bin/dcgmi", runner=runner())
    assert isinstance(late.diag, Unavailable) and "no time left" in late.diag.reason


def test_a_busy_node_gets_no_loading_level_but_the_quick_one_runs():
    d = gather_dcgm(2, busy="a GPU is in use: GPU 0: python[42]", dcgmi="/usr/bin/dcgmi", runner=runner())
    r = judge(d)
    assert r["gpu.E030"].status is Status.SKIP and "not run beside other work" in r["gpu.E030"].message
    assert isinstance(gather_dcgm(1, busy="x", dcgmi="/usr/bin/dcgmi", runner=runner()).diag, DiagReport)


def test_each_profile_has_its_level_with_dcgms_documented_run_time():
    assert {n: p.dcgm_level for n, p in PROFILES.items()} == {
        "passive": 0,
        "prolog": 1,
        "epilog": 1,
        "standard": 1,
        "full": 2,
        "burnin": 3,
    }
    assert all(p.dcgm_level in DCGM_LEVEL_RUN_TIME and "dcgm" in p.needs for p in PROFILES.values())
    assert 4 not in DCGM_LEVEL_RUN_TIME  # no documented length: never chosen


@pytest.mark.parametrize("profile, level", [("passive", None), ("prolog", "1"), ("full", "2")])
def test_the_command_runs_the_profiles_level(tmp_path, monkeypatch, capsys, profile, level):
    fake_dcgmi(tmp_path, f"cat {FIX / 'diag_v4_r3_memory_fail.json'}; exit 1")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    prom = tmp_path / "hostcheck.prom"
    only = ",".join(sorted(IDS))
    rc = command.main(["check", "--profile", profile, "--only", only, "--json", "--prometheus", str(prom)])
    calls = (tmp_path / "calls").read_text().splitlines()
    checks = {c["id"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert calls[0] == "health -c -j"
    if level is None:
        assert len(calls) == 1 and checks["gpu.E030"]["status"] == "skip"
        assert rc == 0
    else:
        assert calls[1].startswith(f"diag -r {level} -j --timeout ")
        assert checks["gpu.E032"]["status"] == "fail" and "DCGM error 52" in checks["gpu.E032"]["message"]
        assert 'hostcheck_check_value{check="gpu.E032"} 1' in prom.read_text()
        assert rc == 1


# --- health watches ------------------------------------------------------------------------------------------


def test_health_verdicts_with_the_fault_planted_and_absent():
    ok = parse_health(text("health_healthy.json"))
    assert ok == HealthReport("Healthy")
    assert judge(snap(0))["gpu.E034"].status is Status.PASS
    w = judge(snap(0, health="health_pcie_warning.json"))["gpu.E034"]
    assert w.status is Status.WARN
    assert (
        w.message
        == "DCGM health: GPU 0 PCIe system: Detected more than 8 PCIe replays per minute for GPU 0 : 12"
    )
    f = judge(snap(0, health="health_memory_failure.json"))["gpu.E034"]
    assert f.status is Status.FAIL and "GPU 1 Memory system: Detected 2 volatile double-bit ECC" in f.message


@pytest.mark.parametrize(
    "name, why",
    [("health_no_watches.txt", "no health watches"), ("health_no_host_engine.txt", "no DCGM host engine")],
)
def test_no_host_engine_or_no_watches_is_a_skip_with_the_reason(name, why):
    r = judge(gather_dcgm(0, dcgmi="/d", runner=runner(health=CmdResult(255, text(name), ""))))["gpu.E034"]
    assert r.status is Status.SKIP and why in r.message and "nvidia-dcgm" in r.hint


def test_health_garbage_or_a_hang_is_an_error():
    for answer in (CmdResult(0, "\x00\x01 nonsense", ""), Unavailable(TIMEOUT, "dcgmi timed out after 10 s")):
        r = judge(gather_dcgm(0, dcgmi="/d", runner=runner(health=answer)))["gpu.E034"]
        assert r.status is Status.ERROR and "could not run" in r.message


def test_results_keep_dcgms_statuses():
    rep = parse_diag(text("diag_v4_r2_memory_skipped.json"), 2)
    assert isinstance(rep, DiagReport)
    assert [(x.test, x.entity, x.status) for x in rep.results if x.category == "Hardware"] == [
        ("memory", "GPU 0", SKIP),
        ("memory", "GPU 1", SKIP),
    ]
    fail = parse_diag(text("diag_v4_r3_memory_fail.json"), 3)
    mem = [x for x in fail.results if x.test == "memory"]
    assert [(x.entity, x.status) for x in mem] == [("GPU 0", PASS), ("GPU 1", FAIL)]
    assert mem[1].messages[0].error_id == 52 and mem[1].messages[0].severity == 2


def test_a_status_hostcheck_does_not_know_warns_and_is_never_a_fail():
    doc = {
        "DCGM Diagnostic": {
            "test_categories": [
                {
                    "category": "Hardware",
                    "tests": [
                        {
                            "name": "memory",
                            "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Flaky"}],
                        }
                    ],
                }
            ]
        }
    }
    r = judge(snap(2, diag=CmdResult(0, json.dumps(doc), "")))["gpu.E032"]
    assert r.status is Status.WARN and "status 'Flaky' not known to hostcheck, not judged" in r.message


def test_a_dcgm_gatherer_cut_off_in_passive_is_the_health_checks_error_only(monkeypatch):
    from hostcheck import gather as G

    monkeypatch.setattr(G, "gather_dcgm", lambda *a, **k: time.sleep(5))
    s = G.gather(G.Options(dcgm_level=0, deadline=time.monotonic() + 0.5), {"dcgm"})
    assert isinstance(s.dcgm, DcgmSnapshot) and s.dcgm.diag is None
    r = judge(s.dcgm)
    assert r["gpu.E034"].status is Status.ERROR and "cut off" in r["gpu.E034"].message
    assert r["gpu.E030"].status is Status.SKIP
