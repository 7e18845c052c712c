"""The EL (dnf) paths of gpunode_driver, gpunode_cuda and gpunode_base.

The decisions live in roles/gpunode_driver/vars/RedHat.yml as Jinja and are rendered here with Ansible's own
templar, against recorded `dnf module list --enabled`, `dnf versionlock list` and `rpm -qa` output from the
synthetic Rocky nodes (molecule/el). The task files are checked for what must hold across roles: one writer of
NVIDIA's .repo file, the running kernel's headers before the kernel module package, exact (not glob) locks.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

# ansible-core replaces sys.intern when imported; torch (imported in-process by later tests) refuses that
# replacement, so the original is put back once the modules below are loaded.
_intern = sys.intern
pytest.importorskip("ansible")
from ansible.parsing.dataloader import DataLoader  # noqa: E402
from ansible.template import Templar, trust_as_template  # noqa: E402

sys.intern = _intern

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
REDHAT_VARS = ROLES / "gpunode_driver" / "vars" / "RedHat.yml"
INSTALL_REDHAT = ROLES / "gpunode_driver" / "tasks" / "install_redhat.yml"
SOURCES_DNF = ROLES / "gpunode_base" / "tasks" / "sources_dnf.yml"

# `dnf -q module list --enabled nvidia-driver` on a synthetic Rocky 9 node (the first line is dnf's metadata
# progress for a repo it had not cached).
STREAMS_575_DKMS = """cuda-rhel9-x86_64
Name          Stream       Profiles            Summary
nvidia-driver 575-dkms [e] default [d], fm, ks Nvidia driver for 575-dkms branch

Hint: [d]efault, [e]nabled, [x]disabled, [i]nstalled
"""
STREAMS_LATEST_DEFAULT_ENABLED = """Name          Stream            Profiles               Summary
nvidia-driver latest-dkms [d][e] default [d], fm, ks Nvidia driver for latest-dkms branch
"""
# `dnf versionlock list` after a 575 install, with a site's own lock and an exclude that must be left alone.
LOCKS_575 = """# Added lock on Mon Nov 23 20:50:54 2026
nvidia-driver-cuda-3:575.51.03-1.el9.*
nvidia-driver-cuda-libs-3:575.51.03-1.el9.*
libnvidia-ml-3:575.51.03-1.el9.*
kmod-nvidia-latest-dkms-3:575.51.03-1.el9.*
nvidia-modprobe-3:575.51.03-1.el9.*
openssl-1:3.0.7-27.el9.*
!nvidia-driver-3:575.57.08-1.el9.*
"""
# `rpm -qa --qf '%{NAME}-%{EPOCHNUM}:%{VERSION}-%{RELEASE}.*\n' <lock patterns>` after the switch to 580 open.
RPM_580 = """nvidia-driver-cuda-3:580.95.05-1.el9.*
nvidia-driver-cuda-libs-3:580.95.05-1.el9.*
libnvidia-ml-3:580.95.05-1.el9.*
kmod-nvidia-open-dkms-3:580.95.05-1.el9.*
nvidia-modprobe-3:580.95.05-1.el9.*
"""


def _trust(value):
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [_trust(v) for v in value]
    if isinstance(value, dict):
        return {k: _trust(v) for k, v in value.items()}
    return value


def render(name: str, **inputs):
    """A variable of vars/RedHat.yml, rendered by Ansible's templar with the given inputs."""
    variables = _trust(yaml.safe_load(REDHAT_VARS.read_text()))
    base = {
        "__gpunode_driver_branch": "580",
        "__gpunode_driver_open": False,
        "__gpunode_driver_kmod": False,
        "gpunode_driver_version": "",
        "__gpunode_driver_streams": {"stdout": "", "rc": 1},
        "__gpunode_driver_locklist": {"stdout_lines": []},
        "__gpunode_driver_installed_nevrs": {"stdout_lines": []},
        "ansible_facts": {"kernel": "5.14.0-427.13.1.el9_4.x86_64", "distribution_major_version": "9"},
    }
    variables.update(base)
    variables.update(inputs)
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(trust_as_template("{{ " + name + " }}"))


def tasks(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text()) or []


# --- module stream ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("branch", "is_open", "stream"),
    [
        ("575", False, "nvidia-driver:575-dkms"),
        ("575", True, "nvidia-driver:575-open"),
        ("580", False, "nvidia-driver:580-dkms"),
        ("580", True, "nvidia-driver:580-open"),
    ],
)
def test_module_stream_comes_from_branch_and_flavour(branch, is_open, stream):
    # The flavour is the internal __gpunode_driver_open (decided from the GPUs), not the user's raw setting.
    assert render(
        "__gpunode_driver_module_stream", __gpunode_driver_branch=branch, __gpunode_driver_open=is_open
    ) == (stream)


