"""Open the fleet report in headless Chromium and check what a person would see."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from hostcheck import command

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (scripts/test installs it)")

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _reports(tmp_path):
    d = tmp_path / "nodes"
    d.mkdir()
    good = {
        "host": {"hostname": "gpu001", "gpus": [{}] * 8},
        "checks": [],
        "score": {"value": 100, "ready": True},
    }
    bad = {
        "host": {"hostname": "gpu002", "gpus": [{}] * 7},
        "checks": [
            {
                "id": "gpu.E002",
                "status": "fail",
                "weight": 10,
                "message": "7 of 8 GPUs visible",
                "hint": "reseat GPU 5 & check <dmesg>",
            }
        ],
        "score": {"value": 55, "ready": False},
    }
    (d / "gpu001.json").write_text(json.dumps(good))
    (d / "gpu002.json").write_text(json.dumps(bad))
    return d


def test_fleet_page_shows_counts_worst_first_and_fixes(tmp_path):
    d = _reports(tmp_path)
    assert (
        command.main(["fleet", str(d), "--out", str(tmp_path), "--expect", "gpu001", "gpu002", "gpu003"]) == 1
    )
    page = tmp_path / "fleet.html"
    dom = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    ).stdout
    text = re.sub(r"<[^>]+>", " ", dom)
    text = re.sub(r"\s+", " ", text)
    assert "1 ready" in text and "2 not ready" in text
    # Worst first: the node without a report, then the failing one, then the healthy one.
    assert text.index("gpu003") < text.index("gpu002") < text.index("gpu001")
    assert "no report" in text
    assert "reseat GPU 5 &amp; check &lt;dmesg&gt;" in dom  # the fix is shown, escaped, not interpreted
    shot = tmp_path / "fleet.png"
    subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={tmp_path / 'profile2'}",
            f"--screenshot={shot}",
            "--window-size=1200,600",
            page.as_uri(),
        ],
        capture_output=True,
        timeout=90,
        check=True,
    )
    assert shot.stat().st_size > 5000  # a rendered page, not an empty canvas
