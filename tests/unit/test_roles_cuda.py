"""Unit tests of gpunode_cuda's package logic (plugins/filter/cuda_packages.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "plugins" / "filter" / "cuda_packages.py"
_spec = importlib.util.spec_from_file_location("gpunode_cuda_packages", _PATH)
cp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cp)


def test_missing_wheels_are_installed():
    assert cp.wheels_to_install({"nvidia-nccl-cu12": "2.28.9"}, {"nvidia-nccl-cu12": ""}) == [
        "nvidia-nccl-cu12==2.28.9"
    ]


def test_pinned_wheel_at_the_right_version_is_left_alone():
    assert cp.wheels_to_install({"nvidia-nccl-cu12": "2.28.9"}, {"nvidia-nccl-cu12": "2.28.9"}) == []


def test_pinned_wheel_at_another_version_is_reinstalled():
    assert cp.wheels_to_install({"nvidia-nccl-cu12": "2.28.9"}, {"nvidia-nccl-cu12": "2.27.3"}) == [
        "nvidia-nccl-cu12==2.28.9"
    ]


def test_unpinned_wheel_accepts_any_installed_version():
    # torch's CUDA wheels pin their own cuDNN/NCCL: an empty pin must not fight them.
    assert cp.wheels_to_install({"nvidia-cudnn-cu12": ""}, {"nvidia-cudnn-cu12": "9.10.2.21"}) == []
    assert cp.wheels_to_install({"nvidia-cudnn-cu12": ""}, {}) == ["nvidia-cudnn-cu12"]


def test_names_are_compared_normalised():
    assert cp.wheels_to_install({"nvidia-nccl-cu12": "2.28.9"}, {"nvidia_nccl_cu12": "2.28.9"}) == []


def test_apt_version_pins_only_for_nvidia_items_with_versions():
    items = [
        {"component": "toolkit", "source": "nvidia", "version": "12.8.0-1", "names": ["cuda-toolkit-12-8"]},
        {
            "component": "nccl",
            "source": "nvidia",
            "version": "2.28.9-1+cuda12.8",
            "names": ["libnccl2", "libnccl-dev"],
        },
        {"component": "cudnn", "source": "nvidia", "version": "", "names": ["cudnn9-cuda-12"]},
        {"component": "nccl", "source": "distro", "version": "2.18.3-1", "names": ["libnccl2"]},
    ]
    assert cp.apt_version_pins(items) == {
        "cuda-toolkit-12-8": "12.8.0-1*",
        "libnccl2 libnccl-dev": "2.28.9-1+cuda12.8*",
    }


def test_dnf_specs_hold_unversioned_nvidia_nccl_to_the_cuda_major():
    nccl = {"component": "nccl", "source": "nvidia", "version": "", "names": ["libnccl", "libnccl-devel"]}
    # NEVR form: name, any version, a release built for CUDA 12 (NVIDIA's release field is 1+cuda12.9).
    assert cp.dnf_specs(nccl, "12") == ["libnccl-*-*+cuda12.*", "libnccl-devel-*-*+cuda12.*"]
    assert cp.dnf_specs({**nccl, "version": "2.27.3-1+cuda12.9"}, "12") == [
        "libnccl-2.27.3-1+cuda12.9",
        "libnccl-devel-2.27.3-1+cuda12.9",
    ]
    # No major known: the plain names (the plan always gives one; this is the degraded case).
    assert cp.dnf_specs(nccl, "") == ["libnccl", "libnccl-devel"]
    cudnn = {"component": "cudnn", "source": "nvidia", "version": "", "names": ["libcudnn9-cuda-12"]}
    assert cp.dnf_specs(cudnn, "12") == ["libcudnn9-cuda-12"]


@pytest.mark.parametrize(
    ("cuda", "suffix"), [("12.8", "cu12"), ("13.0", "cu13"), ("11.8", "cu11"), (12.6, "cu12")]
)
def test_wheel_suffix(cuda, suffix):
    assert cp.wheel_suffix(cuda) == suffix


def test_wheel_suffix_rejects_garbage():
    with pytest.raises(ValueError):
        cp.wheel_suffix("cpu")


def test_system_versions():
    items = [
        {"component": "toolkit", "names": ["cuda-toolkit-12-8"]},
        {"component": "nccl", "names": ["libnccl2"]},
    ]
    packages = {"cuda-toolkit-12-8": [{"version": "12.8.0-1"}]}
    assert cp.system_versions(items, packages) == {"toolkit": "12.8.0-1", "nccl": ""}