@pytest.mark.parametrize(
    ("stdout", "branch", "is_open", "enabled", "action"),
    [
        ("", "580", False, "", "enable"),  # fresh node: no stream enabled (dnf exits 1)
        (STREAMS_575_DKMS, "575", False, "nvidia-driver:575-dkms", "none"),
        (STREAMS_575_DKMS, "580", False, "nvidia-driver:575-dkms", "switch"),  # branch changed
        (STREAMS_575_DKMS, "575", True, "nvidia-driver:575-dkms", "switch"),  # flavour changed
        (STREAMS_LATEST_DEFAULT_ENABLED, "580", False, "nvidia-driver:latest-dkms", "switch"),
    ],
)
def test_enabled_stream_and_what_to_do(stdout, branch, is_open, enabled, action):
    inputs = {
        "__gpunode_driver_streams": {"stdout": stdout},
        "__gpunode_driver_branch": branch,
        "__gpunode_driver_open": is_open,
    }
    assert render("__gpunode_driver_enabled_stream", **inputs) == enabled
    assert render("__gpunode_driver_stream_action", **inputs) == action


# --- gpunode_driver_version on EL -----------------------------------------------------------------------------


def test_pinned_version_names_every_driver_package_with_nvidias_epoch():
    specs = render("__gpunode_driver_dnf_specs", gpunode_driver_version="575.51.03")
    assert specs == [
        "nvidia-driver-cuda-3:575.51.03",
        "nvidia-persistenced-3:575.51.03",
        "nvidia-modprobe-3:575.51.03",
    ]


def test_pinned_version_covers_the_kernel_module_package_of_the_flavour():
    specs = render(
        "__gpunode_driver_dnf_specs",
        gpunode_driver_version="580.95.05",
        __gpunode_driver_kmod=True,
        __gpunode_driver_open=True,
    )
    assert "kmod-nvidia-open-dkms-3:580.95.05" in specs
    # The kernel's packages are not at the driver's version.
    assert not any(s.startswith("kernel-") for s in specs)


def test_unpinned_install_names_the_packages_plainly():
    assert render("__gpunode_driver_dnf_specs", __gpunode_driver_kmod=True) == [
        "nvidia-driver-cuda",
        "nvidia-persistenced",
        "nvidia-modprobe",
        "kmod-nvidia-latest-dkms",
    ]


def test_install_task_uses_the_specs_and_may_downgrade_to_a_pin():
    install = next(
        t for t in tasks(INSTALL_REDHAT) if "dnf_specs" in str(t.get("ansible.builtin.dnf", {}).get("name"))
    )
    assert install["ansible.builtin.dnf"]["allow_downgrade"] is True


# --- versionlock --------------------------------------------------------------------------------------------


def test_locks_are_the_installed_nevras_and_stale_driver_locks_only_are_removed():
    inputs = {
        "__gpunode_driver_locklist": {"stdout_lines": LOCKS_575.splitlines()},
        "__gpunode_driver_installed_nevrs": {"stdout_lines": RPM_580.splitlines()},
    }
    assert render("__gpunode_driver_lock_wanted", **inputs) == RPM_580.splitlines()
    stale = render("__gpunode_driver_lock_stale", **inputs)
    assert sorted(stale) == sorted(
        [
            "nvidia-driver-cuda-3:575.51.03-1.el9.*",
            "nvidia-driver-cuda-libs-3:575.51.03-1.el9.*",
            "libnvidia-ml-3:575.51.03-1.el9.*",
            "kmod-nvidia-latest-dkms-3:575.51.03-1.el9.*",
            "nvidia-modprobe-3:575.51.03-1.el9.*",
        ]
    )  # the site's openssl lock and the exclude stay


def test_nothing_is_stale_when_the_locks_match_what_is_installed():
    inputs = {
        "__gpunode_driver_locklist": {"stdout_lines": RPM_580.splitlines()},
        "__gpunode_driver_installed_nevrs": {"stdout_lines": RPM_580.splitlines()},
    }
    assert render("__gpunode_driver_lock_stale", **inputs) == []


