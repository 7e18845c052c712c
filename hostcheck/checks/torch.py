"""torch checks, judged from the probe run in the training Python: install, CUDA build vs driver, arch
coverage, cuda.is_available(), cuDNN/NCCL, and the versions the roles intended."""

from __future__ import annotations

import re
from typing import Any

from hostcheck import fixes, platform
from hostcheck.checks.tuning import probe_unavailable
from hostcheck.gather.base import CRASHED
from hostcheck.registry import Outcome, check, errored, failed, passed, skipped, warned


def _probe_problem(s: Any) -> Outcome | None:
    early = probe_unavailable(s)
    if early is None and not s.torch.torch_installed:
        return skipped(f"torch not installed in {s.torch.python} (see torch.E001)")
    return early


def _cuda_torch_problem(s: Any) -> Outcome | None:
    """A skip unless the training Python has a CUDA build of torch (checks that only mean something then)."""
    early = _probe_problem(s)
    if early is None and not s.torch.torch.get("cuda"):
        return skipped("CPU-only torch (see torch.E002)")
    return early


def driver_cuda(s: Any) -> tuple[int, int] | None:
    n = s.nvml
    if n is None or not n.ok or not isinstance(n.cuda_driver_version, int) or n.cuda_driver_version <= 0:
        return None
    v = n.cuda_driver_version
    return v // 1000, (v % 1000) // 10


def parse_version(v: Any) -> tuple[int, ...] | None:
    if not isinstance(v, str):
        return None
    m = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", v)
    return tuple(int(x) for x in m.groups() if x is not None) if m else None


def _gpu_sms(s: Any) -> list[str]:
    n = s.nvml
    if n is None or not n.ok:
        return []
    return sorted({f"{c[0]}.{c[1]}" for g in n.gpus if isinstance(c := g.compute_capability, tuple)})


def suggested_index(s: Any) -> str:
    """The torch index the platform data gives this node: its GPUs and its driver (or, with none loaded, the
    branch the roles install on this OS by default)."""
    data = platform.load()
    n = s.nvml
    driver = n.driver_version if n is not None and n.ok and isinstance(n.driver_version, str) else ""
    if not driver:
        driver = platform.default_branch(data, _os_row(data, s))[0]
    sms = _gpu_sms(s)
    return platform.index_for(data, driver, sms) or platform.index_for(data, "", sms) or "cpu"


def _os_row(data: dict, s: Any) -> dict | None:
    """This node's OS row of the platform data (None when the OS, or the system gatherer's answer, is unknown)."""
    sysm = s.system
    return platform.os_row_for(data, sysm.os_id, sysm.os_version)[1] if sysm is not None else None


def _driver_fix(s: Any) -> str:
    data = platform.load()
    row = _os_row(data, s)
    archs = [a for a in data["archs"].values() if set(_gpu_sms(s)) & set(a.get("sm", []))]
    newest = platform.branch_to_move_to(data, archs) or data["defaults"]["driver_branch"]
    extra = "gpunode_driver_source: nvidia and " if platform.default_branch(data, row)[1] == "distro" else ""
    return fixes.role_fix(f"{extra}gpunode_driver_branch: {newest}", fixes.DRIVER, "driver")


# The hints name a torch index: it comes from the driver (nvml) or the OS's default branch (system).
@check(
    "torch.E001",
    "torch installed in the training Python",
    weight=10,
    needs=("torch", "facts", "nvml", "system"),
)
def torch_installed(s: Any) -> Outcome:
    t = s.torch
    if t is None:
        return errored("the training Python was not probed (the torch gatherer did not run)")
    if t.error is not None:
        hint = "pass --python PATH to the training venv's python, or " + fixes.rerun(fixes.PYTORCH, "pytorch")
        if t.error.kind == CRASHED:
            return errored(
                t.error.reason, hint="hostcheck's own gathering failed: run with --debug and report it"
            )
        if t.error.kind == "timeout":
            first = "check dmesg for NVRM/Xid errors; " if "CUDA init" in t.error.reason else ""
            return errored(t.error.reason, hint=first + hint)
        return failed(t.error.reason, hint=hint)
    info = t.torch
    where = f"{t.python} ({t.python_source})"
    error = str(info.get("error") or "")
    # An older probe filed every ImportError (an undefined symbol too) under "not installed": only a missing
    # torch module itself is that.
    if not info.get("installed") and (not error or "No module named 'torch'" in error):
        return failed(
            f"torch is not installed in {where}",
            hint=fixes.PYTORCH_INSTALL.format(index=suggested_index(s))
            + "; or pass --python PATH if the training venv is elsewhere",
        )
    if "version" not in info:
        return failed(
            f"torch is installed in {where} but does not import: {error or '?'}"[:600],
            hint=fixes.PYTORCH_INSTALL.format(index=suggested_index(s)),
        )
    return passed(
        f"torch {info['version']} in {where}, import {info.get('import_s', 0):.1f} s",
        value=info["version"],
    )


