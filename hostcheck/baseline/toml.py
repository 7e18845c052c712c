"""TOML text for the [baseline] section, and the section put into a configuration file.

The standard library reads TOML (tomllib) but has no writer, so :func:`emit` writes exactly the types the section
holds: strings, integers, finite floats, lists of strings and lists of one-level tables (written as inline tables,
one per line). :func:`splice` replaces the file's [baseline] section (its ``[baseline]`` header, its sub-tables, up
to the next other header) or appends one, and leaves every other byte as it was. Both are checked by reading the
result back: the section must read back equal, the rest of the file must read back unchanged; anything else
(a dotted ``baseline.x`` key elsewhere, a header inside a multi-line string) is refused, never written.
"""

from __future__ import annotations

import math
import re
from typing import Any

from hostcheck.config import TOML_MISSING, toml_parser

SECTION = "baseline"
#: A table header line: ``[name]`` or ``[[name]]`` with an optional comment (TOML's bare and quoted keys).
_HEADER = re.compile(r"^[ \t]*\[\[?[ \t]*(?P<name>[A-Za-z0-9_\-.\"' \t]+?)[ \t]*\]\]?[ \t]*(?:#.*)?$")


class TomlError(ValueError):
    """What cannot be written or placed, in one sentence."""


def _string(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_\-]+", k) else _string(k)


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        raise TomlError("a boolean is not written here")
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise TomlError(f"{v} is not a number TOML holds")
        return repr(v)  # always with a '.' or an exponent: read back as a float, the same float
    raise TomlError(f"a {type(v).__name__} is not written here")


def _value(v: Any) -> str:
    if isinstance(v, list):
        if not v:
            return "[]"
        if all(isinstance(x, dict) for x in v):
            rows = ["{ " + ", ".join(f"{_key(k)} = {_scalar(x)}" for k, x in row.items()) + " }" for row in v]
            return "[\n" + "".join(f"  {r},\n" for r in rows) + "]"
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    return _scalar(v)


def emit(section: dict[str, Any], comment: str = "") -> str:
    """``[baseline]`` and its keys as TOML text (ends with a newline)."""
    lines = [f"[{SECTION}]"]
    if comment:
        lines += [f"# {line}".rstrip() for line in comment.splitlines()]
    lines += [f"{_key(k)} = {_value(v)}" for k, v in section.items()]
    return "\n".join(lines) + "\n"


def _is_ours(name: str) -> bool:
    name = re.sub(r"[ \t]", "", name).strip("\"'")
    return name == SECTION or name.startswith(SECTION + ".")


def loads(text: str) -> dict[str, Any]:
    """A TOML document read by tomllib (raises TomlError: not valid, or a Python without tomllib)."""
    tomllib = toml_parser()  # as reading the configuration file (hostcheck.config.load)
    if tomllib is None:
        raise TomlError(TOML_MISSING)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TomlError(f"not valid TOML: {exc}") from None
    except RecursionError:
        raise TomlError("not valid TOML: nested too deeply") from None


def splice(text: str, section_text: str) -> str:
    """``text`` (a configuration file) with its [baseline] section replaced by ``section_text``, or with it appended;
    every other line kept byte for byte. Raises TomlError where that cannot be done safely."""
    before = loads(text)
    lines = text.splitlines(keepends=True)
    kept: list[str] = []
    placed = False
    inside = False
    for line in lines:
        m = _HEADER.match(line.rstrip("\r\n"))
        if m:
            inside = _is_ours(m.group("name"))
            if inside and not placed:
                kept.append(section_text)
                placed = True
        if not inside:
            kept.append(line)
    if not placed:
        head = "".join(kept)
        # One blank line between the file's last line and the section; the file's own bytes stay as they are.
        gap = "" if not head or head.endswith("\n\n") else ("\n" if head.endswith("\n") else "\n\n")
        kept = [head, gap, section_text]
    elif not section_text.endswith("\n\n") and _next_is_header(kept, section_text):
        kept.insert(kept.index(section_text) + 1, "\n")
    result = "".join(kept)
    try:
        after = loads(result)
    except TomlError as exc:
        raise TomlError(f"[{SECTION}] cannot be placed in this file safely ({exc})") from None
    want = loads(section_text)[SECTION]
    before.pop(SECTION, None)
    if after.pop(SECTION, None) != want or after != before:
        raise TomlError(f"[{SECTION}] cannot be placed in this file without changing the rest of it")
    return result


def _next_is_header(kept: list[str], section_text: str) -> bool:
    i = kept.index(section_text)
    return i + 1 < len(kept) and bool(_HEADER.match(kept[i + 1].rstrip("\r\n")))