def test_versionlock_tasks_lock_exact_entries_never_globs():
    # community.general.dnf_versionlock with patterns locks every available version of each match and reports a
    # change on every run; raw entries compare as dnf lists them.
    locks = [
        t["community.general.dnf_versionlock"]
        for t in tasks(INSTALL_REDHAT)
        if "community.general.dnf_versionlock" in t
    ]
    assert locks, "install_redhat.yml no longer locks the driver"
    for lock in locks:
        assert lock.get("raw") is True
        assert "*" not in str(lock["name"]).replace(".*", "")


# --- order of the EL driver install -----------------------------------------------------------------------


def _index(task_list, predicate):
    for i, task in enumerate(task_list):
        if predicate(task):
            return i
    raise AssertionError("task not found")


def test_running_kernel_headers_come_before_the_kernel_module_package():
    names = render("__gpunode_driver_kernel_packages")
    assert names == [
        "kernel-devel-5.14.0-427.13.1.el9_4.x86_64",
        "kernel-headers-5.14.0-427.13.1.el9_4.x86_64",
    ]
    steps = tasks(INSTALL_REDHAT)
    headers = _index(steps, lambda t: "kernel_packages" in str(t.get("ansible.builtin.dnf", {}).get("name")))
    driver = _index(steps, lambda t: "dnf_specs" in str(t.get("ansible.builtin.dnf", {}).get("name")))
    assert headers < driver
    assert "__gpunode_driver_kmod | bool" in steps[headers]["when"]


def test_stream_is_enabled_or_switched_before_the_install():
    steps = tasks(INSTALL_REDHAT)
    driver = _index(steps, lambda t: "dnf_specs" in str(t.get("ansible.builtin.dnf", {}).get("name")))
    switch = _index(steps, lambda t: "switch-to" in t.get("ansible.builtin.command", {}).get("argv", []))
    enable = _index(steps, lambda t: "enable" in t.get("ansible.builtin.command", {}).get("argv", []))
    unlock = _index(steps, lambda t: t.get("community.general.dnf_versionlock", {}).get("state") == "absent")
    assert unlock < switch < driver and enable < driver
    assert "switch" in steps[switch]["when"] and "enable" in steps[enable]["when"]


# --- package sources: one writer --------------------------------------------------------------------------


def test_one_task_file_writes_nvidias_dnf_repo():
    writers = []
    for path in sorted(ROLES.glob("*/tasks/*.yml")):
        for task in tasks(path):
            for block in [task, *task.get("block", [])]:
                if "ansible.builtin.yum_repository" in block:
                    writers.append(str(path.relative_to(ROOT)))
    assert writers == ["roles/gpunode_base/tasks/sources_dnf.yml"]


def test_sources_dnf_ensures_epel_and_crb_per_distribution():
    steps = tasks(SOURCES_DNF)
    text = SOURCES_DNF.read_text()
    epel = [
        t for t in steps if "ansible.builtin.dnf" in t and "epel" in str(t["ansible.builtin.dnf"]["name"])
    ]
    assert {str(t["ansible.builtin.dnf"]["name"]) for t in epel} == {
        "epel-release",
        "{{ gpunode_base_epel_release_url }}",
    }
    assert all("gpunode_base_epel_enabled | bool" in t["when"] for t in epel)
    crb = [
        t
        for t in steps
        if "community.general.dnf_config_manager" in t or "community.general.rhsm_repository" in t
    ]
    assert len(crb) == 2 and all("gpunode_base_crb_enabled | bool" in t["when"] for t in crb)
    assert "'powertools' if ansible_facts['distribution_major_version'] == '8' else 'crb'" in text
    assert "codeready-builder-for-rhel-{{ ansible_facts['distribution_major_version'] }}-x86_64-rpms" in text


def test_new_base_variables_are_declared():
    defaults = yaml.safe_load((ROLES / "gpunode_base" / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLES / "gpunode_base" / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    for name in (
        "gpunode_base_nvidia_repo_base_url",
        "gpunode_base_nvidia_repo_key",
        "gpunode_base_epel_enabled",
        "gpunode_base_crb_enabled",
        "gpunode_base_epel_release_url",
    ):
        assert name in defaults and name in options
    assert (
        defaults["gpunode_base_nvidia_repo_base_url"]
        == "https://developer.download.nvidia.com/compute/cuda/repos"
    )


def test_cuda_dnf_path_only_installs():
    # gpunode_base writes the repo; cuda's dnf side only checks that it is there and remembers facts.
    dnf_side = tasks(ROLES / "gpunode_cuda" / "tasks" / "repo_nvidia_dnf.yml")
    modules = {k for t in dnf_side for k in t if k.startswith("ansible.") or k.startswith("community.")}
    assert modules <= {"ansible.builtin.set_fact", "ansible.builtin.assert"}
