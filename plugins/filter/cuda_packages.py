"""Package decisions for gpunode_cuda (pure functions, unit-tested in tests/unit/test_roles_cuda.py)."""

from __future__ import annotations


def _canon(name: str) -> str:
    """PEP 503 name normalisation: nvidia_nccl_cu12 == nvidia-nccl-cu12."""
    return "-".join(str(name).lower().replace("_", "-").replace(".", "-").split("-"))


def wheels_to_install(wanted, have) -> list:
    """Specs pip must install: wheels missing from `have`, or pinned in `wanted` to another version.

    wanted: {name: pinned version or ''}; have: {name: installed version or ''} (importlib.metadata).
    An empty pin accepts any installed version, so torch's own pins are not fought over.
    """
    have_c = {_canon(k): str(v or "") for k, v in (have or {}).items()}
    specs = []
    for name, pin in (wanted or {}).items():
        pin = str(pin or "")
        installed = have_c.get(_canon(name), "")
        if not installed or (pin and installed != pin):
            specs.append(f"{name}=={pin}" if pin else name)
    return specs


def apt_version_pins(items, cuda_major="") -> dict:
    """{'libnccl2 libnccl-dev': '2.28.9-1+cuda12.9*'} for apt preferences, from the system items
    ({component, names, version, source}) that come from NVIDIA's repo.

    NCCL without a version is still pinned to builds for the CUDA major (`*+cuda12.*`): NVIDIA's repo
    carries libnccl2 builds for several CUDA majors, and the newest (+cuda13.x) would land beside a 12.x
    toolkit and torch.
    """
    pins = {}
    for item in items or []:
        if item.get("source") != "nvidia" or not item.get("names"):
            continue
        version = str(item.get("version") or "")
        if version:
            pins[" ".join(item["names"])] = version if version.endswith("*") else version + "*"
        elif item.get("component") == "nccl" and str(cuda_major or "").isdigit():
            pins[" ".join(item["names"])] = f"*+cuda{int(cuda_major)}.*"
    return pins


def dnf_specs(item, cuda_major="") -> list:
    """dnf specs for one system item ({component, names, version, source}): `name-version` when a version is
    set; NCCL from NVIDIA's repo without one is held to builds for the CUDA major (`libnccl-*-*+cuda12.*`, the
    same rule as apt_version_pins: the repo's newest libnccl is built for another major)."""
    names = [str(n) for n in item.get("names") or []]
    version = str(item.get("version") or "")
    if version:
        return [f"{n}-{version}" for n in names]
    if item.get("source") == "nvidia" and item.get("component") == "nccl" and str(cuda_major or "").isdigit():
        return [f"{n}-*-*+cuda{int(cuda_major)}.*" for n in names]
    return names


def system_versions(items, packages) -> dict:
    """{component: installed version of its first package or ''} from package_facts' packages."""
    out = {}
    for item in items or []:
        names = item.get("names") or []
        found = (packages or {}).get(names[0]) if names else None
        out[item.get("component", "")] = str(found[0].get("version", "")) if found else ""
    return out


def wheel_suffix(cuda_version) -> str:
    """'12.8' -> 'cu12', '13.0' -> 'cu13' (NVIDIA's wheels are per CUDA major)."""
    major = str(cuda_version).partition(".")[0].strip()
    if not major.isdigit():
        raise ValueError(f"not a CUDA version: {cuda_version!r}")
    return f"cu{int(major)}"


class FilterModule:
    """gpunode.node.gpunode_* package filters (used by gpunode_cuda)."""

    def filters(self):
        return {
            "gpunode_wheels_to_install": wheels_to_install,
            "gpunode_apt_version_pins": apt_version_pins,
            "gpunode_dnf_specs": dnf_specs,
            "gpunode_wheel_suffix": wheel_suffix,
            "gpunode_system_versions": system_versions,
        }
