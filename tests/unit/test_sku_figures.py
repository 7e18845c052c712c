"""The built-in per-SKU figures: pinned (every Figure's value and its type, basis and source, each pattern and
name, the row order and the reference efficiencies, against tests/unit/fixtures/sku_figures.json), and the data
file they come from (hostcheck/data/gpu_skus.json) checked row by row."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hostcheck.checks.workload import sku as S

PINNED = json.loads((Path(__file__).resolve().parent / "fixtures" / "sku_figures.json").read_text())


def _fig(f: S.Figure) -> list:
    return [f.value, f.basis, f.source]


def test_every_built_in_figure_is_the_pinned_one():
    got = [
        {
            "key": s.key,
            "match": pattern,
            "name": s.name,
            "matmul": {dt: _fig(f) for dt, f in s.matmul.items()},
            "copy": _fig(s.copy_gbs),
        }
        for pattern, s in S.SKUS
    ]
    # JSON text tells 7164 from 7164.0, which == does not; sort_keys leaves the order of dtypes out of it.
    assert [g["key"] for g in got] == [p["key"] for p in PINNED["skus"]]
    for g, p in zip(got, PINNED["skus"]):
        assert json.dumps(g, sort_keys=True) == json.dumps(p, sort_keys=True), g["key"]


def test_the_reference_efficiencies_are_the_pinned_ones():
    assert PINNED["efficiency"] == {**S.EFF, "copy": S.EFF_COPY}


# ------------------------------------------------------------------------------------------- data file


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def test_every_sku_row_names_its_match_key_name_and_sources():
    data = json.loads(S.DATA_PATH.read_text())
    assert data["schema"] == 1 and data["about"].strip() and data["source"].strip()
    ref = data["reference"]
    assert ref["node"].strip() and ref["about"].strip()
    assert set(ref["matmul"]) == set(S.DTYPES)
    for r in ref["matmul"].values():
        assert _number(r["peak"]) and r["why"].strip()
        assert _number(r.get("achievable")) or r.get("like") in S.DTYPES
    assert _number(ref["copy"]["achievable_tbs"]) and _number(ref["copy"]["peak_tbs"])
    keys = [row["key"] for row in data["skus"]]
    assert len(keys) == len(set(keys)) and keys == [s.key for _, s in S.SKUS]
    for row in data["skus"]:
        for field in ("match", "key", "name", "note"):
            assert isinstance(row[field], str) and row[field].strip(), (row.get("key"), field)
        re.compile(row["match"], re.IGNORECASE)
        assert row["match"].startswith("^"), (
            row["key"],
            "a pattern names the part from the start of its name",
        )
        peaks, named = row.get("matmul_peaks", {}), row.get("matmul", {})
        assert peaks or named, row["key"]
        for block in ("matmul_peaks", "copy_peak", "nvlink_peak"):
            if block in row:
                assert row[block]["source"].strip() and row[block]["url"].startswith("https://"), row["key"]
        if peaks:
            assert all(
                dt in S.DTYPES and _number(v) for dt, v in peaks.items() if dt not in ("source", "url")
            )
        for dt, fig in [*named.items(), *([("copy", row["copy"])] if "copy" in row else [])]:
            assert _number(fig["value"]) and fig["basis"] in (S.MEASURED, S.PUBLISHED, S.ESTIMATE), (
                row["key"],
                dt,
            )
            assert fig["source"].strip(), (row["key"], dt)
        if "copy_peak" in row:
            assert _number(row["copy_peak"]["tbs"]) and row["copy_peak"]["source"].strip(), row["key"]
        assert "copy" in row or "copy_peak" in row, row["key"]
    # The published figures name the public table they come from.
    assert "https://github.com/stas00/ml-engineering" in data["source"]


# ------------------------------------------------------------------------------------------- provenance


def _figures(data: dict):
    """Every figure the data file names or bases others on: (where, the figure's object)."""
    yield "reference.copy", data["reference"]["copy"]
    for dt, r in data["reference"]["matmul"].items():
        if "achievable" in r:
            yield f"reference.matmul.{dt}", r
    for row in data["skus"]:
        for dt, fig in row.get("matmul", {}).items():
            yield f"{row['key']} matmul.{dt}", fig
        if "copy" in row:
            yield f"{row['key']} copy", row["copy"]


def test_no_figure_claims_a_measurement_without_a_recorded_gpu_proof_run():
    """basis measured only with proof: a JSON file a recorded scripts/gpu-proof run wrote, committed in its folder
    docs/gpu-proof/<date>-<gpu>/ whose machine.json names the run's date, GPUs, driver and torch, holding the figure. Nothing may say it was measured by this
    project on a node otherwise."""
    root = S.DATA_PATH.parents[2]
    data = json.loads(S.DATA_PATH.read_text())
    text = S.DATA_PATH.read_text().lower()
    assert "measured by this project on" not in text and "reference node" not in text
    for where, fig in _figures(data):
        if fig.get("basis") != S.MEASURED:
            assert "proof" not in fig, where
            continue
        proof = root / fig["proof"]
        assert proof.is_file(), (where, fig["proof"])
        json.loads(proof.read_text())
        # The run's folder (docs/gpu-proof/<date>-<gpu>/, scripts/gpu-proof --record) names its machine.
        run = json.loads((proof.parent / "machine.json").read_text())
        for key in ("date", "gpu_names", "driver", "torch"):
            assert run.get(key), (where, key)
        assert str(fig.get("value", fig.get("achievable"))) in proof.read_text(), (
            where,
            "figure not in proof",
        )


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            lambda d: d["skus"][2]["matmul"]["bf16"].update(basis="measured"),
            "skus[2] (h100-sxm): matmul.bf16: a measured figure needs proof",
        ),
        (
            lambda d: d["skus"][2]["matmul"]["bf16"].update(basis="measured", proof="/tmp/run.json"),
            "skus[2] (h100-sxm): matmul.bf16: a measured figure needs proof",
        ),
        (  # a JSON outside a recorded run's folder is no proof
            lambda d: d["skus"][2]["matmul"]["bf16"].update(
                basis="measured", proof="docs/proof/2026-01-01-h200.json"
            ),
            "skus[2] (h100-sxm): matmul.bf16: a measured figure needs proof",
        ),
        (
            lambda d: d["reference"]["copy"].update(basis="measured"),
            "reference.copy: a measured figure needs proof",
        ),
        (
            lambda d: d["skus"][2]["matmul"]["bf16"].update(source="ml-engineering"),
            "skus[2] (h100-sxm): matmul.bf16: a published figure's source names its public link",
        ),
    ],
)
def test_the_loader_refuses_a_measured_figure_without_proof(tmp_path, change, said):
    path = _broken(tmp_path, change)
    with pytest.raises(ValueError, match=re.escape(f"{path}: {said}")):
        S._load(path)
    good = _broken(tmp_path, lambda d: None)
    S._load(good)


