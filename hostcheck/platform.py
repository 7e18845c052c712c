"""The platform facts (hostcheck/data/platform.json) and the one decision made from them per node.

Standard library only: the roles' filter plugin loads this file by path, hostcheck imports it. The data
holds the facts, each row with its public source; this module holds the logic:

- ``load(overrides)``: the data, with a site's corrections or new rows merged in (inventory
  ``gpunode_platform_overrides``);
- ``node_plan(...)``: from the node's OS, its GPUs (PCI device ids), the driver settings and the torch
  settings, choose torch's CUDA variant first; the driver branch and kernel-module flavour, the CUDA
  toolkit, cuDNN and NCCL follow it. Never raises for bad input: every refusal is an error string
  that names the nearest working choice.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

DATA_PATH = Path(__file__).resolve().parent / "data" / "platform.json"
CPU = "cpu"
POLICIES = ("compat", "toolkit")
# Variant roles in the order "auto" prefers them (after the release's default build); experimental and extra builds
# (e.g. a Linux-only build whose architectures are unpublished) are installed only when named.
AUTO_ROLES = ("stable", "legacy")

_cache: dict[str, Any] | None = None


# --- small parsers -------------------------------------------------------------------------------


def vtuple(version: Any) -> tuple[int, ...]:
    """'580.65.06' -> (580, 65, 6); anything without digits -> ()."""
    return tuple(int(p) for p in re.findall(r"\d+", str(version or "")))


def torch_minor(torch_version: Any) -> str:
    """'2.13.0' / '2.13.0+cu130' / '2.13' -> '2.13'."""
    m = re.match(r"^\s*(\d+)\.(\d+)", str(torch_version or ""))
    if not m:
        raise ValueError(f"not a torch version: {torch_version!r}")
    return f"{int(m.group(1))}.{int(m.group(2))}"


def cuda_normalize(cuda: Any) -> str:
    """'12.8', '12.8.1', 'cu128', 'CU128' -> '12.8'; 'cpu' -> 'cpu'; '' stays ''."""
    text = str(cuda if cuda is not None else "").strip().lower()
    if text in ("cpu", "none"):
        return CPU
    if text == "":
        return ""
    m = re.match(r"^cu(\d{2,3})$", text)
    if m:
        digits = m.group(1)
        return f"{int(digits[:-1])}.{int(digits[-1])}"
    m = re.match(r"^(\d+)\.(\d+)", text)
    if m:
        return f"{int(m.group(1))}.{int(m.group(2))}"
    raise ValueError(f"not a CUDA version: {cuda!r}")


def cuda_tag(cuda: Any) -> str:
    """'12.8' -> 'cu128'; 'cpu' -> 'cpu'."""
    norm = cuda_normalize(cuda)
    if norm in (CPU, ""):
        return norm
    major, minor = norm.split(".")
    return f"cu{major}{minor}"


def python_version(name: Any) -> str:
    """'python3.11' / '/usr/bin/python3.12' / '3.11' -> '3.11'; '' when the name carries no version."""
    m = re.search(r"(\d+)\.(\d+)\s*$", str(name or ""))
    return f"{int(m.group(1))}.{int(m.group(2))}" if m else ""


def pci_id(value: Any) -> str:
    """'0x2330' / '2330' / '10de:2330' -> '0x2330' (lower case); '' for anything else."""
    m = re.search(r"(?:^|:|0x)([0-9a-fA-F]{4})\s*$", str(value or "").strip())
    return f"0x{m.group(1).lower()}" if m else ""


# --- the data ------------------------------------------------------------------------------------


def _merge(base: Any, extra: Any) -> Any:
    """Deep merge of dicts; anything else in `extra` replaces what `base` had."""
    if isinstance(base, dict) and isinstance(extra, dict):
        out = dict(base)
        for key, value in extra.items():
            out[key] = _merge(base.get(key), value) if key in base else copy.deepcopy(value)
        return out
    return copy.deepcopy(extra)


def load(overrides: Any = None, path: Path | None = None) -> dict[str, Any]:
    """The platform data, with `overrides` (same shape, any subset) merged in."""
    global _cache
    if path is not None:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    else:
        if _cache is None:
            _cache = json.loads(DATA_PATH.read_text(encoding="utf-8"))
        data = _cache
    if overrides:
        if not isinstance(overrides, dict):
            raise ValueError("gpunode_platform_overrides must be a mapping shaped like platform.json")
        return _merge(data, overrides)
    return copy.deepcopy(data)


def min_driver(data: dict, cuda: Any, policy: str = "compat") -> str:
    """The oldest Linux driver a CUDA version runs on ('' for cpu or a version not in the data)."""
    norm = cuda_normalize(cuda)
    if norm in (CPU, ""):
        return ""
    major = norm.partition(".")[0]
    if policy == "toolkit":
        return str(data["cuda"].get(norm, {}).get("min_driver", ""))
    return str(data["cuda_major"].get(major, {}).get("min_driver_compat", ""))


def driver_satisfies(driver: Any, required: Any) -> bool:
    """A driver version, or a bare branch ('580' = the newest of the branch), against a minimum."""
    have = vtuple(driver)
    if len(have) == 1:
        have = (have[0], 10**6)
    return have >= vtuple(required)


def gpu(data: dict, device_id: Any) -> dict:
    """{'id', 'name', 'sm', 'arch'} of an NVIDIA PCI device id; sm '' and arch 'unknown' when not in the data."""
    key = pci_id(device_id)
    row = data["gpus"].get(key)
    if not row:
        return {
            "id": key,
            "name": "unknown NVIDIA device " + (key or str(device_id)),
            "sm": "",
            "arch": "unknown",
        }
    return {"id": key, "name": row["name"], "sm": row["sm"], "arch": row["arch"]}


def os_key(distribution: Any, major: Any) -> str:
    return f"{distribution} {major}"


# --- the decision --------------------------------------------------------------------------------


def _variant_fits(data: dict, row: dict, tag: str, gpus: list[dict], driver: str, policy: str) -> list[str]:
    """Why a torch CUDA variant cannot serve this node ([] when it can)."""
    why = []
    cuda = cuda_normalize(tag)
    need = min_driver(data, cuda, policy)
    if driver and need and not driver_satisfies(driver, need):
        why.append(f"{tag} needs driver >= {need}")
    archs = row["variants"][tag].get("sm", [])
    for g in gpus:
        if g["sm"] and archs and g["sm"] not in archs:
            why.append(f"{tag} has no sm_{g['sm'].replace('.', '')} kernels for the {g['name']}")
    return why


def _nearest_torch(data: dict, gpus: list[dict], driver: str, policy: str, python: str) -> str:
    """The newest torch release with a variant that serves these GPUs, driver and Python ('' if none)."""
    for minor in sorted(data["torch"], key=vtuple, reverse=True):
        row = data["torch"][minor]
        if python and not _python_fits(row, python):
            continue
        for tag in _ordered_variants(row):
            if not _variant_fits(data, row, tag, gpus, driver, policy):
                return f"torch {row.get('latest', minor)} ({tag})"
    return ""


def _ordered_variants(row: dict) -> list[str]:
    """The builds "auto" may choose, best first: the release's default (its PyPI build), then stable, then legacy."""
    by_role = {r: [t for t, v in row["variants"].items() if v.get("role") == r] for r in AUTO_ROLES}
    ordered = [t for r in AUTO_ROLES for t in sorted(by_role[r], key=vtuple, reverse=True)]
    default = row.get("default")
    return ([default] if default in ordered else []) + [t for t in ordered if t != default]


