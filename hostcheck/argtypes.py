"""argparse types for the command lines: numbers that are finite and in range, folders that can be read, refused
with a usage error."""

from __future__ import annotations

import argparse
import math
import os

#: The longest time any option may give (a week): past it, deadlines overflow poll() and sleep() arguments.
MAX_SECONDS = 7 * 24 * 3600.0


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def seconds(text: str) -> float:
    """A time limit: finite, above 0, at most MAX_SECONDS."""
    value = _number(text)
    if not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds above 0 and at most {MAX_SECONDS:g}")
    return value


def duration(text: str) -> float:
    """A length of time that may be 0 (off): finite, 0 to MAX_SECONDS."""
    value = _number(text)
    if not 0 <= value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds from 0 to {MAX_SECONDS:g}")
    return value


def host_root(text: str) -> str:
    """--host-root: a folder hostcheck can read. A missing path, or a file, would read as a node with nothing in
    it, and nothing read is no fault found: refused instead."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path")
    if not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"{text}: does not exist")
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text}: not a folder")
    if not os.access(text, os.R_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: not readable")
    return text


def positive(text: str) -> float:
    """A rate or size: finite and above 0."""
    value = _number(text)  # finite: never NaN
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number above 0")
    return value
