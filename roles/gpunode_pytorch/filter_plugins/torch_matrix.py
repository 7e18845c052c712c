"""Compatibility logic for gpunode_pytorch: torch release x CUDA wheel tag x NVIDIA driver.

Pure functions (no Ansible imports needed to test them); the FilterModule at the end exposes them.

Sources for the tables (keep the citations when you edit a row):
- CUDA -> minimum Linux x86_64 driver: NVIDIA CUDA Toolkit Release Notes,
  https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/ ("CUDA Toolkit and Corresponding Driver
  Versions", Table 3: the driver shipped with each toolkit GA release) and the "minor version
  compatibility" table (Table 2: the oldest driver a CUDA major release runs on: 11.x >= 450.80.02,
  12.x >= 525.60.13, 13.x >= 580.65.06).
- torch release -> CUDA wheel tags on https://download.pytorch.org/whl/<tag>:
  https://github.com/pytorch/pytorch/blob/main/RELEASE.md#release-compatibility-matrix and
  https://pytorch.org/get-started/previous-versions/ .
"""

from __future__ import annotations

import re

# CUDA minor release -> (pip index tag, min driver for the toolkit GA (Table 3), min driver under
# minor-version compatibility (Table 2)).
CUDA_TABLE = {
    "11.8": {"tag": "cu118", "min_driver": "520.61.05", "min_driver_compat": "450.80.02"},
    "12.1": {"tag": "cu121", "min_driver": "530.30.02", "min_driver_compat": "525.60.13"},
    "12.4": {"tag": "cu124", "min_driver": "550.54.14", "min_driver_compat": "525.60.13"},
    "12.6": {"tag": "cu126", "min_driver": "560.28.03", "min_driver_compat": "525.60.13"},
    "12.8": {"tag": "cu128", "min_driver": "570.26", "min_driver_compat": "525.60.13"},
    "12.9": {"tag": "cu129", "min_driver": "575.51.03", "min_driver_compat": "525.60.13"},
    "13.0": {"tag": "cu130", "min_driver": "580.65.06", "min_driver_compat": "580.65.06"},
}

# torch minor release -> CUDA versions with wheels on download.pytorch.org (RELEASE.md matrix).
# 2.12 and 2.13 follow the 2.10/2.11 pattern (CUDA 12.6 / 12.8 / 13.0); extend or correct rows from a
# playbook with gpunode_pytorch_matrix_overrides instead of editing the code.
TORCH_TABLE = {
    "2.0": ["11.8"],
    "2.1": ["11.8", "12.1"],
    "2.2": ["11.8", "12.1"],
    "2.3": ["11.8", "12.1"],
    "2.4": ["11.8", "12.1", "12.4"],
    "2.5": ["11.8", "12.1", "12.4"],
    "2.6": ["11.8", "12.4", "12.6"],
    "2.7": ["11.8", "12.6", "12.8"],
    "2.8": ["12.6", "12.8", "12.9"],
    "2.9": ["12.6", "12.8", "13.0"],
    "2.10": ["12.6", "12.8", "13.0"],
    "2.11": ["12.6", "12.8", "13.0"],
    "2.12": ["12.6", "12.8", "13.0"],
    "2.13": ["12.6", "12.8", "13.0"],
}

CPU = "cpu"
POLICIES = ("compat", "toolkit")


def _vtuple(version) -> tuple:
    """'580.65.06' -> (580, 65, 6); anything without digits -> ()."""
    return tuple(int(p) for p in re.findall(r"\d+", str(version or "")))


def torch_minor(torch_version) -> str:
    """'2.13.0' / '2.13.0+cu130' / '2.13' -> '2.13'."""
    m = re.match(r"^\s*(\d+)\.(\d+)", str(torch_version or ""))
    if not m:
        raise ValueError(f"not a torch version: {torch_version!r}")
    return f"{int(m.group(1))}.{int(m.group(2))}"


def cuda_normalize(cuda) -> str:
    """Accepts '12.8', '12.8.1', 'cu128', 'CU128', 128, 'cpu' -> '12.8' or 'cpu'."""
    text = str(cuda if cuda is not None else "").strip().lower()
    if text in ("cpu", "none", ""):
        return CPU if text != "" else ""
    m = re.match(r"^cu(\d{2,3})$", text)
    if m:
        digits = m.group(1)
        return f"{int(digits[:-1])}.{int(digits[-1])}"
    m = re.match(r"^(\d+)\.(\d+)", text)
    if m:
        return f"{int(m.group(1))}.{int(m.group(2))}"
    raise ValueError(f"not a CUDA version: {cuda!r}")


def cuda_tag(cuda) -> str:
    """'12.8' -> 'cu128'; 'cpu' -> 'cpu'."""
    norm = cuda_normalize(cuda)
    if norm == CPU:
        return CPU
    if norm in CUDA_TABLE:
        return CUDA_TABLE[norm]["tag"]
    major, minor = norm.split(".")
    return f"cu{major}{minor}"


def min_driver(cuda, policy: str = "compat") -> str:
    """Minimum Linux driver for a CUDA version ('' for cpu or an unknown version)."""
    norm = cuda_normalize(cuda)
    row = CUDA_TABLE.get(norm)
    if row is None:
        return ""
    return row["min_driver_compat" if policy == "compat" else "min_driver"]


