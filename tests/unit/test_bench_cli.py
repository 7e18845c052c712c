"""`hostcheck bench`: usage errors exit 2, the dispatch from `hostcheck`, and one real tiny run in this venv."""

from __future__ import annotations

import json
import os
import sys

import pytest

from hostcheck import cli as main_cli
from hostcheck.bench import BENCH_SCHEMA_VERSION, cli
from hostcheck.workload.runner import MARKER


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
        (["--python", "/nonexistent/python"], "not an executable file"),
        (["--json", "/nonexistent-dir/out.json"], "--json /nonexistent-dir/out.json"),
        (["--png", "/nonexistent-dir/out.png"], "--png"),
        (["--pillow-simd-wheel", "/nonexistent.whl"], "no such file"),
        (["--pairs", "many"], "invalid int value"),
        (["--frobnicate"], "unrecognized arguments"),
    ],
)
def test_usage_errors_exit_2(argv, needle, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hostcheck bench: error: ") and needle in err


def test_hostcheck_dispatches_bench(capsys):
    assert main_cli.main(["bench", "--pairs", "0"]) == 2
    assert "hostcheck bench: error: --pairs" in capsys.readouterr().err
    assert main_cli.main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: hostcheck bench") and "--apply-advice" in out
    main_cli.main(["--help"])
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
    rc = cli.main(["--python", str(py), "--workdir", str(tmp_path / "w"), "--facts-dir", str(tmp_path), "-q"])
    assert rc == 2
    assert needle in capsys.readouterr().err


def test_quick_fills_its_defaults_and_explicit_values_win():
    args = cli.validate(cli.build_parser().parse_args(["--quick", "--pairs", "4"]))
    assert (args.pairs, args.warmup_pairs, args.images) == (4, 0, 128)
    args = cli.validate(cli.build_parser().parse_args(["--advice-file", "/tmp/x.yml"]))
    assert (args.pairs, args.warmup_pairs, args.images, args.apply_advice) == (5, 0, 256, True)


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
    argv += ["--json", str(out_json), "--png", str(out_png), "--advice-file", str(advice), "-q"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "tuning" in text and "verdict" in text and "too few pairs" in text
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
        assert pair["order"] == "AB"
    assert comps["workers/pipeline:w1"]["b"]["config"] == {"workers": 1}
    runs = doc["runs"]
    assert [r["variant"] for r in runs][:2] == ["w0", "w1"]
    assert all(r["record"]["items"] == 16 and r["record"]["workload"] == "pipeline" for r in runs)
    assert all(r["record"]["pil"]["version"] for r in runs)
    assert doc["chart"]["path"] == str(out_png)
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert advice.read_text().startswith("# hostcheck bench advice for ")
    # The images are kept for the next run.
    work = tmp_path / "work"
    (folder,) = [p for p in os.listdir(work) if p.startswith("jpeg-")]
    assert len([f for f in os.listdir(work / folder) if f.endswith(".jpg")]) == 16
