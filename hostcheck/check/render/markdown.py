"""Markdown and HTML for text that came from elsewhere (a node's report): a table cell, made safe."""

from __future__ import annotations

import html
from typing import Any

from hostcheck.check.render import visible


def md_cell(value: Any) -> str:
    """A node's text in a Markdown table cell: its control characters and line breaks written visibly (a name
    cannot end the row or send a terminal that shows the file an escape), its HTML shown as text, ``|`` kept out
    of the table's structure."""
    text = html.escape(visible(value), quote=False).replace("\\", "\\\\").replace("|", "\\|")
    return text.replace("`", "'")


def html_text(value: Any) -> str:
    """A node's text in an HTML page: its control characters and line breaks written visibly (the page read with
    ``cat`` or ``less`` sends no escape to the terminal), then escaped as HTML text and attribute value."""
    return html.escape(visible(value))
