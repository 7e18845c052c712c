"""`hostcheck bench`: usage errors exit 2, the subcommand of `hostcheck`, and one real tiny run in this venv."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from hostcheck import command
from hostcheck.bench import BENCH_SCHEMA_VERSION, cli
from hostcheck.child.launch import MARKER


def bench(argv: list[str]) -> int:
    """`hostcheck bench ARGV`, in this process."""
    return command.main(["bench", *argv])


def bench_args(*argv: str):
    """The options `hostcheck bench ARGV` hands to bench, validated."""
    return cli.validate(command.parse(["bench", *argv]).args)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--pairs", "0"], "--pairs must be >= 1"),
        (["--warmup-pairs", "-1"], "--warmup-pairs"),
        (["--images", "0"], "--images and --batch"),
        (["--timeout", "0"], "--timeout"),
        (["--only", "allocator,nonsense"], "unknown comparison nonsense"),
        (["--skip", "gpu"], "unknown comparison gpu"),
        (["--shm-small", "64MB"], "--shm-small '64MB'"),
        (["--shm-large", "120%"], "--shm-large '120%'"),
        (["--shm-small", "1G", "--shm-large", "512M"], "smaller than --shm-large"),
        (["--shm-small", "99999999999999T", "--shm-large", "50%"], "smaller than --shm-large 50%"),
        (["--shm-small", "60%", "--shm-large", "50%"], "smaller than --shm-large 50%"),
        (["--seed", "-1"], "--seed -1: give a whole number from 0 to 18446744073709551615"),
        (["--seed", str(1 << 64)], "--seed"),
        (["--python", "/nonexistent/python"], "not an executable file"),
        (["--json", "/nonexistent-dir/out.json"], "--json /nonexistent-dir/out.json"),
        (["--png", "/nonexistent-dir/out.png"], "--png"),
        (["--pillow-simd-wheel", "/nonexistent.whl"], "no such file"),
        (["--pairs", "many"], "invalid int value"),
        (["--frobnicate"], "unrecognized arguments"),
    ],
)
def test_usage_errors_exit_2(argv, needle, capsys):
    assert bench(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hostcheck bench: error: ") and needle in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--shm-small", "64M", "--shm-large", "50%"],
        ["--shm-small", "1%", "--shm-large", "50%"],
        ["--seed", "0"],
        ["--seed", str((1 << 64) - 1)],
    ],
)
def test_sizes_and_seeds_in_range_are_taken(argv):
    bench_args(*argv)  # the same options in range: no usage error


def test_hostcheck_dispatches_bench(capsys):
    assert command.main(["bench", "--pairs", "0"]) == 2
    assert "hostcheck bench: error: --pairs" in capsys.readouterr().err
    assert command.main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: hostcheck bench") and "--apply-advice" in out
    command.main(["--help"])
    assert "hostcheck bench" in capsys.readouterr().out


FAKE = """#!{exe}
import json, sys
if "{mode}" == "crash":
    sys.stderr.write("ImportError: libpython is gone\\n")
    sys.exit(1)
print({marker!r} + json.dumps({{"ok": True, "python": "3.11", "torch": None,
      "torch_error": "ModuleNotFoundError: No module named 'torch'", "pil": {{}}}}))
