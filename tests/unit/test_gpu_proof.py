"""scripts/gpu-proof on the CPU, up to where a GPU is needed: its plan fits the lent machine's slot and grows with the
GPU count, every JSON file it leaves parses on its own, summary.txt grows after every step (a run cut off keeps
what finished), and nothing outside its output folder changes. The training Python is
tests/unit/fixtures/gpu_proof_python.py: it answers the GPU steps as a 1-GPU H200 node would and hands the rest
(hostcheck --quick among them) to the real interpreter.

The slot (the device machine this project may be lent): one H200, 10 minutes a command, 15 minutes in all with
start-up; the default run must stay under 6 minutes on one GPU, every limit and kill grace counted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-proof"
FAKE = ROOT / "tests" / "unit" / "fixtures" / "gpu_proof_python.py"
DEFAULT_STEPS = ["machine", "report-json", "report", "quick", "pytest", "benchmark", "burn"]
SCALED = {"report-json", "report", "pytest", "burn"}
DCGM_IDS = "gpu.E030,gpu.E031,gpu.E032,gpu.E033,gpu.E034"


def plan(*args: str) -> tuple[dict[str, int], int, bool]:
    """--plan's steps -> limit (s), its total, and whether it says the total is over one GPU's 6 minutes."""
    out = subprocess.run(
        [str(SCRIPT), "--plan", *args], capture_output=True, text=True, timeout=60, check=True
    )
    steps = {m[1]: int(m[2]) for m in re.finditer(r"^  (\S+)\s+(\d+)s\s+\d+s  ", out.stdout, re.M)}
    total = steps.pop("total")
    return steps, total, "over the 360 s" in out.stdout


def test_the_default_plan_fits_six_minutes_on_one_gpu_and_grows_with_the_gpus():
    one, total, over = plan("--gpus", "1")
    assert list(one) == DEFAULT_STEPS  # DCGM's diagnostic and hostcheck bench are opt-in
    assert total == sum(one.values()) + 3 * len(one) and total <= 360
    eight, total8, _ = plan("--gpus", "8")
    assert all(eight[k] > one[k] for k in SCALED) and all(eight[k] == one[k] for k in set(one) - SCALED)
    assert total8 > total
    more, _, _ = plan("--gpus", "1", "--dcgm", "--bench")
    assert list(more) == [*DEFAULT_STEPS, "dcgm", "bench"] and more["dcgm"] >= 120  # dcgmi diag -r 2: ~2 min
    assert (
        not over and plan("--gpus", "1", "--dcgm")[2]
    )  # with DCGM's 2 minutes it no longer fits, and says so
    assert plan("--gpus", "1", "--scale", "2")[0]["pytest"] == 2 * one["pytest"]


def test_help_gives_the_run_time_and_where_each_figure_comes_from():
    out = subprocess.run(
        [str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "plan on 1 GPU(s)" in out and "plan on 8 GPU(s)" in out
    assert "measured on the reference H100 node" in out and "estimate" in out
    assert "20 s wall" in out  # the 1-process NCCL DDP under torchrun
    bad = subprocess.run([str(SCRIPT), "--gpus", "0", "--plan"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--gpus" in bad.stderr


def tree(path: Path) -> dict[str, tuple[int, int]]:
    """Every file under path -> (size, mtime_ns). Left out: .git, the linked venv, and reports/, where the test
    run's own logs grow (scripts/test's stage logs, the conftest watchdog's)."""
    out = {}
    for d, dirs, files in os.walk(path):
        dirs[:] = [x for x in dirs if x not in (".git", ".venv") and (d != str(path) or x != "reports")]
        for f in files:
            p = os.path.join(d, f)
            st = os.lstat(p)
            out[p] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def proof(tmp_path):
    """Runs scripts/gpu-proof with the fake training Python; HOME and TMPDIR are empty folders of the test's."""
    shim = tmp_path / "python"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    shim.chmod(0o755)
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    out = tmp_path / "out"
    log = tmp_path / "calls.jsonl"

    def start(*args: str, **env: str) -> subprocess.Popen:
        e = {**os.environ, "PYTHON": str(shim), "HOME": str(home), "TMPDIR": str(tmp), "FAKE_LOG": str(log)}
        e.pop("OUT", None)
        e.pop("PYTHONDONTWRITEBYTECODE", None)
        return subprocess.Popen(
            [str(SCRIPT), *args, str(out)],
            env={**e, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def calls() -> list[dict]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    start.out, start.home, start.tmp, start.calls = out, home, tmp, calls
    return start


def summary_rows(out: Path) -> dict[str, str]:
    rows = {}
    for line in (out / "summary.txt").read_text().splitlines():
        m = re.match(
            r"(\S+) +(ok|not ready|over 5% off|timed out|bad output|failed rc=\d+) +[\d.]+s of +\d+s  ", line
        )
        if m:
            rows[m[1]] = m[2]
    return rows


def json_files_parse(out: Path) -> list[str]:
    names = sorted(p.name for p in out.glob("*.json"))
    for n in names:
        json.loads((out / n).read_text())  # each on its own
    return names


def test_a_run_writes_valid_json_a_summary_per_step_and_nothing_outside_its_folder(proof):
    before = tree(ROOT)
    p = proof("--scale", "4")
    stdout, stderr = p.communicate(timeout=600)
    assert p.returncode == 0, stdout + stderr
    out = proof.out
    rows = summary_rows(out)
    assert list(rows) == DEFAULT_STEPS, rows
    assert rows["quick"] == "not ready" and all(rows[k] == "ok" for k in DEFAULT_STEPS if k != "quick")
    assert json_files_parse(out) == ["bench-matmul-h2d.json", "burn.json", "hostcheck.json", "machine.json"]
    # What a lent device machine returns is at most 8 files: the default run leaves 7.
    assert sorted(x.name for x in out.iterdir()) == [
        "bench-matmul-h2d.json",
        "burn.json",
        "hostcheck.json",
        "hostcheck.txt",
        "log.txt",
        "machine.json",
        "summary.txt",
    ]
    assert (
        "==>" not in (out / "hostcheck.json").read_text()
        and "warning" not in (out / "hostcheck.json").read_text()
    )
    log = (out / "log.txt").read_text()
    assert "==> report-json" in log and "fake report-json: a warning on stderr" in log
    text = (out / "summary.txt").read_text()
    assert "GPUs: 1;" in text and "finished after" in text and "7 of 7 steps ran" in text
    assert "machine: NVIDIA H200; driver 580.95.05; torch 2.13.0+cu130" in text and "12 passed" in text
    assert "bf16_tflops: short cold 690.0, long 690.0" in text and "report: score 100, ready True" in text
    assert "pytest test_the_hook_s_cost_per_call: hook_us_per_call=9.5" in text
    assert "==> hostcheck.prom (written by report-json)\nhostcheck_ready 1" in log
    # Nothing outside OUTDIR: the checkout, HOME and TMPDIR as they were; OUTDIR's own temporary folder gone.
    assert tree(ROOT) == before
    assert list(proof.home.iterdir()) == [] and list(proof.tmp.iterdir()) == []
    assert not (out / ".tmp").exists()
    hostcheck = [c["argv"] for c in proof.calls() if c["argv"][:2] == ["-m", "hostcheck"]]
    assert len(hostcheck) == 4
    for argv in hostcheck:
        assert argv[argv.index("--state-file") + 1] == str(out / ".tmp" / "hostcheck-state.json")
        assert argv[argv.index("--config") + 1].startswith(str(out) + "/")
        assert argv[argv.index("--profile") + 1] == "full"
    assert all(a[a.index("--skip") + 1] == DCGM_IDS for a in hostcheck if "--burn" not in a)
    options_are_hostcheck_s(hostcheck)
    # The real hostcheck --quick kept its counters where it was told.
    assert [c["written"] for c in proof.calls() if c["step"] == "quick-state"] == [True]


def options_are_hostcheck_s(calls: list[list[str]]) -> None:
    """The real hostcheck accepts every command line the steps gave the fake (--list: parse and select, run
    nothing), so an option the GPU node would refuse is caught here."""
    for argv in calls:
        if "--config" in argv:  # the run's empty configuration went with its temporary folder: make it again
            cfg = Path(argv[argv.index("--config") + 1])
            cfg.parent.mkdir(parents=True, exist_ok=True)
            cfg.touch()
        done = subprocess.run(
            [sys.executable, *argv, "--list"], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (argv, done.stderr[-2000:])


def wait_for(cond, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.1)


def alive(sid: int) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.getsid(int(d)) == sid:
                    pids.append(int(d))
            except OSError:
                pass
    return pids


def reap(p: subprocess.Popen) -> None:
    """Whatever of the run is still there (a failed test must not leave a hung fake behind)."""
    if p.poll() is None:
        p.kill()
    for pid in alive(p.pid):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def test_a_run_cut_off_mid_step_keeps_the_steps_that_finished(proof):
    p = proof("--scale", "4", FAKE_HANG="pytest")
    try:
        wait_for(
            lambda: "quick" in summary_rows(proof.out) if (proof.out / "summary.txt").exists() else False
        )
        wait_for(lambda: any(c["step"] == "pytest" for c in proof.calls()))
        os.kill(p.pid, signal.SIGTERM)
        p.communicate(timeout=60)
    finally:
        reap(p)
    assert p.returncode == 1
    assert list(summary_rows(proof.out)) == ["machine", "report-json", "report", "quick"]
    assert "cut off by SIGTERM during pytest" in (proof.out / "summary.txt").read_text()
    json_files_parse(proof.out)
    wait_for(lambda: alive(p.pid) == [], timeout=10)  # the hung step's processes went with it


def test_a_step_past_its_limit_is_killed_its_json_kept_apart_and_the_rest_runs(proof):
    """With the opt-in steps too: DCGM's diagnostic and hostcheck bench."""
    p = proof(
        "--scale",
        "0.4",
        "--dcgm",
        "--bench",
        FAKE_HANG="report-json",
        FAKE_BAD_JSON="burn",
        FAKE_QUICK="quick",
    )
    try:
        stdout, stderr = p.communicate(timeout=600)
    finally:
        reap(p)
    assert p.returncode == 1, stdout + stderr
    rows = summary_rows(proof.out)
    assert list(rows) == [*DEFAULT_STEPS, "dcgm", "bench"]
    assert rows["report-json"] == "timed out" and rows["report"] == "ok" and rows["pytest"] == "ok"
    assert rows["burn"] == "bad output" and rows["dcgm"] == "ok" and rows["bench"] == "ok"
    assert (proof.out / "hostcheck.json.invalid").exists() and (proof.out / "burn.json.invalid").exists()
    names = json_files_parse(proof.out)
    assert "hostcheck.json" not in names and {"dcgm.json", "bench-tuning.json"} <= set(names)
    assert "7 of 9 steps ran" in (proof.out / "summary.txt").read_text()
    options_are_hostcheck_s([c["argv"] for c in proof.calls() if c["step"] in ("dcgm", "bench", "burn")])


def test_without_a_usable_gpu_it_stops_after_the_machine_and_says_why(proof):
    p = proof(FAKE_GPUS="0")
    _, stderr = p.communicate(timeout=120)
    assert p.returncode == 2 and "no torch with a usable CUDA GPU" in stderr
    assert json_files_parse(proof.out) == ["machine.json"]
    assert "no usable CUDA GPU" in (proof.out / "summary.txt").read_text()


def test_the_machine_script_on_this_cpu_says_there_is_no_gpu():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_proof_machine.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    doc = json.loads(done.stdout)
    assert done.returncode == 3 and doc["gpus"] == 0 and doc["date"].endswith("Z")
    assert "torch" in doc or "torch_error" in doc


def test_a_run_is_recorded_under_docs_gpu_proof_by_date_and_gpu(proof, tmp_path):
    p = proof("--scale", "4")
    p.communicate(timeout=600)
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "scripts" / "gpu-proof")
    done = subprocess.run(
        [str(repo / "scripts" / "gpu-proof"), "--record", str(proof.out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rec = repo / "docs" / "gpu-proof" / "2026-11-29-h200"
    assert sorted(x.name for x in rec.iterdir()) == [
        "bench-matmul-h2d.json",
        "burn.json",
        "hostcheck.json",
        "machine.json",
        "summary.txt",
    ]
    again = subprocess.run(
        [str(repo / "scripts" / "gpu-proof"), "--record", str(proof.out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode != 0 and "never overwritten" in again.stderr
