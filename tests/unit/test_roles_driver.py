"""gpunode_driver's apt package names, rendered from the role's per-OS variables, against the vendors' documents.

Documents the expectations follow (the fact sheet the names were taken from quotes them):
- PIN: NVIDIA Driver Installation Guide, "Recent Updates" (r590, section 4.1): pinning packages
  nvidia-driver-pinning-<branch> for Debian and Ubuntu, to be installed before the driver; and table 4,
  "Ubuntu 590 package renames". https://docs.nvidia.com/datacenter/tesla/pdf/Driver_Installation_Guide.pdf
- META: NVIDIA Driver Installation Guide 595, advanced options: open is nvidia-open, proprietary is cuda-drivers.
  https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/advanced-options.html
- GE: cuda-drivers-<branch> depends with ">=" (why the pinning package is needed).
  https://github.com/dstackai/dstack/pull/2355
- FM: Fabric Manager's apt name before 590. https://packages.ubuntu.com/questing/nvidia-fabricmanager-580
- DEB: Debian's archive, open vs proprietary DKMS. https://packages.debian.org/search?keywords=nvidia-open-kernel-dkms
"""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
VARS = ROLES / "gpunode_driver" / "vars"
ENV = jinja2.Environment(undefined=jinja2.StrictUndefined)
ENV.filters["bool"] = lambda v: (
    v if isinstance(v, bool) else str(v).strip().lower() in ("true", "yes", "1", "on")
)

KERNEL = "6.8.0-test"
OSES = {
    "ubuntu2204": (
        "Ubuntu.yml",
        {
            "distribution_release": "jammy",
            "distribution_version": "22.04",
            "distribution_major_version": "22",
        },
    ),
    "ubuntu2404": (
        "Ubuntu.yml",
        {
            "distribution_release": "noble",
            "distribution_version": "24.04",
            "distribution_major_version": "24",
        },
    ),
    "debian12": (
        "Debian.yml",
        {
            "distribution_release": "bookworm",
            "distribution_version": "12",
            "distribution_major_version": "12",
        },
    ),
    "debian13": (
        "Debian_13.yml",
        {"distribution_release": "trixie", "distribution_version": "13", "distribution_major_version": "13"},
    ),
}


def _value(out: str):
    text = out.strip()
    return yaml.safe_load(text) if text and (text[0] in "[{" or text in ("True", "False")) else text


def _render(value, ctx):
    if isinstance(value, str):
        return _value(ENV.from_string(value).render(**ctx))
    if isinstance(value, list):
        return [_render(v, ctx) for v in value]
    if isinstance(value, dict):
        return {k: _render(v, ctx) for k, v in value.items()}
    return value


def role_vars(
    os_file: str,
    facts: dict,
    branch: str,
    *,
    open_: bool = False,
    kmod: bool = True,
    source: str = "nvidia",
    extra: dict | None = None,
) -> dict:
    """Every variable of the per-OS file, rendered as Ansible would (lazily, in dependency order)."""
    ctx = {
        "ansible_facts": {"kernel": KERNEL, **facts},
        "__gpunode_driver_branch": branch,
        "__gpunode_driver_source": source,
        "__gpunode_driver_open": open_,
        "__gpunode_driver_kmod": kmod,
        # The user's setting stays at its default: the flavour is the plan's (__gpunode_driver_open), never this.
        "gpunode_driver_open_kernel_modules": "auto",
        **(extra or {}),
    }
    todo = dict(yaml.safe_load((VARS / os_file).read_text()))
    while todo:
        done = {}
        for name, raw in todo.items():
            try:
                done[name] = _render(raw, ctx)
            except jinja2.UndefinedError:
                continue
        if not done:
            raise AssertionError(f"{os_file}: cannot render {sorted(todo)}")
        ctx.update(done)
        for name in done:
            del todo[name]
    return ctx


def nvidia_packages(os_key: str, branch: str, open_: bool, kmod: bool = True) -> list:
    os_file, facts = OSES[os_key]
    return role_vars(os_file, facts, branch, open_=open_, kmod=kmod)["__gpunode_driver_nvidia_packages"]


H = f"linux-headers-{KERNEL}"


