"""The built-in per-SKU figures, pinned: every Figure (value and its type, basis, source), pattern, name, the
row order and the reference efficiencies, against tests/unit/fixtures/sku_figures.json."""

from __future__ import annotations

import json
from pathlib import Path

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
