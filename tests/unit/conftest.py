"""Fixtures for hostcheck's unit tests: scenario snapshots and a fake pynvml (fixtures/hostcheck_scenarios.py)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fixtures"))

import hostcheck_scenarios

from hostcheck.gather import state


@pytest.fixture(autouse=True)
def _state_file_in_tmp(tmp_path_factory, monkeypatch):
    """A run in a test keeps its hardware counters in a folder of its own, never in the machine's
    /var/lib/hostcheck (a run started as a subprocess is given --state-file by its test)."""
    monkeypatch.setattr(state, "DEFAULT_STATE_FILE", str(tmp_path_factory.mktemp("state") / "state.json"))


@pytest.fixture
def scenarios():
    return hostcheck_scenarios


@pytest.fixture
def healthy():
    return hostcheck_scenarios.make_snapshot()
