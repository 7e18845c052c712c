"""gpunode_health's configuration template, rendered from the role's variables and read back by hostcheck itself.

The baseline per inventory group: ``gpunode_health_baseline`` (what ``hostcheck baseline --json`` prints on a
known-good node) is validated by the role's argument spec and rendered as the [baseline] section, which must read
back as the same baseline ``hostcheck baseline`` itself writes. The template is rendered as Ansible's template module
renders it (trim_blocks), with its filters stood in for by their Python equivalents.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import hostcheck_scenarios as S
import jinja2
import pytest
import tomllib
import yaml

from hostcheck.baseline.record import section
from hostcheck.baseline.toml import emit
from hostcheck.config import ConfigError, parse
from hostcheck.gather.inventory import gather_inventory
from hostcheck.gather.nvml import gather_nvml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "gpunode_health"
TREE = Path(__file__).parent / "fixtures" / "hosttree" / "inventory"
EXAMPLE = ROOT / "inventory" / "production" / "group_vars" / "h100_nodes.yml"

ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True)
ENV.filters["to_json"] = json.dumps
ENV.filters["bool"] = lambda v: (
    v if isinstance(v, bool) else str(v).strip().lower() in ("true", "yes", "1", "on")
)


def role_values(**over):
    values = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    values.update(yaml.safe_load((ROLE / "vars" / "main.yml").read_text()))
    values.update(over, ansible_managed="Ansible managed")
    return values


def render(**over) -> str:
    return ENV.from_string((ROLE / "templates" / "hostcheck.toml.j2").read_text()).render(
        **role_values(**over)
    )


def example_baseline() -> dict:
    """The commented gpunode_health_baseline of the example inventory, uncommented."""
    text = EXAMPLE.read_text()
    block = text[text.index("# gpunode_health_baseline:") :]
    return yaml.safe_load(re.sub(r"^# ?", "", block, flags=re.M))["gpunode_health_baseline"]


def recorded() -> dict:
    nv = gather_nvml(nvml=S.FakeNvml(), proc_name=str)
    body, _ = section(gather_inventory(str(TREE), nv), "gpu001.example.internal", "2026-11-26T12:00:00Z")
    return body


def test_without_a_baseline_the_file_has_no_baseline_section():
    text = render()
    assert "[baseline]" not in text
    assert parse(tomllib.loads(text)).baseline is None


def test_the_groups_baseline_renders_as_the_section_hostcheck_baseline_writes():
    body = recorded()
    # What an admin pastes: the JSON 'hostcheck baseline --json' prints, read as YAML by the inventory.
    pasted = yaml.safe_load(json.dumps(body))
    cfg = parse(tomllib.loads(render(gpunode_health_baseline=pasted)), "hostcheck.toml")
    assert cfg.baseline == parse(tomllib.loads(emit(body))).baseline
    assert cfg.baseline.rdma == (("mlx5_0:1", 400.0, "", "", ""), ("mlx5_1:1", 400.0, "", "", ""))
    assert len(cfg.baseline.gpus) == 8
    # A baseline pasted before the RDMA ports' link layer, GPU and distance were recorded renders and reads.
    old = dict(pasted, rdma=[{"name": "mlx5_0:1", "rate_gbps": 400}])
    cfg = parse(tomllib.loads(render(gpunode_health_baseline=old)), "hostcheck.toml")
    assert cfg.baseline.rdma == (("mlx5_0:1", 400.0, "", "", ""),)


def test_the_example_inventorys_baseline_is_the_fixture_node_and_renders():
    example = example_baseline()
    assert example == json.loads(json.dumps(recorded()))  # the example is what the command prints
    cfg = parse(tomllib.loads(render(gpunode_health_baseline=example)))
    assert cfg.baseline.memory_bytes == 2113311792 * 1024 and cfg.baseline.cpu_threads == 16


def test_hostile_strings_stay_strings_and_a_partial_baseline_writes_only_its_keys():
    odd = 'x" = 1 ] [xid] fail = [1] # \\ ü'
    text = render(
        gpunode_health_baseline={"cpu_model": odd, "gpus": [{"address": odd, "name": "n", "vbios": "v"}]}
    )
    b = parse(tomllib.loads(text)).baseline
    assert b.cpu_model == odd and b.gpus == ((odd, "n", "v"),) and b.memory_bytes is None and b.nvme is None
    # Two lines are a string still, which hostcheck refuses (the role's validate step keeps the old file).
    with pytest.raises(ConfigError, match="one line"):
        parse(tomllib.loads(render(gpunode_health_baseline={"cpu_model": "a\n[xid]"})))


def test_the_argument_spec_takes_the_example_and_refuses_a_bad_baseline():
    validator_mod = pytest.importorskip("ansible.module_utils.common.arg_spec")
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"][
        "options"
    ]
    one = {"gpunode_health_baseline": spec["gpunode_health_baseline"]}
    validator = validator_mod.ArgumentSpecValidator(one)
    ok = validator.validate({"gpunode_health_baseline": example_baseline()})
    assert ok.error_messages == []
    for bad in (
        {"cpu_cores": "many"},
        {"nvme": [{"model": "m"}]},
        {"pcie": [{"address": "a", "kind": "GPU", "speed_gts": 32, "width": 16, "max_speed_gts": 32}]},
        {
            "pcie": [
                {
                    "address": "a",
                    "kind": "SSD",
                    "speed_gts": 32,
                    "width": 16,
                    "max_speed_gts": 32,
                    "max_width": 16,
                }
            ]
        },
        {"frobnicate": 1},
    ):
        assert validator.validate({"gpunode_health_baseline": bad}).error_messages, bad


def test_the_roles_threshold_names_are_the_rows_of_the_thresholds_files():
    from hostcheck import thresholds

    role = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    assert role["__gpunode_health_threshold_keys"] == list(thresholds.ROWS)
    assert role["__gpunode_health_threshold_ints"] == [n for n, r in thresholds.ROWS.items() if r.kind is int]


def test_the_roles_profiles_are_hostchecks_and_each_has_time_beyond_its_deadline():
    """gpunode_health takes a profile by name (the timer's runs and the configuration's default): its choices are
    hostcheck's profiles, and systemd's limit for each (TimeoutStartSec) lies beyond the profile's own deadline,
    so that hostcheck always stops itself first."""
    from hostcheck.profiles import PROFILES

    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]
    assert spec["options"]["gpunode_health_profile"]["choices"] == list(PROFILES)
    limits = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__gpunode_health_profile_timeout"]
    assert set(limits) == set(PROFILES)
    assert all(limits[n] > p.deadline_s for n, p in PROFILES.items()), limits