"""


@pytest.mark.parametrize(
    ("mode", "needle"), [("notorch", "has no torch (ModuleNotFoundError"), ("crash", "libpython is gone")]
)
def test_a_training_python_that_cannot_run_the_bench_is_an_environment_error(tmp_path, capsys, mode, needle):
    py = tmp_path / "python"
    py.write_text(FAKE.format(exe=sys.executable, mode=mode, marker=MARKER))
    py.chmod(0o755)
    rc = bench(["--python", str(py), "--workdir", str(tmp_path / "w"), "--facts-dir", str(tmp_path), "-q"])
    assert rc == 2
    assert needle in capsys.readouterr().err


def test_quick_fills_its_defaults_and_explicit_values_win():
    args = bench_args("--quick", "--pairs", "4")
    assert (args.pairs, args.warmup_pairs, args.images) == (4, 1, 128)
    args = bench_args("--advice-file", "/tmp/x.yml")
    assert (args.pairs, args.warmup_pairs, args.images, args.apply_advice) == (
        cli.DEFAULTS["pairs"],
        1,
        cli.DEFAULTS["images"],
        True,
    )
    assert cli.DEFAULTS["pairs"] >= 5 and cli.QUICK["pairs"] < cli.DEFAULTS["pairs"]
    args = bench_args("--warmup-pairs", "0")
    assert args.warmup_pairs == 0


def test_real_tiny_bench_in_this_venv(tmp_path, capsys):
    """Real children of this venv's Python: JPEGs written, DataLoader workers, a training step, JSON, PNG."""
    pytest.importorskip("torch")
    pytest.importorskip("PIL")
    out_json, out_png, advice = tmp_path / "bench.json", tmp_path / "bench.png", tmp_path / "advice.yml"
    argv = ["--python", sys.executable, "--only", "workers", "--quick", "--pairs", "1"]
    argv += [
        "--images",
        "16",
        "--batch",
        "8",
        "--workdir",
        str(tmp_path / "work"),
        "--facts-dir",
        str(tmp_path),
    ]
    argv += ["--json", str(out_json), "--png", str(out_png), "--advice-file", str(advice)]
    assert bench(argv) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "tuning" in text and "verdict" in text and "too few pairs" in text
    # Announced without a guessed figure; estimated once each of the first group's workers has answered.
    err = captured.err.splitlines()
    assert any("6 runs in 3 worker processes" in ln and "first runs' measured cost" in ln for ln in err), err
    (measured,) = [i for i, ln in enumerate(err) if "measured here: a pipeline run" in ln]
    assert "[3/6]" in err[measured - 1] and "in all" in err[measured] and "left" in err[measured], err
    doc = json.loads(out_json.read_text())
    assert doc["schema"] == "hostcheck-bench" and doc["schema_version"] == BENCH_SCHEMA_VERSION
    assert doc["python"]["torch"] and doc["host"]["cpus"] >= 1 and doc["options"]["pairs"] == 1
    comps = {c["key"]: c for c in doc["comparisons"]}
    assert "workers/pipeline:w1" in comps
    for c in comps.values():
        assert c["status"] == "measured", c
        assert c["verdict"] == "too few pairs"
        (pair,) = c["pairs"]
        assert pair["a"] > 0 and pair["b"] > 0 and pair["ratio"] == pytest.approx(pair["b"] / pair["a"])
        assert pair["order"] == "BA"  # the measured round follows the warm-up round (A B)
    assert comps["workers/pipeline:w1"]["b"]["config"] == {"workers": 1}
    runs = doc["runs"]
    assert [(r["variant"], r["warmup"]) for r in runs] == [
        ("w0", True), ("w1", True), ("w2", True), ("w2", False), ("w1", False), ("w0", False)
    ]  # fmt: skip
    assert all(r["record"]["items"] == 16 and r["record"]["workload"] == "pipeline" for r in runs)
    assert all(r["record"]["pil"]["version"] and r["record"]["started"] for r in runs)
    # One worker process per variant served both of its runs (the warm-up one first), then exited.
    procs = {p["variant"]: p for p in doc["processes"]}
    assert sorted(procs) == ["w0", "w1", "w2"]
    assert all(p["requests"] == 2 and p["ended"] == "exit 0" and p["startup_s"] > 0 for p in procs.values())
    for r in runs:
        assert r["pid"] == procs[r["variant"]]["pid"] and r["request"] == (1 if r["warmup"] else 2)
    assert doc["chart"]["path"] == str(out_png)
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert advice.read_text().startswith("---\n# hostcheck bench advice for ")
    # The images are kept for the next run.
    work = tmp_path / "work"
    (folder,) = [p for p in os.listdir(work) if p.startswith("jpeg-")]
    assert len([f for f in os.listdir(work / folder) if f.endswith(".jpg")]) == 16


