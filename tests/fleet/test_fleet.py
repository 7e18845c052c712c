"""The fleet report: judging node reports, worst-first ordering, missing nodes, the written pages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hostcheck import command
from hostcheck.fleet import reports as fleet


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


# --- hostile reports: one bad node never costs the others (the hostile-input issue) -------------------------


def _run_fleet(d: Path, *extra: str, timeout: float = 30) -> subprocess.CompletedProcess:
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    return subprocess.run(
        [sys.executable, "-m", "hostcheck", "fleet", str(d), *extra],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=root),
        timeout=timeout,
    )


BAD_REPORTS = {
    "string-score": (lambda r: r["score"].update(value="100"), 'score.value is "100"'),
    "nan-score": (None, "NaN is not a JSON number"),
    "ready-string": (lambda r: r["score"].update(ready="false"), 'score.ready is "false"'),
    "checks-a-number": (lambda r: r.update(checks=5), "checks is 5"),
    "host-a-list": (lambda r: r.update(host=[1]), "host is [1]"),
    "check-message-a-dict": (lambda r: r["checks"][0].update(message={"a": 1}), "checks[0].message"),
    "gpus-a-string": (lambda r: r["host"].update(gpus="8"), 'host.gpus is "8"'),
    "score-200": (lambda r: r["score"].update(value=200), "score.value is 200, want 0 to 100"),
}


@pytest.mark.parametrize("case", sorted(BAD_REPORTS))
def test_a_malformed_report_is_named_and_skipped_the_others_still_get_their_pages(case, tmp_path):
    change, named = BAD_REPORTS[case]
    bad = report("gpu009", 100, True, [FAIL_ECC])
    if change is None:
        text = json.dumps(bad).replace('"value": 100', '"value": NaN')
    else:
        change(bad)
        text = json.dumps(bad)
    d = write(tmp_path, {"gpu001": report("gpu001", 100, True, [PASS]), "gpu009": text})
    p = _run_fleet(d, "--min-score", "90")
    assert p.returncode == 1 and "Traceback" not in p.stderr and p.stderr == "", p.stderr
    assert "not ready: gpu009" in p.stdout and "1 ready" in p.stdout
    md = (d / "fleet.md").read_text()
    assert named in md and "gpu001" in md, md
    # absent: the same node with its types right is ready
    (d / "gpu009.json").write_text(json.dumps(report("gpu009", 100, True, [PASS])))
    p = _run_fleet(d, "--min-score", "90")
    assert p.returncode == 0 and "2 ready, 0 not ready" in p.stdout, p.stdout + p.stderr


def test_ready_must_be_true_and_a_score_a_whole_number():
    base = report("a", 95, True, [PASS])
    for ready in ("false", "true", 1, None):
        assert not fleet.summarise("a", {**base, "score": {"value": 95, "ready": ready}}).ready
    for value in (float("nan"), float("inf"), "95", True, 95.0):
        n = fleet.summarise("a", {**base, "score": {"value": value, "ready": True}}, min_score=90)
        assert not n.ready and n.score is None
    assert fleet.summarise("a", base, min_score=90).ready


@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(
            lambda d: (d / "gpu009.json").write_text("[" * 100_000 + "]" * 100_000), id="nested-deep"
        ),
        pytest.param(lambda d: os.mkfifo(d / "gpu009.json"), id="fifo"),
        pytest.param(lambda d: (d / "gpu009.json").symlink_to("/dev/zero"), id="symlink-to-dev-zero"),
        pytest.param(lambda d: (d / "gpu009.json").mkdir(), id="a-folder"),
        pytest.param(lambda d: os.truncate(_touch(d / "gpu009.json"), 100 << 20), id="100mb"),
        pytest.param(
            lambda d: (d / "gpu009.json").write_bytes(b'{"checks": [], "x": "\xff"}'), id="bad-utf8"
        ),
        pytest.param(
            lambda d: (d / os.fsdecode(b"gpu009-\xff.json")).write_text(
                json.dumps(report("x", 100, True, []))
            ),
            id="file-name-not-utf8",
        ),
        pytest.param(
            lambda d: (d / "gpu009\x1b[2J.json").write_text(json.dumps(report("x", 100, True, []))),
            id="file-name-with-escape",
        ),
    ],
)
def test_hostile_report_files_are_named_never_hang_never_sink_the_others(plant, tmp_path):
    d = write(tmp_path, {"gpu001": report("gpu001", 100, True, [PASS])})
    plant(d)
    p = _run_fleet(d)
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr and "internal error" not in p.stderr, p.stderr
    assert "gpu009" in p.stdout and "1 ready, 1 not ready" in p.stdout and p.stdout.isascii()
    md = (d / "fleet.md").read_text()
    assert "unreadable report" in md and "| gpu001 |" in md


def _touch(path: Path) -> Path:
    path.write_bytes(b"")
    return path


def test_markdown_and_html_escape_every_node_field(tmp_path):
    evil = "<script>alert(1)</script>|x"
    r = report(
        evil, 50, False, [dict(FAIL_ECC, id="gpu.E004|<b>", message="a | b <img src=x>", hint="<i>h</i>")]
    )
    r["versions"] = {"driver": "<b>580</b>|", "torch": "2.11|<u>"}
    d = write(tmp_path, {"gpu|<em>001": r})
    assert command.main(["fleet", str(d)]) == 1
    md = (d / "fleet.md").read_text()
    page = (d / "fleet.html").read_text()
    for raw in ("<script", "<img", "<b>580", "|<b>", "<i>h", "<u>", "<em>"):
        assert raw not in md and raw not in page, raw
    row = next(line for line in md.splitlines() if "gpu\\|" in line)
    assert row.count(" | ") == 6, row  # seven cells: every | from a node is escaped
    assert "&lt;script&gt;" in md and "&lt;script&gt;" in page


def test_pages_are_written_through_the_report_writer_never_through_a_link(tmp_path):
    d = write(tmp_path, {"gpu001": report("gpu001", 100, True, [PASS])})
    precious = tmp_path / "precious"
    precious.write_text("keep me")
    (d / "fleet.md").symlink_to(precious)
    p = _run_fleet(d)
    assert p.returncode == 2 and "symbolic link" in p.stderr and "Traceback" not in p.stderr
    assert precious.read_text() == "keep me" and not (d / "fleet.html").exists()
    (d / "fleet.md").unlink()
    assert _run_fleet(d).returncode == 0 and (d / "fleet.md").is_file() and not (d / "fleet.md").is_symlink()


def test_out_naming_a_file_is_a_usage_error(tmp_path):
    d = write(tmp_path, {"gpu001": report("gpu001", 100, True, [PASS])})
    (tmp_path / "afile").write_text("x")
    p = _run_fleet(d, "--out", str(tmp_path / "afile"))
    assert p.returncode == 2 and "not a folder" in p.stderr and "internal error" not in p.stderr
    assert p.stderr.startswith("hostcheck fleet: error: --out")
    assert (tmp_path / "afile").read_text() == "x"


@pytest.mark.parametrize("sample", ["report.json", "h100-report.json"])
def test_real_reports_pass_the_schema_type_check(sample):
    from hostcheck.schema import report_schema, type_errors

    root = Path(__file__).resolve().parents[2]
    data = json.loads((root / "docs" / "samples" / sample).read_text())
    assert type_errors(data, report_schema()) == []
    data["score"]["ready"] = "false"  # planted: named
    assert type_errors(data, report_schema()) == ['score.ready is "false", want boolean']
