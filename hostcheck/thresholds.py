"""Every threshold hostcheck judges by: one row of a data file each, read through this one validated loader.

Two files, one format: hostcheck/data/thresholds.json holds the node checks' lines (each row names the check id
it serves, or the finding of ``hostcheck sweep``, sweep.S00N, for its peer rule's rows sweep_*),
hostcheck/data/job_thresholds.json the job doctor's (``hostcheck job``, check "job"). They are two
because they serve two commands whose rows are read, and tested, against different registries; the names are one
namespace (a name in both files is refused), so ``[thresholds]`` in the configuration overrides any of them by
name (hostcheck/config.py).

A row: name, value (a positive number; an int where a count is meant), unit, basis, source, why, check; optional
``verdict``, ``range`` and ``see``.

- basis ``public``: the value is a public tool's or document's, named by an https address in ``source``;
  ``own``: hostcheck's choice or measurement, with no public figure to cite, and ``why`` says so.
- verdict: what the line may do. ``fail`` (a check fails past it), ``warn`` (it can only warn), ``soften`` (it
  only turns a fail into a warning: a plateau size, a slack), ``advice`` (the job doctor: a finding, never a
  readiness verdict). Absent: ``fail`` for a public row, ``warn`` for an own one. A line without a public source
  may warn, never fail: an ``own`` row with verdict ``fail`` is refused here.
- range: [low, high], what a site may set it to under ``[thresholds]`` (absent: any number above 0).

Imports nothing of hostcheck: the configuration, the checks and the job doctor all read it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
NODE_FILE = DATA / "thresholds.json"
JOB_FILE = DATA / "job_thresholds.json"
BASES = ("public", "own")
VERDICTS = ("fail", "warn", "soften", "advice")
URL = "https://"


@dataclass(frozen=True)
class Row:
    name: str
    value: int | float
    unit: str
    basis: str
    source: str
    why: str
    check: str
    verdict: str
    #: What a site may set under [thresholds]: low and high, inclusive.
    low: float = 0.0
    high: float = math.inf
    see: tuple[str, ...] = field(default=(), compare=False)

    @property
    def kind(self) -> type:
        return int if isinstance(self.value, int) else float


def _row(raw: dict[str, Any]) -> Row:
    name, value = raw["name"], raw["value"]
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not value > 0
        or not math.isfinite(value)
    ):
        raise ValueError(f"{name}: value must be a positive number")
    if not all(isinstance(raw.get(k), str) and raw[k].strip() for k in ("unit", "source", "why")):
        raise ValueError(f"{name}: unit, source and why must be non-empty strings")
    basis = raw.get("basis")
    if basis not in BASES:
        raise ValueError(f"{name}: basis must be one of {', '.join(BASES)}, not {basis!r}")
    if basis == "public" and not raw["source"].startswith(URL):
        raise ValueError(f"{name}: a public row's source must be its {URL} address")
    if basis == "own" and "own" not in raw["why"]:
        raise ValueError(f"{name}: an own row's why must say it is hostcheck's own")
    verdict = raw.get("verdict", "fail" if basis == "public" else "warn")
    if verdict not in VERDICTS:
        raise ValueError(f"{name}: verdict must be one of {', '.join(VERDICTS)}, not {verdict!r}")
    if basis == "own" and verdict == "fail":
        raise ValueError(
            f"{name}: a line without a public source may warn, never fail (basis own, verdict fail)"
        )
    # Without a range a site may set any number above 0: the smallest positive float stands for "above 0".
    low, high = raw.get("range", (math.ulp(0.0), math.inf))
    if not low <= value <= high:
        raise ValueError(f"{name}: value {value} outside its range [{low}, {high}]")
    see = tuple(raw.get("see", ()))
    if not all(isinstance(u, str) and u.startswith(URL) for u in see):
        raise ValueError(f"{name}: every 'see' must be an {URL} address")
    return Row(
        name,
        value,
        raw["unit"],
        basis,
        raw["source"],
        raw["why"],
        str(raw.get("check", "")),
        verdict,
        float(low),
        float(high),
        see,
    )


def load(path: Path) -> dict[str, Row]:
    """name -> row of one data file, every row validated. A malformed file raises ValueError naming it and the
    row, never a silent default."""
    try:
        out: dict[str, Row] = {}
        for raw in json.loads(path.read_text())["thresholds"]:
            row = _row(raw)
            if row.name in out:
                raise ValueError(f"{row.name}: duplicate row")
            out[row.name] = row
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    return out


def load_all(*paths: Path) -> dict[str, Row]:
    """The rows of several files as one namespace: a name in two files is refused."""
    out: dict[str, Row] = {}
    for path in paths:
        for name, row in load(path).items():
            if name in out:
                raise ValueError(f"{path}: {name}: also a row of another thresholds file")
            out[name] = row
    return out


NODE_ROWS = load(NODE_FILE)
JOB_ROWS = load(JOB_FILE)
ROWS = load_all(NODE_FILE, JOB_FILE)


def _values_class(name: str, rows: dict[str, Row], doc: str) -> type:
    cls = make_dataclass(
        name, [(n, r.kind, field(default=r.kind(r.value))) for n, r in rows.items()], frozen=True
    )
    cls.__module__, cls.__doc__ = __name__, doc
    return cls


#: The node checks' effective lines: one field per row of thresholds.json, the row's value by default.
NodeThresholds: Any = _values_class(
    "Thresholds",
    NODE_ROWS,
    "The node checks' lines ([thresholds]); defaults: hostcheck/data/thresholds.json.",
)
#: The job doctor's effective lines: one field per row of job_thresholds.json.
JobThresholds: Any = _values_class(
    "JobThresholds",
    JOB_ROWS,
    "The job doctor's lines ([thresholds]); defaults: hostcheck/data/job_thresholds.json.",
)
