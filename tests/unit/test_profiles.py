"""Profiles and deadlines: passive never starts the training Python; a run ends by its deadline with what did
not finish cut off as an error; a busy node gets no GPU job (its workload checks skip with the reason)."""

from __future__ import annotations

import json
import stat
import time
from dataclasses import replace
from types import SimpleNamespace

import hostcheck_scenarios as S
import pytest

from hostcheck import command
from hostcheck import gather as G
from hostcheck.check import cli
from hostcheck.check.request import build_request
from hostcheck.checks import all_checks
from hostcheck.core import evaluate
from hostcheck.gather.base import BUSY, Unavailable
from hostcheck.gather.busy import busy_reason, slurm_jobs
from hostcheck.profiles import DCGM_LEVEL_RUN_TIME, PROFILES


def ids(profile: str, capsys) -> list[dict]:
    assert command.main(["check", "--list", "--json", "--profile", profile]) == 0
    return json.loads(capsys.readouterr().out)["checks"]


def test_passive_and_epilog_list_only_read_only_checks(capsys):
    by_id = {c.id: c for c in all_checks()}
    for name in ("passive", "epilog"):
        rows = ids(name, capsys)
        assert rows and not any(r["workload"] for r in rows)
        assert all(by_id[r["id"]].needs <= PROFILES[name].needs for r in rows)
        assert not any("torch" in by_id[r["id"]].needs for r in rows)
    assert {r["id"] for r in ids("prolog", capsys)} > {r["id"] for r in ids("passive", capsys)}
    assert len(ids("full", capsys)) == len(all_checks())


def test_a_check_the_profile_cannot_run_is_a_usage_error(capsys):
    assert command.main(["check", "--profile", "passive", "--only", "workload.E001"]) == 2
    assert "does not run in the passive profile" in capsys.readouterr().err


@pytest.fixture
def spy_python(tmp_path):
    """A training Python that leaves a mark when anything starts it."""
    mark = tmp_path / "started"
    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return str(py), mark


def test_passive_never_starts_the_training_python_and_ends_well_inside_its_deadline(spy_python, capsys):
    py, mark = spy_python
    t0 = time.monotonic()
    rc = command.main(["check", "--profile", "passive", "--python", py, "--json"])
    took = time.monotonic() - t0
    doc = json.loads(capsys.readouterr().out)
    assert rc in (0, 1) and not mark.exists()
    assert {c["category"] for c in doc["checks"]} <= {
        "system",
        "gpu",
        "nvlink",
        "fabric",
        "tuning",
        "baseline",
    }
    assert took < PROFILES["passive"].deadline_s / 2


def test_a_hung_gatherer_is_cut_off_at_the_deadline(monkeypatch, capsys):
    monkeypatch.setattr(G, "gather_tuning", lambda *a, **k: time.sleep(60))
    t0 = time.monotonic()
    rc = command.main(["check", "--profile", "passive", "--deadline", "2", "--json"])
    took = time.monotonic() - t0
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and took < 8
    tuning = [c for c in doc["checks"] if c["category"] == "tuning" and c["status"] != "skip"]
    assert tuning and all(c["status"] == "error" for c in tuning)
    assert any("deadline" in c["message"] for c in tuning)


