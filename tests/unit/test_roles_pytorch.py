"""Unit tests of gpunode_pytorch's compatibility logic (roles/gpunode_pytorch/filter_plugins/torch_matrix.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = (
    Path(__file__).resolve().parents[2] / "roles" / "gpunode_pytorch" / "filter_plugins" / "torch_matrix.py"
)
_spec = importlib.util.spec_from_file_location("gpunode_torch_matrix", _PATH)
tm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tm)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("12.8", "12.8"),
        ("12.8.1", "12.8"),
        ("cu128", "12.8"),
        ("CU130", "13.0"),
        ("cu118", "11.8"),
        ("cpu", "cpu"),
        ("13.0", "13.0"),
    ],
)
def test_cuda_normalize(given, expected):
    assert tm.cuda_normalize(given) == expected


@pytest.mark.parametrize("bad", ["twelve", "cuX", "12"])
def test_cuda_normalize_rejects(bad):
    with pytest.raises(ValueError):
        tm.cuda_normalize(bad)


@pytest.mark.parametrize(
    ("cuda", "tag"),
    [("11.8", "cu118"), ("12.6", "cu126"), ("12.9", "cu129"), ("13.0", "cu130"), ("cpu", "cpu")],
)
def test_cuda_tag(cuda, tag):
    assert tm.cuda_tag(cuda) == tag


def test_every_torch_row_names_known_cuda():
    for minor, cudas in tm.TORCH_TABLE.items():
        assert cudas, minor
        for cuda in cudas:
            assert cuda in tm.CUDA_TABLE, (minor, cuda)


def test_min_driver_policies():
    assert tm.min_driver("13.0") == "580.65.06"
    assert tm.min_driver("12.8", "compat") == "525.60.13"
    assert tm.min_driver("12.8", "toolkit") == "570.26"
    assert tm.min_driver("11.8", "compat") == "450.80.02"
    assert tm.min_driver("cpu") == ""


@pytest.mark.parametrize(
    ("driver", "required", "ok"),
    [
        ("580.159.04", "580.65.06", True),
        ("580.65.06", "580.65.06", True),
        ("535.261.03", "580.65.06", False),
        ("570.26", "570.124.06", False),
        ("1000", "580.65.06", True),
    ],
)
def test_driver_satisfies(driver, required, ok):
    assert tm.driver_satisfies(driver, required) is ok


def test_plan_cpu_needs_no_driver():
    plan = tm.torch_plan("2.13.0", "cpu", driver_version="")
    assert plan["ok"], plan["errors"]
    assert plan["tag"] == "cpu"
    assert plan["index_url"] == "https://download.pytorch.org/whl/cpu"
    assert plan["requirement"] == "torch==2.13.0+cpu"
    assert tm.torch_cuda_expected(plan) == "None"


def test_plan_reference_node():
    # NOTES.md: H100, driver 580.159.04, torch 2.11.0+cu130.
    plan = tm.torch_plan("2.11.0", "13.0", driver_version="580.159.04")
    assert plan["ok"], plan["errors"]
    assert plan["tag"] == "cu130"
    assert plan["min_driver"] == "580.65.06"
    assert tm.torch_cuda_expected(plan) == "13.0"


def test_plan_refuses_cuda_the_release_has_no_build_for():
    plan = tm.torch_plan("2.11.0", "cu118")
    assert not plan["ok"]
    assert "torch 2.11.0 has no CUDA 11.8 (cu118) build" in plan["errors"][0]
    assert "cu126, cu128, cu130" in plan["errors"][0]


def test_plan_refuses_old_driver():
    plan = tm.torch_plan("2.13.0", "13.0", driver_version="535.261.03")
    assert not plan["ok"]
    assert "535.261.03 is older than 580.65.06" in plan["errors"][0]


def test_toolkit_policy_is_stricter():
    assert tm.torch_plan("2.13.0", "12.8", driver_version="535.261.03")["ok"]
    strict = tm.torch_plan("2.13.0", "12.8", driver_version="535.261.03", policy="toolkit")
    assert not strict["ok"] and "570.26" in strict["errors"][0]


def test_auto_picks_newest_the_driver_runs():
    assert tm.torch_plan("2.13.0", "auto", driver_version="580.159.04")["tag"] == "cu130"
    assert tm.torch_plan("2.13.0", "auto", driver_version="535.261.03")["tag"] == "cu128"
    assert tm.torch_plan("2.13.0", "auto")["tag"] == "cu130"
    assert tm.torch_plan("2.6.0", "auto", driver_version="470.57.02")["tag"] == "cu118"


def test_auto_with_a_driver_too_old_for_everything():
    plan = tm.torch_plan("2.13.0", "auto", driver_version="470.57.02")
    assert not plan["ok"]
    assert "too old for every CUDA build" in plan["errors"][0]


def test_unknown_torch_and_overrides():
    plan = tm.torch_plan("2.99.0", "13.0")
    assert not plan["ok"] and "gpunode_pytorch_matrix_overrides" in plan["errors"][0]
    plan = tm.torch_plan("2.99.0", "13.0", overrides={"2.99": ["cu130"]})
    assert plan["ok"], plan["errors"]


def test_bad_inputs_become_errors_not_exceptions():
    assert not tm.torch_plan("latest", "12.8")["ok"]
    assert not tm.torch_plan("2.13.0", "twelve")["ok"]
    assert not tm.torch_plan("2.13.0", "12.8", policy="loose")["ok"]


def test_index_mirror_and_no_label():
    plan = tm.torch_plan("2.13.0", "12.8", index_url="https://mirror.example/whl/", local_label=False)
    assert plan["index_url"] == "https://mirror.example/whl/cu128"
    assert plan["requirement"] == "torch==2.13.0"


def test_companions():
    assert tm.companion_versions("2.13.0") == {"torchvision": "0.28.0", "torchaudio": "2.13.0"}
    assert tm.companion_versions("2.5.1") == {"torchvision": "0.20.1", "torchaudio": "2.5.1"}


def test_filters_are_registered():
    names = tm.FilterModule().filters()
    assert {"gpunode_torch_plan", "gpunode_torch_cuda_expected", "gpunode_torch_companions"} <= set(names)