def test_list_prints_the_runs_and_the_worker_processes():
    from argparse import Namespace

    from hostcheck.bench.plan import Group, Plan, Skip, Variant

    a, b, c = (Variant(k, f"label {k}") for k in "abc")
    plan = Plan(
        (
            Group("allocator/train", "allocator", "train", "train", {"workload": "train"}, (a, b, c)),
            Group("workers/pipeline", "workers", "pipeline", "pipe", {"images": 256}, (a, b)),
        ),
        (Skip("shm", "/dev/shm 64M vs 50%", "not root", "run as root"),),
    )
    text = cli._render_plan(plan, Namespace(pairs=5, warmup_pairs=1))
    first, *rest = text.splitlines()
    assert first == "30 runs (5 pairs + 1 warm-up) in 5 worker processes (one per variant):"
    assert "  workers/pipeline: pipe, 256 images" in rest and "    B c: label c" in rest
    assert rest[-1] == "  skipped shm (/dev/shm 64M vs 50%): not root; hint: run as root"


def test_the_estimate_comes_from_the_runs_measured_on_this_node():
    """No figure before a run is measured (a guessed constant said 1 minute for 4.5); then each group's worker
    start-up and each workload's run cost as measured here, refined after every run."""
    from hostcheck.bench.eta import Eta
    from hostcheck.bench.plan import Group, Plan, Variant

    a, b, c = (Variant(k, f"label {k}") for k in "abc")
    plan = Plan(
        (
            Group("threads/train", "threads", "train", "train", {}, (a, b, c)),
            Group("workers/pipeline", "workers", "pipeline", "pipe", {}, (a, b)),
        ),
        (),
    )
    now = [0.0]
    eta = Eta.of(plan, pairs=3, warmup=1, clock=lambda: now[0])  # 12 train runs, then 8 pipeline runs
    assert eta.left_s() is None
    eta.group_started("threads/train")
    now[0] = 7.0 + 15.0  # the workers took 7 s to start, the first run 15 s
    eta.run_done("threads/train", "train", 15.0)
    assert eta.startup_s == [7.0]
    # 11 train runs at 15 s, then the pipeline group: one start-up of 7 s and 8 runs costed as train's for now.
    assert eta.left_s() == pytest.approx(11 * 15 + 7 + 8 * 15)
    for _ in range(11):
        eta.run_done("threads/train", "train", 13.0)
    eta.group_started("workers/pipeline")
    now[0] += 9.0 + 5.0
    eta.run_done("workers/pipeline", "pipeline", 5.0)
    assert eta.startup_s == [7.0, 9.0] and eta.left_s() == pytest.approx(7 * 5.0)


def test_sigterm_ends_the_bench_through_the_command_wrapper_and_the_old_handler_comes_back(
    monkeypatch, capsys, tmp_path
):
    """bench gets hostcheck's signal handling: 143, one line, the previous SIGTERM handler restored."""
    before = signal.getsignal(signal.SIGTERM)

    def killed(facts_dir):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not interrupt")

    monkeypatch.setattr(cli, "gather_facts", killed)
    assert bench(["--quick", "--workdir", str(tmp_path)]) == 143
    err = capsys.readouterr().err
    assert "hostcheck bench: interrupted by SIGTERM" in err and "Traceback" not in err
    assert signal.getsignal(signal.SIGTERM) == before


@pytest.mark.parametrize("where", [["bench", "--debug"], ["--debug", "bench"]])
def test_debug_shows_the_traceback_of_an_internal_error_in_bench(where, monkeypatch, capsys, tmp_path):
    def broken(facts_dir):
        raise RuntimeError("kaput")

    monkeypatch.setattr(cli, "gather_facts", broken)
    argv = ["--quick", "--workdir", str(tmp_path)]
    assert command.main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert "hostcheck bench: internal error: RuntimeError: kaput (re-run with --debug)" in err
    assert "Traceback" not in err
    assert command.main([*where, *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and 'raise RuntimeError("kaput")' in err and "internal error" in err
