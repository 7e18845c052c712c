"""--json: the versioned document described in docs/hostcheck.md (schema_version 1)."""

from __future__ import annotations

import json

from hostcheck.report import Report


def render_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False) + "\n"
