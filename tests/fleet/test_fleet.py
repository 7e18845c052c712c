"""The fleet report: judging node reports, worst-first ordering, missing nodes, the written pages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hostcheck import command, fleet


def report(host: str, score: int, ready: bool, checks: list[dict]) -> dict:
    return {
        "schema_version": 1,
        "host": {"hostname": host, "gpus": [{"index": i} for i in range(8)]},
        "versions": {"driver": "580.159.04", "torch": "2.11.0", "torch_cuda": "13.0"},
        "checks": checks,
        "score": {"value": score, "ready": ready},
    }


FAIL_ECC = {
    "id": "gpu.E004",
    "status": "fail",
    "weight": 5,
    "message": "GPU 3: 2 uncorrectable ECC errors",
    "hint": "drain the node and replace GPU 3",
}
WARN_TEMP = {
    "id": "gpu.W010",
    "status": "warn",
    "weight": 1,
    "message": "GPU 1 at 82 C",
    "hint": "check airflow",
}
PASS = {"id": "system.I001", "status": "pass", "weight": 1, "message": "ok"}


def write(tmp: Path, reports: dict[str, dict | str]) -> Path:
    d = tmp / "nodes"
    d.mkdir()
    for host, data in reports.items():
        (d / f"{host}.json").write_text(data if isinstance(data, str) else json.dumps(data))
    return d


def test_summarise_orders_failures_before_warnings():
    n = fleet.summarise("gpu001", report("gpu001", 62, False, [WARN_TEMP, PASS, FAIL_ECC]))
    assert n.host == "gpu001" and n.score == 62 and not n.ready and n.gpus == 8
    assert [f["id"] for f in n.findings] == ["gpu.E004", "gpu.W010"]


def test_label_shows_the_node_hostname_only_when_it_differs():
    assert (
        fleet.summarise("gpu001", report("gpu001.cluster", 100, True, [])).host == "gpu001 (gpu001.cluster)"
    )


def test_min_score_overrides_a_ready_verdict():
    assert fleet.summarise("x", report("a", 85, True, [PASS])).ready
    assert not fleet.summarise("x", report("a", 85, True, [PASS]), min_score=90).ready


def test_worst_first_missing_and_unreadable_nodes_count_as_not_ready(tmp_path):
    d = write(
        tmp_path,
        {
            "gpu001": report("gpu001", 100, True, [PASS]),
            "gpu002": report("gpu002", 40, False, [FAIL_ECC]),
            "gpu003": "{not json",
        },
    )
    nodes = fleet.load(d, expect=["gpu001", "gpu004"], min_score=None)
    assert [n.host for n in nodes] == ["gpu003", "gpu004", "gpu002", "gpu001"]
    assert nodes[0].problem.startswith("unreadable report")
    assert nodes[1].problem.startswith("no report")


def test_main_writes_both_pages_and_exits_by_readiness(tmp_path, capsys):
    d = write(
        tmp_path,
        {"gpu001": report("gpu001", 100, True, [PASS]), "gpu002": report("gpu002", 40, False, [FAIL_ECC])},
    )
    out = tmp_path / "out"
    assert command.main(["fleet", str(d), "--out", str(out)]) == 1
    md = (out / "fleet.md").read_text()
    page = (out / "fleet.html").read_text()
    assert "1 ready, 1 not ready" in md
    assert md.index("gpu002") < md.index("gpu001")  # worst first
    assert "replace GPU 3" in page and "<script" not in page
    assert "not ready: gpu002" in capsys.readouterr().out
    assert command.main(["fleet", str(d), "--out", str(out), "--expect"]) == 1


def test_all_ready_exits_zero_and_html_is_escaped(tmp_path):
    evil = dict(WARN_TEMP, message="<img src=x onerror=alert(1)>")
    d = write(tmp_path, {"gpu001": report("gpu001", 97, True, [PASS, evil])})
    assert command.main(["fleet", str(d)]) == 0
    page = (d / "fleet.html").read_text()
    assert "<img" not in page and "&lt;img" in page


def test_bad_usage_exits_two(tmp_path):
    assert command.main(["fleet", str(tmp_path / "missing")]) == 2
    assert command.main(["fleet", str(tmp_path), "--min-score", "140"]) == 2
    assert command.main(["fleet", str(tmp_path)]) == 2  # no reports at all
    assert command.main(["fleet", "--bogus"]) == 2


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["missing"], "missing is not a folder"),
        ([".", "--min-score", "140"], "--min-score must be between 0 and 100"),
        (["."], "no reports in ."),
        ([".", "--bogus"], "unrecognized arguments: --bogus"),
        (["--min-score", "x", "."], "argument --min-score: invalid int value: 'x'"),
    ],
)
def test_usage_errors_are_one_line_of_hostcheck_fleet(argv, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert command.main(["fleet", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hostcheck fleet: error: ") and needle in err and err.count("\n") == 1, err


def test_help_exits_zero(capsys):
    assert command.main(["fleet", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: hostcheck fleet") and "--expect" in out and "--min-score" in out


def test_python_m_hostcheck_fleet_as_the_playbook_runs_it(tmp_path):
    """playbooks/hostcheck.yml: `<python> -m hostcheck fleet DIR/nodes --out DIR --expect ... --min-score N`."""
    d = write(
        tmp_path, {"gpu001": report("gpu001", 100, True, [PASS]), "gpu002": report("gpu002", 95, True, [])}
    )
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    argv = [sys.executable, "-m", "hostcheck", "fleet", str(d), "--out", str(tmp_path), "--expect", "gpu001"]
    env = dict(os.environ, PYTHONPATH=os.path.abspath(root))
    p = subprocess.run([*argv, "gpu002"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.startswith("2 ready, 0 not ready"), p.stderr
    p = subprocess.run([*argv, "gpu003", "--min-score", "96"], capture_output=True, text=True, env=env)
    assert p.returncode == 1 and "not ready: gpu003, gpu002" in p.stdout, p.stderr
    assert (tmp_path / "fleet.md").is_file() and (tmp_path / "fleet.html").is_file()


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_standard_output_that_fails_or_whose_reader_left(tmp_path, unbuffered):
    """hostcheck's wrapper owns standard output: /dev/full is exit 2 in one line; a reader that left (EPIPE)
    costs nothing, and the exit code is still the fleet's verdict."""
    d = write(tmp_path, {"gpu001": report("gpu001", 40, False, [FAIL_ECC])})
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    env = dict(os.environ, PYTHONPATH=root, PYTHONUNBUFFERED=unbuffered)
    argv = [sys.executable, "-m", "hostcheck", "fleet", str(d)]
    with open("/dev/full", "w") as full:
        p = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True, env=env)
    assert p.returncode == 2, p.stderr
    assert p.stderr == "hostcheck fleet: error: writing to standard output: No space left on device\n"
    r, w = os.pipe()
    os.close(r)  # nobody will read: every write is EPIPE
    try:
        p = subprocess.run(argv, stdout=w, stderr=subprocess.PIPE, text=True, env=env)
    finally:
        os.close(w)
    assert p.returncode == 1 and p.stderr == ""