def test_a_measured_figure_with_its_proof_loads():
    path = S.DATA_PATH
    data = json.loads(path.read_text())
    data["skus"][2]["matmul"]["bf16"].update(
        basis="measured", proof="docs/gpu-proof/2026-01-01-h200/bench-matmul-h2d.json"
    )
    sku = dict(S._sku(data["skus"][2], "skus[2]", S.EFF, S.EFF_COPY)[1].matmul)
    assert sku["bf16"].basis == S.MEASURED


def _broken(tmp_path: Path, change) -> Path:
    data = json.loads(S.DATA_PATH.read_text())
    change(data)
    path = tmp_path / "gpu_skus.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda d: d["skus"][0].update(match="H100(("), "skus[0] (gb200): match is not a regular expression"),
        (lambda d: d["skus"][1]["matmul_peaks"].update(bf16=-1), "skus[1] (b200): matmul_peaks.bf16"),
        (lambda d: d["skus"][1]["matmul_peaks"].update(bf16="2250"), "skus[1] (b200): matmul_peaks.bf16"),
        (lambda d: d["skus"][1]["matmul_peaks"].pop("source"), "skus[1] (b200): matmul_peaks: source"),
        (
            lambda d: d["skus"][2]["matmul"]["bf16"].update(source=" "),
            "skus[2] (h100-sxm): matmul.bf16: source",
        ),
        (
            lambda d: d["skus"][2]["matmul"]["bf16"].update(basis="guess"),
            "skus[2] (h100-sxm): matmul.bf16: basis",
        ),
        (lambda d: d["skus"][3].pop("note"), "skus[3]: note"),
        (lambda d: d["skus"][3].update(matmul_peak={}), "skus[3]: unknown keys ['matmul_peak']"),
        (lambda d: d["skus"][4].update(key="h100-nvl"), "skus: duplicate keys"),
        (lambda d: d["reference"]["matmul"].pop("tf32"), "reference.matmul.tf32"),
        (lambda d: d["skus"][1]["copy_peak"].pop("url"), "skus[1] (b200): copy_peak: source must name"),
        (lambda d: d.update(skus=[]), "skus: a non-empty list"),
    ],
)
def test_a_malformed_data_file_fails_loudly_naming_the_row(tmp_path, change, said):
    path = _broken(tmp_path, change)
    with pytest.raises(ValueError, match=re.escape(f"{path}: {said}")):
        S._load(path)


def test_a_malformed_data_file_fails_the_import(tmp_path):
    """The table is read at import: a broken data file stops hostcheck there, never a silent empty table."""
    pkg = tmp_path / "hostcheck"
    shutil.copytree(S.DATA_PATH.parents[1], pkg, ignore=shutil.ignore_patterns("__pycache__"))
    bad = json.loads(S.DATA_PATH.read_text())
    bad["skus"][0]["matmul_peaks"]["fp32"] = 0
    (pkg / "data" / "gpu_skus.json").write_text(json.dumps(bad))
    out = subprocess.run(
        [sys.executable, "-c", "import hostcheck.checks.workload.sku"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert "ValueError" in out.stderr and "skus[0] (gb200): matmul_peaks.fp32" in out.stderr


def test_an_nvlink_count_no_document_states_is_an_estimate_and_nothing_else_is(tmp_path):
    """Only H100 NVL's 12 links (600 GB/s over 50 GB/s links: derived, stated nowhere) is an estimate count; the
    loader refuses a count basis it does not know."""
    assert {k for k, line in S.NVLINK.items() if line.links_estimate} == {"h100-nvl"}
    path = _broken(tmp_path, lambda d: d["nvlink"]["rows"][0].update(links_basis="guess"))
    with pytest.raises(ValueError, match=re.escape("nvlink.rows[0]: links_basis must be public or estimate")):
        S._nvlink(path, {s.key for _, s in S.SKUS})