@check("torch.E002", "torch CUDA build vs driver CUDA", weight=10, needs=("torch", "nvml", "system"))
def torch_cuda_vs_driver(s: Any) -> Outcome:
    early = _probe_problem(s)
    if early:
        return early
    cuda = s.torch.torch.get("cuda")
    d = driver_cuda(s)
    if not cuda:
        return failed(
            f"torch {s.torch.torch.get('version')} is a CPU-only build (torch.version.cuda is None)",
            value=None,
            expected=f"CUDA <= {d[0]}.{d[1]}" if d else "a CUDA build",
            hint=fixes.PYTORCH_INSTALL.format(index=suggested_index(s)),
        )
    if d is None:
        return skipped(f"torch built for CUDA {cuda}; the driver's CUDA version is unknown (no NVML)")
    tv = parse_version(cuda) or (0, 0)
    tmaj, tmin = tv[0], (tv[1] if len(tv) > 1 else 0)
    kw: dict[str, Any] = {"value": cuda, "expected": f"<= {d[0]}.{d[1]} (driver)"}
    if tmaj > d[0]:
        return failed(
            f"driver too old: torch needs CUDA {cuda}, the driver supports CUDA {d[0]}.{d[1]}",
            hint=_driver_fix(s)
            + f" (a newer driver), or install a torch built for it: gpunode_pytorch_index: {suggested_index(s)}",
            **kw,
        )
    if (tmaj, tmin) > d:
        return warned(
            f"torch CUDA {cuda} is newer than the driver's {d[0]}.{d[1]}: runs by minor-version compatibility, "
            "but PTX JIT and some features fail",
            hint=fixes.role_fix(f"gpunode_pytorch_index: {suggested_index(s)}", fixes.PYTORCH, "pytorch")
            + ", or upgrade the driver (role gpunode_driver)",
            **kw,
        )
    return passed(f"torch CUDA {cuda} <= driver CUDA {d[0]}.{d[1]}", **kw)


_ARCH_RE = re.compile(r"^(sm|compute)_(\d+)(\d)([a-z]?)$")


def arch_covered(cap: tuple[int, int], arch_list: list[str]) -> tuple[str, str]:
    """('sass'|'ptx'|'none', which entry). SASS runs on the same major with an equal or higher minor;
    'a'/'f' (arch-specific) SASS only on its exact arch; PTX JIT-compiles for any later arch."""
    best = ("none", "")
    for entry in arch_list:
        m = _ARCH_RE.match(entry)
        if not m:
            continue
        kind, major, minor, suffix = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        if kind == "sm":
            exact = (major, minor) == cap
            if exact or (not suffix and major == cap[0] and minor <= cap[1]):
                return "sass", entry
        elif (major, minor) <= cap and not suffix:
            best = ("ptx", entry)
    return best


@check(
    "torch.E003",
    "GPU compute capability in torch's arch list",
    weight=8,
    needs=("torch", "nvml", "system"),
)
def arch_list(s: Any) -> Outcome:
    early = _cuda_torch_problem(s)
    if early:
        return early
    info = s.torch.torch
    caps: list[tuple[int, int]] = []
    if s.nvml is not None and s.nvml.ok:
        caps = [g.compute_capability for g in s.nvml.gpus if isinstance(g.compute_capability, tuple)]
    if not caps:
        caps = [tuple(c) for c in info.get("capabilities") or []]
    if not caps:
        return skipped("no GPU to compare")
    archs = list(info.get("arch_list") or [])
    missing, ptx = [], []
    for cap in sorted(set(caps)):
        kind, entry = arch_covered(cap, archs)
        if kind == "none":
            missing.append(f"sm_{cap[0]}{cap[1]}")
        elif kind == "ptx":
            ptx.append(f"sm_{cap[0]}{cap[1]} via {entry}")
    kw: dict[str, Any] = {
        "value": ", ".join(f"sm_{c[0]}{c[1]}" for c in sorted(set(caps))),
        "expected": " ".join(archs),
    }
    if missing:
        return failed(
            f"torch {info.get('version')} has no kernels for {', '.join(missing)} (arch list: {' '.join(archs)})",
            hint=fixes.PYTORCH_INSTALL.format(index=suggested_index(s)) + " (a build that covers this GPU)",
            **kw,
        )
    if ptx:
        return warned(
            f"only PTX for {', '.join(ptx)}: JIT compile at start-up, slower kernels",
            hint=fixes.PYTORCH_INSTALL.format(index=suggested_index(s)),
            **kw,
        )
    return passed(f"{kw['value']} covered by torch's arch list", **kw)


