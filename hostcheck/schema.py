"""A small type check driven by a JSON schema (no jsonschema on the node): what ``hostcheck fleet`` holds a node's
report against before it reads a field of it (hostcheck/data/hostcheck-report.schema.json).

It checks what a reader of the report relies on: ``type`` (booleans are not integers; a number is finite),
``enum``, ``const``, ``minimum``/``maximum``, and ``properties``/``items`` below them (``additionalProperties``
when it is a schema: the values of a mapping), following ``$ref`` into ``$defs``. ``required`` and ``pattern``
are left out on purpose, and ``additionalProperties: false`` is not enforced: a report from an older or newer
hostcheck may lack a key or carry another one, and the reader handles a missing key; a key of the wrong type is
what would make it lie or crash. The training Python's probe record is held against a schema of the same
form (hostcheck.gather.torchinfo).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

REPORT_SCHEMA = Path(__file__).resolve().parent / "data" / "hostcheck-report.schema.json"
#: ``hostcheck sweep --json``'s report, which ``hostcheck fleet --sweep`` reads.
SWEEP_SCHEMA = REPORT_SCHEMA.parent / "sweep-report.schema.json"
#: How many problems one check names (the first few say enough).
MAX_ERRORS = 5

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    # NaN and infinity are no numbers; an int is finite however large (math.isfinite cannot take 10**400).
    "number": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and math.isfinite(v))
    ),
}

_cache: dict[str, Any] = {}


def report_schema() -> dict[str, Any]:
    """The report's schema (shipped with hostcheck)."""
    if "report" not in _cache:
        _cache["report"] = json.loads(REPORT_SCHEMA.read_text(encoding="utf-8"))
    return _cache["report"]


def sweep_schema() -> dict[str, Any]:
    """The sweep report's schema (shipped with hostcheck)."""
    if "sweep" not in _cache:
        _cache["sweep"] = json.loads(SWEEP_SCHEMA.read_text(encoding="utf-8"))
    return _cache["sweep"]


def _short(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def type_errors(
    value: Any, schema: dict[str, Any], where: str = "", root: dict[str, Any] | None = None
) -> list[str]:
    """Where ``value`` breaks ``schema``'s types, as ``"<path> is <value>, want <what>"`` (at most MAX_ERRORS).
    ``<path>`` is ``where`` and the keys below it (``score.ready``, ``checks[0].message``)."""
    root = root if root is not None else schema
    out: list[str] = []
    _walk(value, schema, where, root, out)
    return out[:MAX_ERRORS]


def _walk(value: Any, schema: Any, where: str, root: dict[str, Any], out: list[str]) -> None:
    if len(out) >= MAX_ERRORS or not isinstance(schema, dict):
        return
    name = where or "the value"
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        _walk(value, root.get("$defs", {}).get(ref[len("#/$defs/") :], {}), where, root, out)
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        if not any(_TYPES.get(k, lambda v: True)(value) for k in kinds):
            out.append(f"{name} is {_short(value)}, want {' or '.join(kinds)}")
            return
    if "const" in schema and not _same(value, schema["const"]):
        out.append(f"{name} is {_short(value)}, want {_short(schema['const'])}")
        return
    if "enum" in schema and not any(_same(value, v) for v in schema["enum"]):
        out.append(f"{name} is {_short(value)}, want one of {', '.join(_short(v) for v in schema['enum'])}")
        return
    if _TYPES["number"](value):
        lo, hi = schema.get("minimum"), schema.get("maximum")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            out.append(f"{name} is {_short(value)}, want {lo} to {hi}")
            return
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        rest = schema.get("additionalProperties")
        for key, item in value.items():
            sub = props.get(key, rest if isinstance(rest, dict) else None)
            if sub is not None:
                _walk(item, sub, f"{where}.{key}" if where else key, root, out)
            if len(out) >= MAX_ERRORS:
                return
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _walk(item, schema["items"], f"{where}[{i}]", root, out)
            if len(out) >= MAX_ERRORS:
                return


def _same(a: Any, b: Any) -> bool:
    # JSON's equality: true is not 1.
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b
