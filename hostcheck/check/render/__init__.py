"""Renderers: text (human), JSON, Prometheus textfile, JUnit XML. All take a Report, none judge."""

from __future__ import annotations

import re

#: Characters XML 1.0 forbids (C0 controls but tab, newline and carriage return; U+FFFE, U+FFFF).
_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def clean_text(v: object) -> str:
    """``v`` as text that the Prometheus and JUnit writers can both hold: a lone surrogate (from a child's
    JSON; UTF-8 cannot encode it) becomes "?", and a control character XML forbids (NUL, ESC, ...) is written
    visibly as ``\\xNN``. Tab, newline and carriage return stay: each format escapes them its own way."""
    return _escaped(v, _FORBIDDEN)


#: What a terminal or a reader could take for something else: C0 controls with newline, tab and carriage return
#: (a new report line, a terminal escape), DEL and the C1 controls (0x9b is CSI to an 8-bit terminal), the line and
#: paragraph separators (str.splitlines breaks at them) and the bidirectional overrides and isolates (text shown in
#: another order than it is read: CVE-2021-42574, "Trojan Source").
_UNSEEN = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufffe\uffff]")


def visible(v: object) -> str:
    """``v`` as text a person reads in a terminal or a page: every character of _UNSEEN written visibly (``\\n``,
    ``\\x1b``, ``\\u202e``) and a lone surrogate as "?". A device name, a tool's output or a message cannot start
    a report line of its own or send the terminal an escape."""
    return _escaped(v, _UNSEEN)


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(v: object, pattern: re.Pattern) -> str:
    """``v`` as text, lone surrogates (from a child's JSON; UTF-8 cannot encode them) as "?", and each character
    ``pattern`` matches written as its escape."""
    s = str(v).encode("utf-8", "replace").decode("utf-8")
    return pattern.sub(lambda m: _NAMED.get(m.group()) or _code(m.group()), s)


def _code(c: str) -> str:
    return f"\\x{ord(c):02x}" if c < "\u0100" else f"\\u{ord(c):04x}"
