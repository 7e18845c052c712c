"""Every threshold is a data row read through one validated loader (hostcheck/thresholds.py); a site overrides any
of them by name under [thresholds]; the checks and the job doctor judge by the effective value.

Each rule is shown with the fault planted and absent."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hostcheck import config, thresholds
from hostcheck.checks import all_checks
from hostcheck.checks.workload import grading
from hostcheck.config import ConfigError
from hostcheck.job import diagnosis as V
from hostcheck.registry import REGISTRY, Status
from hostcheck.sweep.judge import FINDINGS as SWEEP_FINDINGS

URL = "https://"
OWN_FAIL = {
    "name": "made_up_fail",
    "check": "gpu.E009",
    "value": 3.0,
    "unit": "C",
    "basis": "own",
    "verdict": "fail",
    "source": "hostcheck: a guess",
    "why": "hostcheck's own line",
}


def rows_file(tmp_path: Path, *rows: dict) -> Path:
    path = tmp_path / "thresholds.json"
    path.write_text(json.dumps({"schema": 1, "about": "test", "thresholds": list(rows)}))
    return path


def test_every_row_of_both_files_loads_with_its_basis_verdict_and_check():
    all_checks()
    assert set(thresholds.ROWS) == set(thresholds.NODE_ROWS) | set(thresholds.JOB_ROWS)
    assert not set(thresholds.NODE_ROWS) & set(thresholds.JOB_ROWS)
    for name, row in thresholds.NODE_ROWS.items():
        assert row.check in REGISTRY or row.check in SWEEP_FINDINGS, name
        assert row.verdict in ("fail", "warn", "soften"), name
    for name, row in thresholds.JOB_ROWS.items():
        assert (row.check, row.verdict) == ("job", "advice"), name
    for name, row in thresholds.ROWS.items():
        # A line without a public source may warn, never fail.
        assert row.basis == "public" or row.verdict != "fail", name
        assert row.source.startswith(URL) or row.basis == "own", name
        assert row.low <= row.value <= row.high, name


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({}, "a line without a public source may warn, never fail"),
        ({"basis": "public"}, "a public row's source must be its https:// address"),
        ({"verdict": "warn", "why": "a guess"}, "an own row's why must say it is hostcheck's own"),
        ({"basis": "measured"}, "basis must be one of public, own"),
        ({"verdict": "block"}, "verdict must be one of fail, warn, soften, advice"),
        ({"verdict": "warn", "range": [5, 10]}, "value 3.0 outside its range"),
        ({"verdict": "warn", "see": ["http://x"]}, "every 'see' must be an https:// address"),
    ],
)
def test_the_loader_refuses_a_planted_bad_row(tmp_path, change, said):
    path = rows_file(tmp_path, {**OWN_FAIL, **change})
    with pytest.raises(ValueError, match=f"made_up_fail: {said}".replace("(", r"\(").replace(".", r"\.")):
        thresholds.load(path)


def test_the_same_row_with_a_warn_verdict_or_a_public_source_loads(tmp_path):
    assert thresholds.load(rows_file(tmp_path, {**OWN_FAIL, "verdict": "warn"}))["made_up_fail"].value == 3.0
    public = {**OWN_FAIL, "basis": "public", "source": "https://example.org/limits"}
    assert thresholds.load(rows_file(tmp_path, public))["made_up_fail"].verdict == "fail"
    # Without a verdict: public rows may fail, own rows only warn.
    bare = {k: v for k, v in OWN_FAIL.items() if k != "verdict"}
    assert thresholds.load(rows_file(tmp_path, bare))["made_up_fail"].verdict == "warn"


def test_a_name_in_both_files_is_refused(tmp_path):
    a = rows_file(tmp_path, {**OWN_FAIL, "verdict": "warn"})
    b = tmp_path / "other.json"
    b.write_text(a.read_text())
    with pytest.raises(ValueError, match="made_up_fail: also a row of another thresholds file"):
        thresholds.load_all(a, b)


# ------------------------------------------------------------------------------------ [thresholds] by name


def test_the_configuration_overrides_node_and_job_rows_by_name():
    c = config.parse(
        {"thresholds": {"achievable_pass_fraction": 0.95, "min_batches": 10, "input_wait_share": 0.3}}
    )
    assert c.thresholds.achievable_pass_fraction == 0.95
    assert (c.job_thresholds.min_batches, c.job_thresholds.input_wait_share) == (10, 0.3)
    assert config.Config().thresholds.achievable_pass_fraction == 0.9
    assert config.Config().job_thresholds.min_batches == 5


@pytest.mark.parametrize(
    ("table", "key", "reason"),
    [
        ({"achievable_pass_fractoin": 0.9}, "thresholds.achievable_pass_fractoin", "unknown key"),
        ({"min_batches": 2.5}, "thresholds.min_batches", "must be an integer, not a number"),
        (
            {"busbw_floor_nvlink_gbs": "180 GB/s"},
            "thresholds.busbw_floor_nvlink_gbs",
            "must be a number, not a string",
        ),
        (
            {"achievable_pass_fraction": 90},
            "thresholds.achievable_pass_fraction",
            "must be from 0.01 to 1, not 90",
        ),
        ({"input_wait_share": True}, "thresholds.input_wait_share", "not a boolean"),
    ],
)
def test_a_bad_override_names_its_key(table, key, reason):
    with pytest.raises(ConfigError) as info:
        config.parse({"thresholds": table}, "site.toml")
    assert info.value.key == key and reason in info.value.reason


def test_a_bad_override_exits_2_naming_the_key(tmp_path):
    path = tmp_path / "hostcheck.toml"
    path.write_text("[thresholds]\nmin_batches = 2.5\n")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    p = subprocess.run(
        [sys.executable, "-m", "hostcheck", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert p.returncode == 2 and "thresholds.min_batches: must be an integer" in p.stderr


# ------------------------------------------------------------------------------- the effective value judges


def test_the_workload_lines_are_the_effective_ones():
    site = config.parse({"thresholds": {"busbw_floor_nvlink_gbs": 150.0, "amp_speedup_warn": 2.0}}).thresholds
    # 170 GB/s over NVLink: below GCM's 180 fails by default; a site floor of 150 passes it (above 1.05 x 150).
    assert grading.busbw_status(170.0, 8, True) == Status.FAIL
    assert grading.busbw_status(170.0, 8, True, grading.lines(config.Config(thresholds=site))) == Status.PASS
    assert grading.amp_speedup_status(1.5) == Status.PASS
    assert grading.amp_speedup_status(1.5, site) == Status.WARN
    assert grading.lines(None) is grading.DEFAULT


def test_the_job_doctor_judges_by_the_effective_lines():
    from test_job_verdict import analysis, rank

    a = analysis(ranks=(rank(wait_share=0.3, num_workers=2),), gpu_util=50.0)
    assert V.diagnose(a).kind == "input-bound"
    loose = dataclasses.replace(V.DEFAULT, input_wait_share=0.5)
    assert V.diagnose(a, loose).kind != "input-bound"
    assert V.diagnose(a, loose).measures["input_wait_share_threshold"] == 0.5


def test_the_job_command_refuses_a_bad_override_before_it_starts(tmp_path, monkeypatch):
    from hostcheck.command import main

    path = tmp_path / "hostcheck.toml"
    path.write_text("[thresholds]\ninput_wait_share = 2\n")
    monkeypatch.setattr(config, "DEFAULT_PATH", str(path))
    marker = tmp_path / "started"
    assert main(["job", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"]) == 2
    assert not marker.exists()


def test_the_job_command_reads_the_file_config_names_instead_of_the_default(tmp_path, monkeypatch):
    from hostcheck.command import main

    broken = tmp_path / "hostcheck.toml"
    broken.write_text("[thresholds]\ninput_wait_share = 2\n")
    monkeypatch.setattr(config, "DEFAULT_PATH", str(broken))
    site = tmp_path / "site.toml"
    site.write_text("[thresholds]\ninput_wait_share = 0.4\n")
    marker = tmp_path / "started"
    job = ["--", sys.executable, "-c", f"open({str(marker)!r}, 'w'); raise SystemExit(3)"]
    # The named file wins: the default's bad row is not read, the command runs and its exit code comes back.
    assert main(["job", "-q", "--config", str(site), *job]) == 3 and marker.exists()
    marker.unlink()
    # A named file that is missing is refused before the command starts.
    assert main(["job", "-q", "--config", str(tmp_path / "absent.toml"), *job]) == 2 and not marker.exists()


def test_the_gradscaler_line_is_a_row_a_site_may_move():
    # Planted: 5 of 8 fp16 steps skipped is more than half, a warning; absent: 4 of 8 is not.
    assert grading.scaler_status(5, 8) == Status.WARN and grading.scaler_status(4, 8) == Status.PASS
    assert thresholds.NODE_ROWS["scaler_skipped_warn_fraction"].verdict == "warn"
    site = config.parse({"thresholds": {"scaler_skipped_warn_fraction": 0.75}}).thresholds
    assert (
        grading.scaler_status(5, 8, site) == Status.PASS and grading.scaler_status(7, 8, site) == Status.WARN
    )
    assert grading.scaler_status(8, 8, site) == Status.FAIL  # stuck fails whatever the line


def _threads(n: int, cfg: config.Config | None = None):
    import hostcheck_scenarios as S

    from hostcheck.core import evaluate
    from hostcheck.gather import Options

    facts = {k: v for k, v in S.h100_facts().items() if k != "gpunode_tuning"}
    probe = S.h100_probe(env={"LD_PRELOAD": S.TCMALLOC, "OMP_NUM_THREADS": str(n)})
    snap = S.make_snapshot(probe=probe, facts=facts, options=Options(config=cfg or config.Config()))
    checks = [c for c in all_checks() if c.id == "tuning.E005"]
    (result,), _ = evaluate(snap, checks)
    return result


def test_the_idle_threads_line_is_a_row_a_site_may_move():
    budget = int(_threads(1).expected.split()[1])  # "<= 14 (112 cores / 8 GPUs)"
    # Planted: one thread under half the budget warns; absent: half the budget (rounded down) passes.
    low, half = budget // 2 - 1, budget // 2
    assert _threads(low).status == Status.WARN and "idle" in _threads(low).message
    assert _threads(half).status == Status.PASS
    site = config.Config(
        thresholds=config.parse({"thresholds": {"omp_threads_idle_warn_fraction": 0.1}}).thresholds
    )
    assert _threads(low, site).status == Status.PASS
