"""The human report, rule by rule, on three nodes (tests/unit/fixtures/hostcheck_scenarios.py): the healthy 8 x H100
node, a CPU machine with no NVIDIA driver (most checks cannot run) and a faulty node (one fault on all eight GPUs,
three on single parts). Each rule is tested where it bites and where it must not."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import hostcheck_scenarios as S
import pytest

from hostcheck.check.render.json import render_json
from hostcheck.check.render.text import (
    DEFAULT_WIDTH,
    MIN_WIDTH,
    fold,
    fold_message,
    render_text,
    terminal_width,
)
from hostcheck.registry import CATEGORIES, Status

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def report(name: str, profile: str = "standard"):
    return S.scenario_report(name, profile)


def lines(text: str) -> list[str]:
    return ANSI.sub("", text).rstrip("\n").split("\n")


def joined(text: str) -> str:
    """The report with its wrapping undone: what a reader reads, one line."""
    return " ".join(ANSI.sub("", text).split())


# ------------------------------------------------------------------------------------------------- width


def test_the_width_is_columns_else_the_terminals_else_100():
    class Pipe:
        def isatty(self) -> bool:
            return False

        def fileno(self) -> int:
            raise OSError

    assert terminal_width(Pipe(), {}) == DEFAULT_WIDTH == 100
    assert terminal_width(Pipe(), {"COLUMNS": "132"}) == 132
    assert terminal_width(Pipe(), {"COLUMNS": "10"}) == MIN_WIDTH  # narrower: no fix would be readable
    assert (
        terminal_width(Pipe(), {"COLUMNS": "wide"}) == 100 and terminal_width(None, {"COLUMNS": "٣٠"}) == 100
    )
    main, sub = pty.openpty()
    try:
        os.set_blocking(sub, True)
        import fcntl
        import struct
        import termios

        fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 73, 0, 0))
        with os.fdopen(os.dup(sub), "w") as tty:
            assert terminal_width(tty, {}) == 73
            assert terminal_width(tty, {"COLUMNS": "90"}) == 90  # COLUMNS first, as shutil and ls have it
    finally:
        os.close(main)
        os.close(sub)


@pytest.mark.parametrize("name", ["healthy_8x_h100", "no_gpu_node", "faulty_node"])
@pytest.mark.parametrize("width", [40, 60, 80, 100, 132])
def test_every_line_fits_the_width(name, width):
    for verbose in (False, True):
        text = render_text(report(name), verbose=verbose, width=width)
        too_wide = [ln for ln in lines(text) if len(ln) > width]
        assert not too_wide, too_wide


def test_names_and_messages_longer_than_the_line_still_fit():
    r = report("faulty_node")
    long_host = {**r.host, "hostname": "node-" + "x" * 300}
    worded = tuple(replace(x, message="/" + "y" * 300, hint="z" * 250) for x in r.results)
    r = replace(r, host=long_host, results=worded)
    for width in (40, 80):
        for verbose in (False, True):
            out = lines(render_text(r, verbose=verbose, width=width))
            assert max(map(len, out)) <= width, [ln for ln in out if len(ln) > width][:3]


def test_the_command_wraps_to_columns_and_to_100_in_a_pipe(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("COLUMNS", None)
    argv = [sys.executable, "-m", "hostcheck", "--profile", "passive", "--facts-dir", str(tmp_path)]
    piped = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert piped.returncode in (0, 1) and max(map(len, piped.stdout.splitlines())) <= 100, piped.stdout
    narrow = subprocess.run(argv, capture_output=True, text=True, env={**env, "COLUMNS": "64"}, timeout=120)
    assert max(map(len, narrow.stdout.splitlines())) <= 64 < max(map(len, piped.stdout.splitlines()))


# ------------------------------------------------------------------------------------------------- findings


def test_every_failure_and_warning_is_there_in_full_with_its_fix_worst_first():
    r = report("faulty_node")
    text = joined(render_text(r, width=80))
    found = [x for x in r.results if x.status.severity > 0]
    assert {x.id for x in found} >= {"gpu.E005", "gpu.E007", "nvlink.E001", "tuning.E001"}
    for x in found:
        assert x.id in text and joined(x.hint) in text, x.id
        assert joined(fold_message(x.message)) in text, x.id
    order = [text.index(f" {x.id} ") for x in found]
    fails = [text.index(f" {x.id} ") for x in found if x.status in (Status.FAIL, Status.ERROR)]
    warns = [text.index(f" {x.id} ") for x in found if x.status is Status.WARN]
    assert len(order) == len(set(order)) and (not warns or max(fails) < min(warns))


def test_a_healthy_node_fits_one_screen_and_says_ready():
    for width in (80, 100):
        out = lines(render_text(report("healthy_8x_h100"), width=width))
        assert len(out) <= 25, "\n".join(out)
        assert any(ln.startswith("score 100/100") and "READY" in ln for ln in out)
        assert not any(ln.startswith(("FAIL", "WARN", "ERROR")) for ln in out)


def test_passed_checks_are_one_line_per_category():
    for name in ("healthy_8x_h100", "faulty_node", "no_gpu_node"):
        r = report(name)
        out = lines(render_text(r))
        passing = {x.category for x in r.results if x.status is Status.PASS}
        pass_lines = [ln for ln in out if ln.startswith("PASS")]
        assert [ln.split()[1].rstrip(":") for ln in pass_lines] == [c for c in CATEGORIES if c in passing]
        for ln, cat in zip(pass_lines, [c for c in CATEGORIES if c in passing]):
            n = sum(x.category == cat and x.status is Status.PASS for x in r.results)
            assert f" {n} check" in ln
        # No passed check has a line of its own.
        for x in r.results:
            if x.status is Status.PASS:
                assert x.message not in "\n".join(out), x.id


def test_skips_are_one_entry_with_the_count_and_the_commonest_reason_once():
    r = report("no_gpu_node")
    text = render_text(r, width=100)
    skips = [x for x in r.results if x.status is Status.SKIP]
    nvml = [x for x in skips if x.message.startswith("NVML unavailable")]
    assert len(skips) > 30 and len(nvml) >= 15  # most checks cannot run here, a score of them for one reason
    assert joined(text).count(joined(nvml[0].message)) == 1
    entry = [ln for ln in lines(text) if ln.startswith("SKIP")]
    assert len(entry) == 1 and f"{len(skips)} checks not run" in entry[0]
    assert f"({len(nvml)})" in joined(text)
    assert len(lines(text)) <= 40, text  # the no-GPU node: over 100 lines before


def test_a_node_without_skips_has_no_skip_line():
    r = report("healthy_8x_h100")
    r = replace(r, results=tuple(x for x in r.results if x.status is not Status.SKIP))
    assert not any(ln.startswith("SKIP") for ln in lines(render_text(r)))


def test_the_same_finding_on_several_gpus_is_said_once():
    text = joined(render_text(report("faulty_node"), width=100))
    assert "GPU 0-7: PCIe x8, capable of x16 (link degraded)" in text
    assert "GPU 3: PCIe" not in text


@pytest.mark.parametrize(
    ("parts", "folded"),
    [
        (["GPU 0: x8", "GPU 1: x8", "GPU 2: x8"], ["GPU 0-2: x8"]),
        (["GPU 0: x8", "GPU 1: x8", "GPU 3: x8", "GPU 5: x16"], ["GPU 0-1, 3: x8", "GPU 5: x16"]),
        (["GPU 2: hot", "fans slow", "GPU 1: hot"], ["GPU 1-2: hot", "fans slow"]),
        (
            [
                "mlx5_0 port 1: 3 new error(s)",
                "mlx5_1 port 1: 3 new error(s)",
                "mlx5_1 port 2: 3 new error(s)",
            ],
            [
                "mlx5_0 port 1: 3 new error(s)",
                "mlx5_1 port 1: 3 new error(s)",
                "mlx5_1 port 2: 3 new error(s)",
            ],
        ),
        (
            ["mlx5_0 port 1: down", "mlx5_1 port 1: down", "mlx5_3 port 1: down"],
            ["mlx5_0-mlx5_1, mlx5_3 port 1: down"],
        ),
        (["GPU 4: ok", "GPU 4: ok"], ["GPU 4: ok"]),
        (["queue #1: full", "queue #2: full"], ["queue #1-#2: full"]),
        (["mc0 corrected: 0", "mc2 corrected: 0", "mc3 corrected: 0"], ["mc0, mc2-mc3 corrected: 0"]),
        (["GPU 0: 80 C", "GPU 1: 81 C"], ["GPU 0: 80 C", "GPU 1: 81 C"]),  # different findings stay apart
        (["no GPU: driver missing"], ["no GPU: driver missing"]),
    ],
)
def test_fold(parts, folded):
    assert fold(parts) == folded


def test_fold_message_keeps_every_part():
    msg = "GPU 0: 90 C (>= 84 C); GPU 1: 90 C (>= 84 C); GPU 2: 70 C (>= 84 C)"
    assert fold_message(msg) == "GPU 0-1: 90 C (>= 84 C); GPU 2: 70 C (>= 84 C)"


# ------------------------------------------------------------------------------------------------- verbose


def test_verbose_shows_every_check_and_its_details():
    r = report("faulty_node")
    text = joined(render_text(r, verbose=True, width=120))
    for x in r.results:
        assert f"{x.status.value.upper()} {x.id} " in text, x.id
        assert joined(fold_message(x.message)) in text, x.id
        for d in fold(list(x.details)):
            assert joined(d) in text, (x.id, d)
    assert "top fixes: 1." in text


def test_colour_only_when_asked_and_it_takes_no_width():
    r = report("faulty_node")
    plain = render_text(r, width=80)
    painted = render_text(r, colour=True, width=80)
    assert "\x1b[" not in plain and "\x1b[31m" in painted
    assert ANSI.sub("", painted) == plain


# ------------------------------------------------------------------------------------------------- the rest


def test_the_header_names_the_profile_and_what_it_leaves_out():
    text = joined(render_text(report("healthy_8x_h100", "standard")))
    assert "profile standard" in text and "leaves out the GPU workload and DCGM's level-2 diagnostic" in text
    assert "leaves out" not in joined(render_text(report("healthy_8x_h100", "full")))


def test_the_json_document_is_the_report_as_before():
    """The text report's folding is the text report's: the JSON document still holds every check with its own
    message and details (the Prometheus and JUnit writers read the same Report)."""
    r = report("faulty_node")
    doc = json.loads(render_json(r))
    assert [c["id"] for c in doc["checks"]] == [x.id for x in r.results]
    e007 = next(c for c in doc["checks"] if c["id"] == "gpu.E007")
    assert e007["message"].count("PCIe x8") == 8


def test_the_readme_shows_the_reports_the_renderer_prints():
    """README's two reports are the renderer's output for the healthy and the faulty node; when the renderer
    changes, `scripts/samples` writes them again."""
    readme = (ROOT / "README.md").read_text()
    for name, text in S.readme_reports().items():
        block = S.readme_block(name, text)
        assert block in readme, f"README's {name} report is stale: run {S.README_COMMAND}"


def test_the_readme_reports_are_short():
    reports = S.readme_reports()
    assert len(reports["healthy_8x_h100"].splitlines()) <= 25
    assert all(len(text.splitlines()) <= 40 for text in reports.values())
