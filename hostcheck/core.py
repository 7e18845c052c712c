"""The core of a node check, without its command line: judge a gathered snapshot and build the report.

``hostcheck check`` (hostcheck.check.cli) gathers and calls these; the tests call them with fixture snapshots.
"""

from __future__ import annotations

import time
from typing import Any

from hostcheck.exitcodes import EXIT_NOT_READY, EXIT_OK
from hostcheck.registry import Check, Result, run_checks
from hostcheck.report import Report, gpu_records, host_info, port_records, versions
from hostcheck.score import Verdict, verdict


def evaluate(
    snapshot: Any,
    checks: list[Check],
    fail_level: str = "fail",
    min_score: int = 0,
    timeout_s: float = 30.0,
    deadline: float | None = None,
) -> tuple[list[Result], Verdict]:
    """Judge a gathered snapshot: the pure half of a run (tests call this with fixture snapshots)."""
    results = run_checks(checks, snapshot, timeout_s, deadline)
    return results, verdict(results, fail_level=fail_level, min_score=min_score)


def build_report(
    snapshot: Any, results: list[Result], v: Verdict, started: float, when: str, profile: str = ""
) -> Report:
    """The report of one run: the results, the verdict and what the snapshot holds of the host and its GPUs."""
    return Report(
        results=tuple(results),
        verdict=v,
        host=host_info(snapshot),
        versions=versions(snapshot),
        time=when,
        duration_s=time.monotonic() - started,
        exit_code=EXIT_OK if v.ready else EXIT_NOT_READY,
        gpus=gpu_records(snapshot),
        profile=profile,
        ports=port_records(snapshot),
    )
