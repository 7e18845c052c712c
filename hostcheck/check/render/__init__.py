"""Renderers: text (human), JSON, Prometheus textfile, JUnit XML. All take a Report, none judge."""

from __future__ import annotations

import re

#: Characters XML 1.0 forbids (C0 controls but tab, newline and carriage return; U+FFFE, U+FFFF).
_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def clean_text(v: object) -> str:
    """``v`` as text that the Prometheus and JUnit writers can both hold: a lone surrogate (from a child's
    JSON; UTF-8 cannot encode it) becomes "?", and a control character XML forbids (NUL, ESC, ...) is written
    visibly as ``\\xNN``. Tab, newline and carriage return stay: each format escapes them its own way."""
    s = str(v).encode("utf-8", "replace").decode("utf-8")
    return _FORBIDDEN.sub(
        lambda m: f"\\x{ord(m.group()):02x}" if m.group() < "\x80" else f"\\u{ord(m.group()):04x}", s
    )
