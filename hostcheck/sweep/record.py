"""Rank 0's record, as hostcheck.inside.sweep prints it, held against its types before anything reads it: it comes
from the training Python, whose site-packages may print anything (hostcheck/schema.py's type check)."""

from __future__ import annotations

from typing import Any

from hostcheck.schema import type_errors

#: Bounds a float holds: 10**400 is valid JSON and an integer float() refuses (OverflowError).
BIG = 1e18
_NUM = {"type": "number", "minimum": -BIG, "maximum": BIG}
_INT = {"type": "integer", "minimum": 0, "maximum": BIG}
_STR = {"type": "string"}
_RATE = {"type": "number", "minimum": 0, "maximum": BIG}

RECORD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "sweep": {"const": 1},
        "backend": {"enum": ["nccl", "gloo"]},
        "run_id": _STR,
        "world_ranks": _INT,
        "mode": {"enum": ["all", "hypercube"]},
        "rounds": {"type": "object", "additionalProperties": _INT},
        "retest_note": _STR,
        "sizes": {"type": "object", "additionalProperties": _INT},
        "timing": {"type": "object", "additionalProperties": _NUM},
        "nodes": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "node": _INT,
                    "state": {"enum": ["measured", "missing", "died", "failed"]},
                    "host": _STR,
                    "slurm_node": _STR,
                    "gpus": _INT,
                    "ranks": {"type": "array", "items": _INT},
                    "device": _STR,
                    "torch": _STR,
                    "fault": {"type": "object", "additionalProperties": _NUM},
                    "last_phase": _STR,
                    "error": _STR,
                },
            },
        },
        "compute": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "rank": _INT,
                    "node": _INT,
                    "local": _INT,
                    "flops_per_s": _RATE,
                    "step_s": _RATE,
                },
            },
        },
        "pairs": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "a": _INT,
                    "b": _INT,
                    "stage": {"enum": ["main", "retest"]},
                    "round": _INT,
                    "bytes_per_s": _RATE,
                    "latency_s": _RATE,
                    "rails": _INT,
                    "bytes": _INT,
                },
            },
        },
        "groups": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "level": _INT,
                    "index": _INT,
                    "nodes": {"type": "array", "items": _INT},
                    "bytes": _INT,
                    "seconds": _RATE,
                    "algbw": _RATE,
                    "iters": _INT,
                },
            },
        },
        "errors": {
            "type": "array",
            "items": {"type": "object", "properties": {"rank": _INT, "node": _INT, "error": _STR}},
        },
        "phases_s": {"type": "object", "additionalProperties": _NUM},
        "wall_s": _NUM,
    },
}
#: What the judge reads without a default: a record without them is no sweep's.
REQUIRED = ("nodes", "compute", "pairs", "groups", "backend", "mode")
#: Per item, what the judge reads without a default.
ITEM_KEYS = {
    "nodes": ("node",),
    "compute": ("node", "local", "flops_per_s"),
    "pairs": ("a", "b", "bytes_per_s", "latency_s"),
    "groups": ("level", "index", "nodes", "algbw"),
}


def record_errors(rec: Any) -> list[str]:
    """What makes ``rec`` unusable as a sweep's record (an empty list: none)."""
    if not isinstance(rec, dict):
        return ["the record is not an object"]
    missing = [k for k in REQUIRED if k not in rec]
    if missing:
        return [f"the record lacks {', '.join(missing)}"]
    wrong = type_errors(rec, RECORD_SCHEMA)
    if wrong:
        return wrong
    nodes = {n["node"] for n in rec["nodes"]}
    for part, keys in ITEM_KEYS.items():
        for i, item in enumerate(rec[part]):
            gone = [k for k in keys if k not in item]
            if gone:
                return [f"{part}[{i}] lacks {', '.join(gone)}"]
            named = [item[k] for k in ("node", "a", "b") if k in item and part != "nodes"]
            named += list(item["nodes"]) if part == "groups" else []
            if any(x not in nodes for x in named):
                return [f"{part}[{i}] names a node the record does not list"]
    return []
