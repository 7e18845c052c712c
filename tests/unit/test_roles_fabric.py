"""gpunode_driver's RDMA userspace names and its nvidia_peermem decision, rendered from the role's variables.

- Names: rdma-core's Debian packaging and RPM spec
  (https://github.com/linux-rdma/rdma-core/blob/691953d8d502f54088f776c5ba2aeed0a5ac945d/debian/control,
  .../redhat/rdma-core.spec: libibverbs-utils, infiniband-diags), perftest
  (https://packages.debian.org/bookworm/perftest, https://src.fedoraproject.org/rpms/perftest).
- Peer memory: DMA-BUF needs the open kernel modules and Linux 5.12 or later; the legacy nvidia_peermem serves
  otherwise. NVIDIA GPU Operator, GPUDirect RDMA, "Common Prerequisites"
  (https://github.com/NVIDIA/cloud-native-docs/blob/52dcb7b8d956784344e241df476de17094a4574c/gpu-operator/gpu-operator-rdma.rst).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

_intern = sys.intern
pytest.importorskip("ansible")
from ansible.parsing.dataloader import DataLoader  # noqa: E402
from ansible.template import Templar, trust_as_template  # noqa: E402

sys.intern = _intern

VARS = Path(__file__).resolve().parents[2] / "roles" / "gpunode_driver" / "vars"


def render(name: str, **inputs):
    """A variable of vars/main.yml, rendered by Ansible's templar with the given inputs."""
    variables = {
        k: trust_as_template(v) if isinstance(v, str) else v
        for k, v in yaml.safe_load((VARS / "main.yml").read_text()).items()
    }
    variables.update(
        {
            "gpunode_is_container": False,
            "gpunode_driver_kernel_module": "auto",
            "gpunode_driver_rdma_peermem": "auto",
            "__gpunode_driver_rdma": True,
            "gpunode_plan": {"driver": {"open": False}},
            "ansible_facts": {"kernel": "6.8.0-60-generic"},
        }
    )
    variables.update(inputs)
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template("{{ " + name + " }}"))


@pytest.mark.parametrize(
    ("os_file", "expected"),
    [
        ("Debian.yml", ["rdma-core", "ibverbs-utils", "infiniband-diags", "perftest"]),
        ("Debian_13.yml", ["rdma-core", "ibverbs-utils", "infiniband-diags", "perftest"]),
        ("Ubuntu.yml", ["rdma-core", "ibverbs-utils", "infiniband-diags", "perftest"]),
        ("RedHat.yml", ["rdma-core", "libibverbs-utils", "infiniband-diags", "perftest"]),
    ],
)
def test_rdma_package_names_per_os_family(os_file, expected):
    assert yaml.safe_load((VARS / os_file).read_text())["__gpunode_driver_rdma_os_packages"] == expected


@pytest.mark.parametrize(
    ("is_open", "kernel", "wanted", "reason"),
    [
        # Fault planted: DMA-BUF cannot serve, so the legacy module is loaded.
        (False, "6.8.0-60-generic", True, "load: DMA-BUF cannot serve (proprietary kernel modules)"),
        (True, "5.10.0-28-amd64", True, "load: DMA-BUF cannot serve (kernel 5.10 < 5.12)"),
        # Fault absent: DMA-BUF serves, nothing is loaded.
        (
            True,
            "5.12.0-1-amd64",
            False,
            "skipped: DMA-BUF serves GPUDirect RDMA (open kernel modules, kernel 5.12 >= 5.12)",
        ),
        (
            True,
            "6.8.0-60-generic",
            False,
            "skipped: DMA-BUF serves GPUDirect RDMA (open kernel modules, kernel 6.8 >= 5.12)",
        ),
    ],
)
def test_peermem_only_where_dmabuf_cannot_serve(is_open, kernel, wanted, reason):
    inputs = {"gpunode_plan": {"driver": {"open": is_open}}, "ansible_facts": {"kernel": kernel}}
    assert render("__gpunode_driver_dmabuf | bool", **inputs) is (not wanted)
    assert render("__gpunode_driver_peermem | bool", **inputs) is wanted
    assert render("__gpunode_driver_peermem_reason", **inputs) == reason


@pytest.mark.parametrize(
    ("inputs", "reason"),
    [
        (
            {"gpunode_is_container": True, "gpunode_driver_rdma_peermem": "true"},
            "skipped: container (the host loads kernel modules)",
        ),
        ({"gpunode_driver_kernel_module": False}, "skipped: gpunode_driver_kernel_module is false"),
        ({"__gpunode_driver_rdma": False}, "skipped: no RDMA userspace on this node"),
        ({"gpunode_driver_rdma_peermem": False}, "skipped: gpunode_driver_rdma_peermem is false"),
    ],
)
def test_peermem_is_never_loaded_in_a_container_or_when_turned_off(inputs, reason):
    assert render("__gpunode_driver_peermem | bool", **inputs) is False
    assert render("__gpunode_driver_peermem_reason", **inputs) == reason


def test_peermem_forced_on_loads_even_where_dmabuf_serves():
    inputs = {"gpunode_driver_rdma_peermem": True, "gpunode_plan": {"driver": {"open": True}}}
    assert render("__gpunode_driver_peermem | bool", **inputs) is True
    assert render("__gpunode_driver_peermem_reason", **inputs) == "load: gpunode_driver_rdma_peermem is true"
