"""A watchdog under every test: pytest-timeout (pyproject.toml) ends a hung test from a Python thread, which
cannot run while native code holds the GIL (a deadlock inside torch's C++ once hung a whole CI run). The C-level
watchdog of faulthandler needs no GIL: a minute later it writes every thread's stack to
reports/pytest-watchdog.log (pytest's capture would swallow stderr) and ends the process."""

from __future__ import annotations

import faulthandler
from pathlib import Path

import pytest

#: Past pytest-timeout's own limit (pyproject.toml), so that one speaks first where it can.
NATIVE_WATCHDOG_S = 360
_log = None


def pytest_configure(config):
    global _log
    reports = Path(config.rootpath) / "reports"
    reports.mkdir(exist_ok=True)
    _log = open(reports / "pytest-watchdog.log", "w")  # noqa: SIM115 (open for the whole session)


def pytest_unconfigure(config):
    if _log is not None:
        _log.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _log is not None:
        _log.write(f"{item.nodeid}\n")
        _log.flush()
        faulthandler.dump_traceback_later(NATIVE_WATCHDOG_S, exit=True, file=_log)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
