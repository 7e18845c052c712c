"""Fixtures for hostcheck's unit tests: scenario snapshots and a fake pynvml (fixtures/hostcheck_scenarios.py)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "fixtures"))

import hostcheck_scenarios


@pytest.fixture
def scenarios():
    return hostcheck_scenarios


@pytest.fixture
def healthy():
    return hostcheck_scenarios.make_snapshot()
