"""gpunode_driver's Fabric Manager package names, rendered from the role's per-OS variables for each branch."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest
import yaml

VARS = Path(__file__).resolve().parents[2] / "roles" / "gpunode_driver" / "vars"
ENV = jinja2.Environment(undefined=jinja2.StrictUndefined)


def _render(value, ctx):
    if isinstance(value, str):
        out = ENV.from_string(value).render(**ctx)
        return yaml.safe_load(out) if out.startswith("[") else out
    if isinstance(value, list):
        return [_render(v, ctx) for v in value]
    return {k: _render(v, ctx) for k, v in value.items()}


def fm_packages(os_file: str, branch: str, source: str, override: list | None = None) -> list:
    os_vars = yaml.safe_load((VARS / os_file).read_text())
    main = yaml.safe_load((VARS / "main.yml").read_text())
    ctx = {"__gpunode_driver_branch": branch, "__gpunode_driver_source": source}
    ctx["__gpunode_driver_fabricmanager_os_packages"] = _render(
        os_vars["__gpunode_driver_fabricmanager_os_packages"], ctx
    )
    ctx["gpunode_driver_fabricmanager_packages"] = override or []
    expr = main["__gpunode_driver_fabricmanager_packages"].strip()
    return yaml.safe_load(ENV.from_string(expr).render(**ctx))


@pytest.mark.parametrize(
    ("os_file", "branch", "source", "expected"),
    [
        ("Ubuntu.yml", "580", "distro", ["nvidia-fabricmanager-580"]),
        ("Ubuntu.yml", "580", "nvidia", ["nvidia-fabricmanager-580"]),
        ("Ubuntu.yml", "590", "nvidia", ["nvidia-fabricmanager"]),
        ("Debian.yml", "535", "nvidia", ["nvidia-fabricmanager-535"]),
        ("Debian.yml", "535", "distro", []),  # Debian non-free has none: the role refuses the node
        ("Debian_13.yml", "550", "nvidia", ["nvidia-fabricmanager"]),
        ("Debian_13.yml", "550", "distro", []),
        ("RedHat.yml", "580", "nvidia", ["nvidia-fabric-manager"]),
    ],
)
def test_fabricmanager_packages_by_os_branch_and_source(os_file, branch, source, expected):
    assert fm_packages(os_file, branch, source) == expected


def test_fabricmanager_packages_override_wins():
    assert fm_packages("Debian.yml", "535", "distro", ["my-fm-535"]) == ["my-fm-535"]