# Ubuntu, NVIDIA's repo. 580: branch in every name (PIN table 4, left column; cuda-drivers-580 and
# nvidia-dkms-580(-open) are its 580 names); 590: renamed (PIN table 4, right column: libnvidia-compute,
# nvidia-dkms(-open), cuda-drivers). Open vs proprietary meta: META. Pinning package first: PIN and GE.
# nvidia-utils' 590 name is NOT FOUND in PIN's table (cut off): it keeps the branch, as before.
UBUNTU = {
    ("580", True): [
        "nvidia-driver-pinning-580",
        "nvidia-utils-580",
        "libnvidia-compute-580",
        H,
        "nvidia-open-580",
        "nvidia-dkms-580-open",
    ],
    ("580", False): [
        "nvidia-driver-pinning-580",
        "nvidia-utils-580",
        "libnvidia-compute-580",
        H,
        "cuda-drivers-580",
        "nvidia-dkms-580",
    ],
    ("590", True): [
        "nvidia-driver-pinning-590",
        "nvidia-utils-590",
        "libnvidia-compute",
        H,
        "nvidia-open",
        "nvidia-dkms-open",
    ],
    ("590", False): [
        "nvidia-driver-pinning-590",
        "nvidia-utils-590",
        "libnvidia-compute",
        H,
        "cuda-drivers",
        "nvidia-dkms",
    ],
}
# Debian, NVIDIA's repo: the metas are nvidia-open or cuda-drivers (META: "Debian uses only nvidia-open or
# cuda-drivers"); 580 keeps its branch metas (cuda-drivers-580 with nvidia-driver-pinning-580 on debian13, PIN);
# pinning package first (PIN, GE). The userspace names are the role's own (no document lists them for this repo).
DEBIAN_USER = ["nvidia-smi", "libnvidia-ml1", "nvidia-persistenced"]
DEBIAN = {
    ("580", True): ["nvidia-driver-pinning-580", *DEBIAN_USER, H, "nvidia-open-580"],
    ("580", False): ["nvidia-driver-pinning-580", *DEBIAN_USER, H, "cuda-drivers-580"],
    ("590", True): ["nvidia-driver-pinning-590", *DEBIAN_USER, H, "nvidia-open"],
    ("590", False): ["nvidia-driver-pinning-590", *DEBIAN_USER, H, "cuda-drivers"],
}
CASES = [
    (os_key, branch, open_, table[(branch, open_)])
    for os_key, table in (
        ("ubuntu2204", UBUNTU),
        ("ubuntu2404", UBUNTU),
        ("debian12", DEBIAN),
        ("debian13", DEBIAN),
    )
    for branch in ("580", "590")
    for open_ in (True, False)
]


@pytest.mark.parametrize(
    ("os_key", "branch", "open_", "expected"),
    CASES,
    ids=[f"{c[0]}-{c[1]}-{'open' if c[2] else 'proprietary'}" for c in CASES],
)
def test_nvidia_repo_packages_follow_the_documents(os_key, branch, open_, expected):
    assert nvidia_packages(os_key, branch, open_) == expected


@pytest.mark.parametrize("os_key", sorted(OSES))
@pytest.mark.parametrize("branch", ["580", "590", "610"])
def test_pinning_package_comes_first(os_key, branch):
    # PIN: "we suggest to install the pinning package prior to installing the driver".
    for open_ in (True, False):
        for kmod in (True, False):
            packages = nvidia_packages(os_key, branch, open_, kmod)
            assert packages[0] == f"nvidia-driver-pinning-{branch}"
            assert [p for p in packages if p.startswith("nvidia-driver-pinning")] == [packages[0]]
            os_file, facts = OSES[os_key]
            assert role_vars(os_file, facts, branch, open_=open_)[
                "__gpunode_driver_nvidia_pinning_packages"
            ] == [f"nvidia-driver-pinning-{branch}"]


@pytest.mark.parametrize("os_key", sorted(OSES))
def test_branch_without_a_documented_pinning_package_installs_none(os_key):
    # The earliest branch with a pinning package is NOT FOUND (PIN names 590 on; 580 is seen in scripts).
    packages = nvidia_packages(os_key, "570", False)
    assert not any(p.startswith("nvidia-driver-pinning") for p in packages)


@pytest.mark.parametrize("os_key", sorted(OSES))
def test_container_gets_no_kernel_module_packages(os_key):
    packages = nvidia_packages(os_key, "590", True, kmod=False)
    assert not [
        p for p in packages if p.startswith(("linux-headers-", "nvidia-dkms", "nvidia-open", "cuda-drivers"))
    ]