@check("torch.E004", "torch.cuda.is_available()", weight=10, needs=("torch", "nvml", "system"))
def cuda_available(s: Any) -> Outcome:
    early = _probe_problem(s)
    if early:
        return early
    info = s.torch.torch
    nv = (
        s.nvml.device_count
        if s.nvml is not None and s.nvml.ok and isinstance(s.nvml.device_count, int)
        else None
    )
    if not info.get("cuda_available"):
        why = (
            info.get("cuda_error")
            or "; ".join(info.get("warnings") or [])
            or ("CPU-only build" if not info.get("cuda") else "no usable GPU/driver")
        )
        return failed(
            f"torch.cuda.is_available() is False: {why[:300]}",
            value=False,
            expected=True,
            hint="fix gpu.E001/torch.E002 first; "
            + fixes.PYTORCH_INSTALL.format(index=suggested_index(s))
            + "; check CUDA_VISIBLE_DEVICES in the training environment",
        )
    count = int(info.get("device_count") or 0)
    if nv is not None and count != nv:
        cvd = s.torch.env.get("CUDA_VISIBLE_DEVICES")
        return warned(
            f"torch sees {count} GPU(s), NVML {nv}"
            + (f" (CUDA_VISIBLE_DEVICES={cvd})" if cvd is not None else ""),
            value=count,
            expected=nv,
            hint="unset CUDA_VISIBLE_DEVICES in /etc/gpunode/training.env, or check dmesg for a GPU that failed "
            "CUDA init",
        )
    return passed(
        f"CUDA available, {count} device(s), init {info.get('cuda_init_s', 0):.1f} s",
        value=True,
        expected=True,
    )


@check("torch.E005", "cuDNN and NCCL in torch", weight=3, needs=("torch", "nvml", "system"))
def cudnn_nccl(s: Any) -> Outcome:
    early = _cuda_torch_problem(s)
    if early:
        return early
    info = s.torch.torch
    cudnn, nccl = info.get("cudnn"), info.get("nccl")
    value = f"cuDNN {cudnn or 'none'}, NCCL {nccl or 'none'}"
    n = len(s.nvml.gpus) if s.nvml is not None and s.nvml.ok else 0
    hint = fixes.PYTORCH_INSTALL.format(index=suggested_index(s)) + " (the wheel bundles cuDNN and NCCL)"
    if not nccl and n > 1:
        return failed(f"{value}: multi-GPU training needs NCCL", value=value, hint=hint)
    if not cudnn or not nccl:
        return warned(value, value=value, hint=hint)
    return passed(value, value=value)


@check("torch.E006", "Versions match the roles' intent (local facts)", weight=2, needs=("torch", "facts"))
def versions_vs_facts(s: Any) -> Outcome:
    early = _probe_problem(s)
    if early:
        return early
    pf = s.facts.roles.get("gpunode_pytorch")
    if not pf:
        return skipped(f"no {s.facts.directory}/gpunode_pytorch.fact to compare with")
    info = s.torch.torch
    diffs = []
    want_torch = pf.get("torch")
    have = str(info.get("version") or "")
    if want_torch and have.split("+", 1)[0] != str(want_torch).split("+", 1)[0]:
        diffs.append(f"torch {have} (fact {want_torch})")
    want_cuda = pf.get("cuda")
    if want_cuda and str(info.get("cuda") or "none") != str(want_cuda):
        diffs.append(f"CUDA {info.get('cuda')} (fact {want_cuda})")
    if diffs:
        return failed(
            "installed differs from what gpunode_pytorch recorded: " + "; ".join(diffs),
            value=have,
            expected=want_torch,
            hint="something reinstalled torch after provisioning: " + fixes.rerun(fixes.PYTORCH, "pytorch"),
        )
    return passed(f"torch {have}, CUDA {info.get('cuda')} as recorded", value=have, expected=want_torch)