def driver_satisfies(driver_version, required) -> bool:
    return _vtuple(driver_version) >= _vtuple(required)


def companion_versions(torch_version) -> dict:
    """torch 2.M.P -> torchvision 0.(M+15).P and torchaudio 2.M.P (the pairing since torch 2.0)."""
    m = re.match(r"^\s*2\.(\d+)(?:\.(\d+))?", str(torch_version))
    if not m:
        return {"torchvision": "", "torchaudio": ""}
    minor, patch = int(m.group(1)), int(m.group(2) or 0)
    return {"torchvision": f"0.{minor + 15}.{patch}", "torchaudio": f"2.{minor}.{patch}"}


def _merged_table(overrides) -> dict:
    table = {k: list(v) for k, v in TORCH_TABLE.items()}
    for key, cudas in (overrides or {}).items():
        table[torch_minor(key)] = [cuda_normalize(c) for c in cudas]
    return table


def supported_cuda(torch_version, overrides=None) -> list:
    return list(_merged_table(overrides).get(torch_minor(torch_version), []))


def torch_plan(
    torch_version,
    cuda="auto",
    driver_version="",
    policy="compat",
    overrides=None,
    index_url="https://download.pytorch.org/whl",
    local_label=True,
) -> dict:
    """Decide what to install; never raises for bad input: problems go to 'errors' with the reason.

    Returns {ok, errors[], torch, torch_minor, cuda ('12.8' or 'cpu'), tag, index_url, requirement,
    min_driver, driver, supported_cuda[]}.
    """
    errors = []
    plan = {
        "ok": False,
        "errors": errors,
        "torch": str(torch_version),
        "cuda": "",
        "tag": "",
        "index_url": "",
        "requirement": "",
        "min_driver": "",
        "driver": str(driver_version or ""),
        "supported_cuda": [],
        "policy": policy,
    }
    if policy not in POLICIES:
        errors.append(f"gpunode_pytorch_driver_policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        return plan
    try:
        minor = torch_minor(torch_version)
        table = _merged_table(overrides)
    except ValueError as exc:
        errors.append(str(exc))
        return plan
    plan["torch_minor"] = minor
    if minor not in table:
        errors.append(
            f"torch {torch_version} is not in the compatibility table (known: "
            f"{', '.join(sorted(table, key=_vtuple))}); add it with gpunode_pytorch_matrix_overrides"
        )
        return plan
    supported = table[minor]
    plan["supported_cuda"] = list(supported)

    wanted = str(cuda if cuda is not None else "auto").strip().lower()
    if wanted in ("", "auto"):
        # Newest CUDA this torch has wheels for that the driver can run (newest overall without a driver).
        usable = [
            c
            for c in supported
            if not driver_version or driver_satisfies(driver_version, min_driver(c, policy))
        ]
        if not usable:
            errors.append(
                f"driver {driver_version} is too old for every CUDA build of torch {torch_version} "
                f"({', '.join(f'{c} needs >= {min_driver(c, policy)}' for c in supported)}); "
                "upgrade the driver or pin an older torch"
            )
            return plan
        norm = sorted(usable, key=_vtuple)[-1]
    else:
        try:
            norm = cuda_normalize(wanted)
        except ValueError as exc:
            errors.append(str(exc))
            return plan

    plan["cuda"] = norm
    plan["tag"] = cuda_tag(norm)
    if norm != CPU:
        if norm not in supported:
            errors.append(
                f"torch {torch_version} has no CUDA {norm} ({plan['tag']}) build; its CUDA builds are "
                f"{', '.join(cuda_tag(c) for c in supported)} (or cpu)"
            )
        if norm not in CUDA_TABLE:
            errors.append(f"CUDA {norm} is not in the driver table (known: {', '.join(CUDA_TABLE)})")
        else:
            plan["min_driver"] = min_driver(norm, policy)
            if driver_version and not driver_satisfies(driver_version, plan["min_driver"]):
                errors.append(
                    f"NVIDIA driver {driver_version} is older than {plan['min_driver']}, the minimum for "
                    f"CUDA {norm} ({policy} policy): torch would report cuda.is_available() == False. "
                    "Upgrade the driver (gpunode_driver_branch) or choose an older CUDA"
                )
    base = str(index_url or "").rstrip("/")
    plan["index_url"] = f"{base}/{plan['tag']}" if base else ""
    version = str(torch_version).split("+")[0]
    plan["requirement"] = f"torch=={version}+{plan['tag']}" if local_label else f"torch=={version}"
    plan["ok"] = not errors
    return plan


def torch_cuda_expected(plan) -> str:
    """What torch.version.cuda must print after install ('None' for a CPU build)."""
    return "None" if plan.get("cuda") == CPU else str(plan.get("cuda", ""))


class FilterModule:
    """gpunode_pytorch filters."""

    def filters(self):
        return {
            "gpunode_torch_plan": torch_plan,
            "gpunode_torch_companions": companion_versions,
            "gpunode_torch_cuda_expected": torch_cuda_expected,
            "gpunode_cuda_tag": cuda_tag,
            "gpunode_cuda_min_driver": min_driver,
            "gpunode_driver_satisfies": driver_satisfies,
        }