def test_a_hung_check_is_cut_off_and_the_rest_still_reported(monkeypatch, capsys):
    hang = replace(next(c for c in all_checks() if c.id == "system.E001"), fn=lambda s: time.sleep(60))
    monkeypatch.setattr(cli, "all_checks", lambda: [hang if c.id == hang.id else c for c in all_checks()])
    t0 = time.monotonic()
    rc = command.main(["check", "--profile", "passive", "--deadline", "3", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and time.monotonic() - t0 < 10
    by_id = {c["id"]: c for c in doc["checks"]}
    assert by_id["system.E001"]["status"] == "error" and "deadline" in by_id["system.E001"]["message"]
    # Everything after the hung check was cut off too: none of them was silently dropped.
    assert len(by_id) == len(ids("passive", capsys))


def test_burnin_adds_its_stress_run_unless_the_command_line_sets_one():
    def settled(*argv: str):
        request = build_request(command.parse(["check", *argv]).args, all_checks())
        return SimpleNamespace(burn=request.options.burn, profile=request.profile.name)

    assert settled("--profile", "burnin").burn == 600
    assert settled("--profile", "burnin", "--burn", "30").burn == 30
    assert settled("--profile", "burnin", "--burn", "0").burn == 0
    assert settled().burn == 0 and settled().profile == "standard"


def test_the_default_is_bounded_and_the_long_diagnostics_are_asked_for_by_name(capsys):
    """``hostcheck`` alone runs the standard profile: no GPU job, DCGM level 1 at most (its documented "seconds"),
    a minute at most; the GPU workload and DCGM level 2 run only in a profile named on the command line."""
    default = build_request(command.parse([]).args, all_checks())
    p = default.profile
    assert p.name == "standard" and p.deadline_s <= 60 and p.gpu_line_s == 0 and p.burn_s == 0
    assert "workload" not in p.needs and p.dcgm_level == 1 and DCGM_LEVEL_RUN_TIME[p.dcgm_level] == "seconds"
    assert not any(c.workload for c in default.checks)
    assert default.options.deadline - time.monotonic() <= 60
    # Everything the default judges, the full profile judges too, and more.
    full = build_request(command.parse(["--profile", "full"]).args, all_checks())
    assert {c.id for c in default.checks} < {c.id for c in full.checks}
    assert full.profile.dcgm_level == 2 and "workload" in full.profile.needs


@pytest.mark.parametrize(
    "argv",
    [["--burn", "20"], ["--nnodes", "2", "--rdzv-endpoint", "n1:29400"], ["--workload-sections", "env"]],
)
def test_a_workload_option_without_a_profile_that_runs_it_is_a_usage_error(argv, capsys):
    for profile in ([], ["--profile", "passive"], ["--profile", "standard"]):
        assert command.main([*profile, *argv]) == 2
        err = capsys.readouterr().err
        assert "sets up the GPU workload" in err and "add --profile full" in err, err


# ---------------------------------------------------------------------------------------------- busy node


def fake_proc(tmp_path, cmdlines: dict[int, bytes]):
    for pid, cmd in cmdlines.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(cmd)
    (tmp_path / "self").mkdir()
    return str(tmp_path)


def test_slurm_job_steps_on_the_node_are_found_but_our_own_job(tmp_path):
    proc = fake_proc(
        tmp_path,
        {
            10: b"slurmstepd: [4711.extern]\x00",
            11: b"slurmstepd: [4711.0]\x00",
            12: b"slurmstepd: [4712.batch]\x00",
            13: b"/usr/sbin/slurmd\x00-D\x00",
            14: b"python\x00train.py\x00slurmstepd: [1.0]",
        },
    )
    assert slurm_jobs(proc) == ["4711", "4712"]
    assert slurm_jobs(proc, own_job="4711") == ["4712"]
    assert busy_reason(None, proc, {"SLURM_JOB_ID": "4712"}) == "Slurm job 4711 running on this node"
    (tmp_path / "idle").mkdir()
    assert busy_reason(None, fake_proc(tmp_path / "idle", {13: b"/usr/sbin/slurmd\x00"}), {}) is None


def test_a_process_on_a_gpu_makes_the_node_busy(tmp_path):
    snap = S.make_snapshot(nvml=S.FakeNvml(gpus=S.gpus_with(2, procs=[4242])))
    (tmp_path / "p").mkdir()
    reason = busy_reason(snap.nvml, str(tmp_path / "p"), {})
    assert reason and "GPU 2" in reason and "4242" in reason
    assert busy_reason(S.make_snapshot().nvml, str(tmp_path / "p"), {}) is None


def test_busy_workload_checks_skip_with_the_reason_instead_of_judging_a_slow_gpu():
    snap = replace(S.make_snapshot(), workload=Unavailable(BUSY, "Slurm job 4711 running on this node"))
    results, _ = evaluate(snap, [c for c in all_checks() if c.workload])
    assert results and all(r.status.value == "skip" for r in results)
    assert all("Slurm job 4711" in r.message for r in results)


def test_the_gatherer_starts_no_workload_on_a_busy_node(monkeypatch):
    monkeypatch.setattr(G, "busy_reason", lambda nvml: "a GPU is in use: GPU 0: python[7]")
    monkeypatch.setattr(G, "gather_for", lambda *a, **k: pytest.fail("the workload started on a busy node"))
    snap = G.gather(G.Options(), {"workload"})
    assert isinstance(snap.workload, Unavailable) and snap.workload.kind == BUSY
