"""What ``hostcheck baseline`` prints: the [baseline] section as TOML (for the config file) or JSON (for the inventory)."""

from __future__ import annotations

import json
from typing import Any

from hostcheck.baseline.toml import emit


def render_toml(body: dict[str, Any], host: str) -> str:
    return emit(
        body, comment=f"What a known-good node has: 'hostcheck baseline' on {host} (docs/baseline.md)."
    )


def render_json(body: dict[str, Any]) -> str:
    return json.dumps(body, indent=2) + "\n"
