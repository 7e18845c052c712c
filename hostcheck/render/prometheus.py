"""--prometheus PATH: node_exporter textfile collector format, written atomically (tmp + rename)."""

from __future__ import annotations

from hostcheck.registry import Status
from hostcheck.report import Report

#: hostcheck_check_status value per status
STATUS_CODE = {Status.PASS: 0, Status.WARN: 1, Status.FAIL: 2, Status.ERROR: 3, Status.SKIP: -1}


def _esc(v: object) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_prometheus(report: Report) -> str:
    lines = [
        "# HELP hostcheck_check_status Check status: 0 pass, 1 warn, 2 fail, 3 error, -1 skip.",
        "# TYPE hostcheck_check_status gauge",
    ]
    for r in report.results:
        lines.append(
            f'hostcheck_check_status{{check="{_esc(r.id)}",category="{r.category}",'
            f'title="{_esc(r.title)}"}} {STATUS_CODE[r.status]}'
        )
    lines += [
        "# HELP hostcheck_check_value The measured value of a check, where it is a number.",
        "# TYPE hostcheck_check_value gauge",
    ]
    for r in report.results:
        if isinstance(r.value, (int, float)) and not isinstance(r.value, bool):
            lines.append(
                f'hostcheck_check_value{{check="{_esc(r.id)}",unit="{_esc(r.unit or "")}"}} {r.value}'
            )
    v = report.verdict
    lines += [
        "# HELP hostcheck_score Readiness score 0-100 (-1 when nothing could be judged).",
        "# TYPE hostcheck_score gauge",
        f"hostcheck_score {v.score if v.score is not None else -1}",
        "# HELP hostcheck_ready 1 when the node is ready at the chosen fail level and minimum score.",
        "# TYPE hostcheck_ready gauge",
        f'hostcheck_ready{{fail_level="{v.fail_level}"}} {int(v.ready)}',
        "# HELP hostcheck_checks Number of checks per status.",
        "# TYPE hostcheck_checks gauge",
    ]
    for status, n in v.counts.items():
        lines.append(f'hostcheck_checks{{status="{status}"}} {n}')
    lines += [
        "# HELP hostcheck_last_run_timestamp_seconds When hostcheck last ran.",
        "# TYPE hostcheck_last_run_timestamp_seconds gauge",
        f"hostcheck_last_run_timestamp_seconds {_epoch(report.time)}",
        "# HELP hostcheck_info Versions found on the node.",
        "# TYPE hostcheck_info gauge",
        "hostcheck_info{"
        + ",".join(f'{k}="{_esc(val)}"' for k, val in sorted(report.versions.items()) if val is not None)
        + "} 1",
    ]
    return "\n".join(lines) + "\n"


def _epoch(iso: str) -> int:
    from datetime import datetime

    try:
        return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0