def _python_range(row: dict) -> tuple[str, str]:
    """(lowest, highest) Python of a release; '' where the data has none (a planned release)."""
    lo, hi, *_ = [*(row.get("python") or []), "", ""]
    return str(lo), str(hi)


def _python_fits(row: dict, python: str) -> bool:
    lo, hi = _python_range(row)
    return (not lo or vtuple(python) >= vtuple(lo)) and (not hi or vtuple(python) <= vtuple(hi))


def node_plan(
    os: dict | None = None,
    gpus: Any = None,
    driver: dict | None = None,
    torch: dict | None = None,
    cuda: dict | None = None,
    overrides: Any = None,
    enforce_os: bool = True,
) -> dict:
    """Decide torch's variant, then the driver branch and flavour, CUDA, cuDNN and NCCL, for one node.

    os:     {distribution, major, family}                  (Ansible's distribution facts)
    gpus:   PCI device ids of the node's NVIDIA GPUs       (['0x2330', ...])
    driver: {enabled, source, branch, version, open, installed}
            source auto|distro|nvidia; branch/version '' = default; open auto|true|false; installed: the
            running or installed driver version ('' on a fresh node)
    torch:  {enabled, version, cuda, policy, python, python_version}
            cuda auto|cpu|cu130|13.0; python: the interpreter name ('' = the OS's training Python);
            python_version: its X.Y when probed ('' = from the name or the OS row)
    cuda:   {enabled, version, source, toolkit}            version '' = follow torch's variant; source
            pip|distro|nvidia (distro: the OS's own toolkit version, which must share torch's major)
    enforce_os: False lets an OS outside the data borrow its family's row (with a warning).
    """
    os, driver, torch, cuda = dict(os or {}), dict(driver or {}), dict(torch or {}), dict(cuda or {})
    errors: list[str] = []
    warnings: list[str] = []
    plan: dict[str, Any] = {"ok": False, "errors": errors, "warnings": warnings}
    try:
        data = load(overrides)
    except (ValueError, TypeError, KeyError) as exc:
        errors.append(f"gpunode_platform_overrides: {exc}")
        return plan

    # The OS row: supported or refused with why, the training Python, the distro's driver.
    key = os_key(os.get("distribution", ""), os.get("major", ""))
    os_row = data["os"].get(key)
    plan["os"] = {"key": key, "supported": bool(os_row and os_row.get("supported"))}
    if not (os_row and os_row.get("supported")):
        why = (
            f"{key} is not supported: {os_row.get('why', '')}"
            if os_row
            else (f"{key} is not a supported OS (supported: {', '.join(supported_os(data))})")
        )
        borrowed = data["os_family_fallback"].get(str(os.get("family", "")))
        if enforce_os or not borrowed:
            errors.append(why + ("" if enforce_os else "; no row of its OS family to borrow"))
            return plan
        warnings.append(
            f"{why}; trying anyway with the {borrowed} row (gpunode_base_enforce_supported_os: false)"
        )
        os_row = data["os"][borrowed]
    family = os_row["family"]

    # GPUs on the PCI bus.
    found = [gpu(data, d) for d in (gpus or [])]
    plan["gpus"] = found
    unknown = sorted({g["id"] for g in found if not g["sm"]})
    if unknown:
        warnings.append(
            f"GPU PCI id(s) {', '.join(unknown)} not in the platform data: their architecture is not checked "
            "(add them under gpus in gpunode_platform_overrides)"
        )
    sms = sorted({g["sm"] for g in found if g["sm"]}, key=vtuple)

    # Driver: source, branch, version; the branch each GPU needs.
    drv_on = bool(driver.get("enabled", True))
    source = str(driver.get("source") or "auto")
    if source == "auto":
        source = os_row.get("driver_source_default", "nvidia")
    if drv_on and source == "distro" and not os_row.get("distro_driver_branch"):
        errors.append(f"{key} has no distro NVIDIA driver: set gpunode_driver_source: nvidia")
    branch = str(driver.get("branch") or "")
    if not branch:
        branch = str(
            os_row.get("distro_driver_branch") if source == "distro" else data["defaults"]["driver_branch"]
        )
    version = str(driver.get("version") or "")
    installed = str(driver.get("installed") or "")
    only = [str(b) for b in os_row.get("distro_driver_branches") or []]
    if drv_on and source == "distro" and only and branch not in only:
        errors.append(
            f"{key}'s archive ships only the {', '.join(only)} driver branch, not {branch}: "
            "set gpunode_driver_source: nvidia for NVIDIA's repository"
        )
    for g in found:
        arch = data["archs"].get(g["arch"], {})
        lo, hi = arch.get("min_branch", ""), arch.get("max_branch", "")
        if drv_on and lo and vtuple(branch) < vtuple(lo):
            errors.append(
                f"the {g['name']} ({arch.get('name')}) needs driver branch >= {lo}, not {branch}: "
                + (
                    f"set gpunode_driver_source: nvidia and gpunode_driver_branch: {data['defaults']['driver_branch']}"
                    if source == "distro"
                    else f"set gpunode_driver_branch: {data['defaults']['driver_branch']}"
                )
            )
        if drv_on and hi and vtuple(branch) > vtuple(hi):
            errors.append(
                f"the {g['name']} ({arch.get('name')}) is supported up to driver branch {hi}, not {branch}: "
                f"set gpunode_driver_branch: {hi}"
            )
    errors[:] = list(dict.fromkeys(errors))

    # Kernel-module flavour: open or proprietary, from the GPUs, the branch and the source.
    wanted_open = str(driver.get("open", "auto")).strip().lower()
    needs_open = [g for g in found if data["archs"].get(g["arch"], {}).get("open") == "required"]
    no_open = [g for g in found if data["archs"].get(g["arch"], {}).get("open") == "unsupported"]
    if wanted_open == "auto":
        if needs_open:
            flavour, why = "open", f"{needs_open[0]['name']} needs NVIDIA's open kernel modules"
        elif no_open:
            flavour, why = "proprietary", f"{no_open[0]['name']} is not supported by the open kernel modules"
        elif vtuple(branch) >= vtuple(data["defaults"]["open_default_from_branch"]):
            flavour, why = (
                "open",
                f"NVIDIA's default from branch {data['defaults']['open_default_from_branch']}",
            )
        else:
            flavour, why = "proprietary", f"branch {branch} predates NVIDIA's open-module default"
    elif wanted_open in ("true", "yes", "1", "on"):
        flavour, why = "open", "gpunode_driver_open_kernel_modules is true"
    elif wanted_open in ("false", "no", "0", "off"):
        flavour, why = "proprietary", "gpunode_driver_open_kernel_modules is false"
    else:
        errors.append(
            f"gpunode_driver_open_kernel_modules must be auto, true or false, not {driver.get('open')!r}"
        )
        flavour, why = "proprietary", ""
    if needs_open and no_open:
        errors.append(
            f"{needs_open[0]['name']} needs the open kernel modules and {no_open[0]['name']} cannot use them: "
            "one driver cannot serve both; split these GPUs across nodes"
        )
    elif drv_on and flavour == "proprietary" and needs_open:
        errors.append(
            f"the {needs_open[0]['name']} works only with NVIDIA's open kernel modules: "
            "set gpunode_driver_open_kernel_modules: auto (or true)"
        )
    elif drv_on and flavour == "open" and no_open:
        errors.append(
            f"the {no_open[0]['name']} is not supported by NVIDIA's open kernel modules: "
            "set gpunode_driver_open_kernel_modules: auto (or false)"
        )
    if drv_on and flavour == "open" and source == "distro" and not os_row.get("distro_open_modules"):
        errors.append(
            f"{key}'s archive has no open kernel modules at the driver's version "
            f"({os_row.get('distro_open_modules_why', '')}): set gpunode_driver_source: nvidia, "
            "or gpunode_driver_open_kernel_modules: false where the GPUs allow it"
        )
    # What torch's CUDA build is judged against: the running driver, else what the role will install.
    judged = (version or branch) if drv_on else installed
    plan["driver"] = {
        "enabled": drv_on,
        "source": source,
        "branch": branch,
        "version": version,
        "open": flavour == "open",
        "flavour": flavour,
        "flavour_reason": why,
        "judged": judged,
    }

    # Training Python.
    pyname = str(torch.get("python") or os_row["python"]["name"])
    pyver = str(torch.get("python_version") or python_version(pyname))
    if not pyver and pyname == os_row["python"]["name"]:
        pyver = os_row["python"]["version"]
    plan["python"] = {
        "name": pyname,
        "version": pyver,
        "packages": list(os_row["python"]["packages"]) if pyname == os_row["python"]["name"] else [],
    }

    # torch: release row, Python range, the variant.
    torch_on = bool(torch.get("enabled", True))
    tver = str(torch.get("version") or data["defaults"]["torch"])
    policy = str(torch.get("policy") or "compat")
    if policy not in POLICIES:
        errors.append(f"gpunode_pytorch_driver_policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        return plan
    try:
        minor = torch_minor(tver)
    except ValueError as exc:
        errors.append(str(exc))
        return plan
    row = data["torch"].get(minor)
    if row is None:
        errors.append(
            f"torch {tver} is not in the platform data (known: {', '.join(sorted(data['torch'], key=vtuple))}); "
            "add its row under torch in gpunode_platform_overrides, with its source"
        )
        return plan
    if row.get("status") == "planned":
        warnings.append(
            f"torch {minor} is planned, not confirmed released, in the platform data ({row['source'].get('status', '')})"
        )
    if torch_on and pyver and not _python_fits(row, pyver):
        lo, hi = _python_range(row)
        errors.append(
            f"torch {tver} supports Python {lo} to {hi}, and the training Python {pyname} is {pyver}: "
            f"set gpunode_pytorch_python to an interpreter in that range (on {key}: {os_row['python']['name']})"
            if pyname != os_row["python"]["name"]
            else f"torch {tver} supports Python {lo} to {hi}, and {key}'s {pyname} is {pyver}"
        )
    wish = str(torch.get("cuda") or "auto").strip().lower()
    if wish == "auto":
        if not found:
            errors.append(
                "no NVIDIA GPU on the PCI bus, so no CUDA build can be chosen: set gpunode_pytorch_cuda: cpu "
                "for a CPU node, or name the build (e.g. cu130)"
            )
            return plan
        fits = {t: _variant_fits(data, row, t, found, judged, policy) for t in _ordered_variants(row)}
        usable = [t for t, why_not in fits.items() if not why_not]
        if not usable:
            near = _nearest_torch(data, found, judged, policy, pyver)
            errors.append(
                f"no CUDA build of torch {tver} serves this node ("
                + "; ".join(w for ws in fits.values() for w in ws)
                + ")"
                + (
                    f": nearest working choice {near}"
                    if near
                    else ": upgrade the driver (gpunode_driver_branch)"
                )
            )
            return plan
        tag = usable[0]
    else:
        try:
            tag = cuda_tag(wish)
        except ValueError as exc:
            errors.append(str(exc))
            return plan
        if tag != CPU:
            if tag not in row["variants"]:
                known = ", ".join(sorted(row["variants"], key=vtuple))
                errors.append(f"torch {tver} has no {tag} build; its CUDA builds are {known} (or cpu)")
                return plan
            for why_not in _variant_fits(data, row, tag, found, judged, policy):
                near = [
                    t
                    for t in _ordered_variants(row)
                    if not _variant_fits(data, row, t, found, judged, policy)
                ]
                errors.append(
                    f"torch {tver} {why_not}"
                    + (f": nearest working choice gpunode_pytorch_cuda: {near[0]}" if near else "")
                    + (" (or a newer driver branch)" if "driver" in why_not else "")
                )
    cuda_ver = cuda_normalize(tag)
    companions = row.get("companions", {})
    plan["torch"] = {
        "enabled": torch_on,
        "version": tver,
        "minor": minor,
        "tag": tag,
        "cuda": cuda_ver,
        "role": row["variants"].get(tag, {}).get("role", "cpu" if tag == CPU else ""),
        "python": list(row.get("python", [])),
        "min_driver": min_driver(data, cuda_ver, policy),
        "torchvision": companions.get("torchvision", ""),
        "torchaudio": companions.get("torchaudio", ""),
        "source": row.get("source", ""),
    }

    # CUDA toolkit, cuDNN and NCCL follow torch's CUDA major.
    cuda_on = bool(cuda.get("enabled", True))
    try:
        want = cuda_normalize(cuda.get("version") or "")
    except ValueError as exc:
        errors.append(f"gpunode_cuda_version: {exc} (major.minor such as 13.0, or empty to follow torch)")
        return plan
    if want in ("", CPU):
        want = cuda_ver if cuda_ver != CPU else ""
    major = want.partition(".")[0] if want else ""
    if cuda_on and want and cuda_ver not in (CPU, "") and major != cuda_ver.partition(".")[0]:
        errors.append(
            f"gpunode_cuda_version {want} is CUDA {major}, but torch {tver} is the {tag} build (CUDA "
            f"{cuda_ver.partition('.')[0]}): cuDNN and NCCL must match torch's CUDA major; leave gpunode_cuda_version "
            f"empty to follow torch, or set gpunode_pytorch_cuda to a CUDA {major} build"
        )
    if cuda_on and not want:
        errors.append(
            "gpunode_cuda_version is empty and torch is a CPU build, so there is no CUDA version to follow: "
            "set gpunode_cuda_version, or gpunode_cuda_enabled: false"
        )
    if cuda_on and str(cuda.get("source") or "") == "distro" and cuda.get("toolkit", True):
        distro = str(os_row.get("distro_cuda_toolkit") or "")
        if not distro:
            errors.append(
                f"the platform data names no distro CUDA toolkit for {key}: set gpunode_cuda_source: nvidia or pip"
            )
        elif cuda_ver not in (CPU, "") and distro.partition(".")[0] != cuda_ver.partition(".")[0]:
            errors.append(
                f"{key}'s archive ships CUDA toolkit {distro}, but torch {tver} is the {tag} build: "
                "set gpunode_cuda_source: pip (torch brings its own CUDA libraries) or nvidia "
                f"(NVIDIA's cuda-toolkit-{cuda_ver.replace('.', '-')})"
            )
        else:
            want, major = distro, distro.partition(".")[0]
    maj_row = data["cuda_major"].get(major, {})
    libs = row.get("libraries", {}).get(f"cu{major}", {})
    if (
        cuda_on
        and want
        and drv_on
        and maj_row
        and not driver_satisfies(judged, min_driver(data, want, policy))
    ):
        errors.append(
            f"CUDA {want} needs driver >= {min_driver(data, want, policy)}; the driver is {judged}: "
            "raise gpunode_driver_branch or lower gpunode_cuda_version"
        )
    plan["cuda"] = {
        "enabled": cuda_on,
        "version": want,
        "major": major,
        "wheel_suffix": f"cu{major}" if major else "",
        "cudnn": str(libs.get("cudnn", "")),
        "nccl": str(libs.get("nccl", "")),
        "min_driver": min_driver(data, want, policy) if want else "",
    }
    plan["sm"] = sms
    plan["os"].update({"family": family, "python": os_row["python"]["name"]})
    errors[:] = list(dict.fromkeys(errors))
    plan["ok"] = not errors
    return plan


def supported_os(data: dict) -> list[str]:
    return [k for k, v in data["os"].items() if v.get("supported")]


def os_row_for(data: dict, os_id: Any, version_id: Any) -> tuple[str, dict | None]:
    """os-release ID and VERSION_ID ('debian', '12' / 'ubuntu', '24.04') -> ('Debian 12', its row or None)."""
    dist = data["os_release_ids"].get(str(os_id or "").lower(), "")
    major = str(version_id or "").partition(".")[0]
    key = os_key(dist, major)
    return key, data["os"].get(key) if dist else None


def default_branch(data: dict, os_row: dict | None) -> tuple[str, str]:
    """(branch, source) the roles install by default on this OS."""
    if os_row and os_row.get("driver_source_default") == "distro" and os_row.get("distro_driver_branch"):
        return str(os_row["distro_driver_branch"]), "distro"
    return str(data["defaults"]["driver_branch"]), "nvidia"


def index_for(data: dict, driver: Any = "", sm: list[str] | None = None, policy: str = "compat") -> str:
    """The torch index (cu130, cu126, ...) of the default torch release that a driver and these GPUs can run.

    driver: a driver version ('580.95.05') or a bare branch ('535'); '' when unknown (any driver).
    '' when no variant fits (the fix is then the driver, not the index).
    """
    row = data["torch"][torch_minor(data["defaults"]["torch"])]
    gpus = [{"sm": s_, "name": f"sm_{s_}"} for s_ in (sm or [])]
    for tag in _ordered_variants(row):
        if not _variant_fits(data, row, tag, gpus, str(driver or ""), policy):
            return tag
    return ""
