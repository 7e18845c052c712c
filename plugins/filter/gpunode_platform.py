"""gpunode's platform decision for the roles: a thin wrapper around hostcheck/platform.py.

The facts (hostcheck/data/platform.json) and the logic live once, in hostcheck, so the roles and
hostcheck's checks and fix hints read the same rows. Loaded by path from the collection's root (this
repository, or the installed collection, which carries hostcheck/): the controller needs no installed hostcheck.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "hostcheck" / "platform.py"
_spec = importlib.util.spec_from_file_location("gpunode_platform_logic", _PATH)
platform = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(platform)


def node_plan(inputs, overrides=None, enforce_os=True):
    """{os, gpus, driver, torch, cuda} (see hostcheck.platform.node_plan) -> the node's plan."""
    inputs = dict(inputs or {})
    return platform.node_plan(
        os=inputs.get("os"),
        gpus=inputs.get("gpus"),
        driver=inputs.get("driver"),
        torch=inputs.get("torch"),
        cuda=inputs.get("cuda"),
        overrides=overrides,
        enforce_os=enforce_os,
    )


class FilterModule:
    """gpunode.node.gpunode_node_plan, gpunode.node.gpunode_driver_satisfies (used by gpunode_base)."""

    def filters(self):
        return {
            "gpunode_node_plan": node_plan,
            "gpunode_driver_satisfies": platform.driver_satisfies,
        }