@pytest.mark.parametrize(
    ("os_key", "open_", "module"),
    [
        ("debian12", True, "nvidia-open-kernel-dkms"),  # DEB: contrib, the open modules
        ("debian12", False, "nvidia-kernel-dkms"),
        ("debian13", True, "nvidia-open-kernel-dkms"),
        ("ubuntu2404", True, "nvidia-headless-580-server-open"),
        ("ubuntu2404", False, "nvidia-headless-580-server"),
    ],
)
def test_distro_kernel_module_follows_the_plans_flavour(os_key, open_, module):
    # The flavour is the plan's choice (gpunode_driver_open_kernel_modules is "auto" here, which is not a bool).
    os_file, facts = OSES[os_key]
    kernel = role_vars(os_file, facts, "580", open_=open_, source="distro")[
        "__gpunode_driver_kernel_packages"
    ]
    assert kernel == [H, module] + (["firmware-nvidia-gsp"] if os_key.startswith("debian") else [])


def test_pinning_package_is_installed_in_its_own_transaction_first():
    # A pinning package's apt preference counts only from the next apt run: installing it in the driver's own
    # transaction would still let that one resolve to a newer branch.
    tasks = yaml.safe_load((ROLES / "gpunode_driver" / "tasks" / "packages_apt.yml").read_text())
    names = [t.get("ansible.builtin.apt", {}).get("name") for t in tasks]
    assert "{{ __gpunode_driver_pinning }}" in names
    assert names.index("{{ __gpunode_driver_pinning }}") < names.index("{{ __gpunode_driver_packages }}")


def _written_paths(role: Path) -> dict[str, str]:
    """Files a role's tasks write (template/copy/get_url dest), by path."""
    out = {}
    for tasks_file in (role / "tasks").glob("*.yml"):
        stack = list(yaml.safe_load(tasks_file.read_text()) or [])
        while stack:
            task = stack.pop()
            stack.extend(task.get("block", []) + task.get("rescue", []) + task.get("always", []))
            for module in ("ansible.builtin.template", "ansible.builtin.copy", "ansible.builtin.get_url"):
                dest = (task.get(module) or {}).get("dest")
                if dest:
                    out[dest] = tasks_file.name
    return out


def test_each_apt_source_and_keyring_has_one_owner():
    owners: dict[str, list[str]] = {}
    for role in sorted(ROLES.iterdir()):
        for dest in _written_paths(role):
            owners.setdefault(dest, []).append(role.name)
    shared = {d: r for d, r in owners.items() if d.startswith("/etc/apt/") and len(r) > 1}
    assert shared == {}
    sources = {d: r for d, r in owners.items() if "sources.list.d" in d or "keyrings" in d}
    assert sources and all(r == ["gpunode_base"] for r in sources.values()), sources


def fm_packages(os_file: str, branch: str, source: str, override: list | None = None) -> list:
    main = yaml.safe_load((VARS / "main.yml").read_text())
    ctx = {"__gpunode_driver_branch": branch, "__gpunode_driver_source": source}
    ctx["__gpunode_driver_fabricmanager_os_packages"] = _render(
        yaml.safe_load((VARS / os_file).read_text())["__gpunode_driver_fabricmanager_os_packages"], ctx
    )
    ctx["gpunode_driver_fabricmanager_packages"] = override or []
    expr = main["__gpunode_driver_fabricmanager_packages"].strip()
    return yaml.safe_load(ENV.from_string(expr).render(**ctx))


@pytest.mark.parametrize(
    ("os_file", "branch", "source", "expected"),
    [
        ("Ubuntu.yml", "580", "distro", ["nvidia-fabricmanager-580"]),  # FM (Ubuntu's archive)
        ("Ubuntu.yml", "580", "nvidia", ["nvidia-fabricmanager-580"]),  # FM, GE: apt before 590
        # From 590 NVIDIA's name is NOT FOUND (PIN's rename table is cut off): the unversioned name is kept.
        ("Ubuntu.yml", "590", "nvidia", ["nvidia-fabricmanager"]),
        ("Debian.yml", "535", "nvidia", ["nvidia-fabricmanager-535"]),  # GE: nvidia-fabricmanager-535
        ("Debian.yml", "535", "distro", []),  # Debian non-free has none: the role refuses the node
        # NVIDIA's apt name before 590 has the branch (FM, GE), on Debian 13 too.
        ("Debian_13.yml", "580", "nvidia", ["nvidia-fabricmanager-580"]),
        ("Debian_13.yml", "590", "nvidia", ["nvidia-fabricmanager"]),
        ("Debian_13.yml", "550", "distro", []),
        ("RedHat.yml", "580", "nvidia", ["nvidia-fabric-manager"]),
    ],
)
def test_fabricmanager_packages_by_os_branch_and_source(os_file, branch, source, expected):
    assert fm_packages(os_file, branch, source) == expected


def test_fabricmanager_packages_override_wins():
    assert fm_packages("Debian.yml", "535", "distro", ["my-fm-535"]) == ["my-fm-535"]
