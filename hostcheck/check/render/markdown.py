"""Markdown for text that came from elsewhere (a node's report): one table cell, made safe."""

from __future__ import annotations

import html
from typing import Any


def md_cell(value: Any) -> str:
    """A node's text in a Markdown table cell: its HTML shown as text, ``|`` and line breaks kept out of the
    table's structure."""
    text = html.escape(str(value), quote=False).replace("\\", "\\\\").replace("|", "\\|")
    return " ".join(text.split("\n")).replace("\r", " ").replace("`", "'")
