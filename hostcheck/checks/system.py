"""System checks: OS, kernel headers for DKMS, the training Python's version, local facts, dataset storage."""

from __future__ import annotations

from typing import Any

from hostcheck import fixes, platform
from hostcheck.checks.gpu import _config
from hostcheck.gather.base import Unavailable
from hostcheck.gather.datapath import BlockDevice, ReadMeasure
from hostcheck.registry import Outcome, check, errored, failed, passed, skipped, warned


@check("system.E001", "Operating system supported by the roles", weight=1, needs=("system",))
def os_supported(s: Any) -> Outcome:
    """The roles' own table (hostcheck/data/platform.json, which gpunode_base's plan reads through the same
    hostcheck/platform.py): an OS the roles refuse (end of life, not yet supported) is said with their reason."""
    sysm = s.system
    name = sysm.os_pretty or f"{sysm.os_id} {sysm.os_version}"
    value = f"{name}, kernel {sysm.kernel}, {sysm.arch}"
    data = platform.load()
    key, row = platform.os_row_for(data, sysm.os_id, sysm.os_version)
    expected = ", ".join(platform.supported_os(data))
    if row and row.get("supported"):
        return passed(value, value=value, expected=expected)
    if row:  # a row the roles refuse, with why (an end of life and its date, per-OS facts not checked yet)
        why = str(row.get("why") or "not supported")
        return warned(
            f"{name}: the gpunode roles refuse {key}: {why}",
            value=value,
            expected=expected,
            hint=f"move the node to a supported OS ({expected}); docs/platform.md",
            brief=f"{key} refused by the roles",
        )
    return warned(
        f"{name} is not a distribution the gpunode roles support",
        value=value,
        expected=expected,
        hint="use a supported distribution (docs/platform.md); other ones may work but are untested",
        brief=f"{sysm.os_id} {sysm.os_version} not supported",
    )


@check("system.E002", "Kernel headers for the running kernel (DKMS)", weight=2, needs=("system",))
def kernel_headers(s: Any) -> Outcome:
    sysm = s.system
    if sysm.container:
        return skipped(f"in a {sysm.container} container: the host's kernel builds the driver")
    if sysm.kernel_build_dir:
        return passed(f"/lib/modules/{sysm.kernel}/build present", value=sysm.kernel)
    return warned(
        f"no /lib/modules/{sysm.kernel}/build: DKMS cannot rebuild the NVIDIA module after a kernel update",
        value=sysm.kernel,
        expected="headers installed",
        hint=f"install linux-headers-{sysm.kernel} (Debian/Ubuntu) or kernel-devel-{sysm.kernel} (EL), or "
        + fixes.rerun(fixes.DRIVER, "driver"),
    )


@check("system.E003", "Training Python version", weight=1, needs=("system", "torch"))
def python_version(s: Any) -> Outcome:
    t = s.torch
    if t is None or t.error is not None or "python" not in t.data:
        return skipped("training Python not probed (see torch.E001)")
    v = t.data["python"]
    parts = tuple(int(x) for x in v.split(".")[:2] if x.isdigit())
    if parts < (3, 9):
        return failed(
            f"Python {v} at {t.python} is too old for current torch",
            value=v,
            expected=">= 3.9",
            hint=fixes.rerun(fixes.PYTORCH, "pytorch") + " to rebuild the venv with a newer Python",
        )
    return passed(f"Python {v} at {t.python}", value=v, expected=">= 3.9")


@check("system.E004", "gpunode local facts", weight=1, needs=("facts",))
def local_facts(s: Any) -> Outcome:
    f = s.facts
    found = sorted(f.roles)
    if f.errors or f.invalid:
        bad = "; ".join([*(u.reason for u in f.errors.values()), *f.invalid])
        what = "unreadable local facts" if f.errors else "wrong values in local facts (ignored)"
        return warned(
            f"{what}: {bad}",
            value=", ".join(found) or None,
            hint="re-run " + fixes.PLAYBOOK + " to rewrite them (executable .fact scripts are not read)",
        )
    if not found:
        return warned(
            f"no gpunode_*.fact in {f.directory}: not provisioned by the gpunode roles (or another --facts-dir); "
            "intent-vs-reality comparisons are skipped",
            value=None,
            hint=f"provision the node with {fixes.PLAYBOOK}, or pass --facts-dir DIR",
        )
    return passed(f"{', '.join(found)} in {f.directory}", value=", ".join(found))


def _gb(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 1e9:.0f} GB"


def _data_gpus(s: Any) -> int:
    if s.nvml is not None and s.nvml.ok and s.nvml.gpus:
        return len(s.nvml.gpus)
    if s.options.expect_gpus:
        return s.options.expect_gpus
    try:
        return max(1, int(s.facts.get("gpunode_driver", "expected_gpu_count") or 1))
    except (TypeError, ValueError):
        return 1


@check(
    "system.E005",
    "Dataset storage: SSD, free space, reads",
    weight=2,
    needs=("datapath", "facts"),
)
def dataset_storage(s: Any) -> Outcome:
    dp = s.datapath
    if dp is None or (dp.error is None and not dp.dirs):
        return skipped(
            "no dataset directory named: pass --data-dir DIR, or record data_dirs in gpunode_tuning.fact "
            "(docs/design.md)"
        )
    if dp.error is not None:
        return errored(f"dataset storage: {dp.error.reason}", hint="re-run with a longer --timeout")
    gpus = _data_gpus(s)
    th = _config(s).thresholds
    if s.options.data_rate_mb_s:
        need, need_src = float(s.options.data_rate_mb_s), "--data-rate"
    else:
        need = th.data_read_need_mb_s_per_gpu * gpus
        need_src = f"{th.data_read_need_mb_s_per_gpu:g} MB/s per GPU x {gpus} (ResNet-50 on ImageNet, docs/hostcheck.md)"
    details, missing, slow, rotating, full, unmeasured = [], [], [], [], [], []
    rates = []
    for d in dp.dirs:
        if d.error is not None:
            missing.append(d.error.reason)
            details.append(d.error.reason)
            continue
        dev = d.device
        if isinstance(dev, BlockDevice):
            kind = {True: "rotational (HDD)", False: "non-rotational (SSD/NVMe)", None: "rotation unknown"}
            where = f"{d.fstype} on {dev.name} ({', '.join(dev.disks)}: {kind[dev.rotational]})"
            if dev.rotational:
                rotating.append(d.path)
        else:
            reason = dev.reason if isinstance(dev, Unavailable) else "no mount found"
            where = f"{d.fstype or '?'} from {d.source or '?'} ({reason})"
        share = d.free_bytes / d.total_bytes if d.free_bytes is not None and d.total_bytes else None
        room = f"{_gb(d.free_bytes)} free of {_gb(d.total_bytes)}" + (
            f" ({share:.0%})" if share is not None else ""
        )
        if share is not None and share < th.data_free_warn_fraction:
            full.append(d.path)
        r = d.read
        if isinstance(r, ReadMeasure) and r.mb_s is not None:
            rates.append(r.mb_s)
            read = f"read {r.mb_s:.0f} MB/s ({r.method}, {r.files} files, {r.readers} readers)"
            if r.mb_s < need:
                slow.append(f"{d.path} {r.mb_s:.0f} MB/s")
        else:
            why = r.reason if isinstance(r, Unavailable) else "not measured"
            read = f"read not measured: {why}"
            unmeasured.append(d.path)
        details.append(f"{d.path}: {where}; {room}; {read}")
    if dp.busy:
        details.append(f"measured while {dp.busy}: the reads competed with it")
    kw: dict[str, Any] = {
        "value": round(min(rates), 1) if rates else None,
        "unit": "MB/s",
        "expected": f">= {need:.0f} MB/s ({need_src}); non-rotational; >= {th.data_free_warn_fraction:.0%} free",
        "details": tuple(details),
    }
    move = (
        "put the dataset on local NVMe/SSD (or stage it there from network storage before the job), "
        "or pack small files into shards (WebDataset, tar) that read sequentially"
    )
    if missing:
        return failed(
            "; ".join(missing), hint="fix the path (--data-dir, or data_dirs in gpunode_tuning.fact)", **kw
        )
    if slow:
        return failed(
            f"dataset reads too slow for the pipeline: {', '.join(slow)} < {need:.0f} MB/s", hint=move, **kw
        )
    if rotating:
        return warned(f"dataset on a rotational disk: {', '.join(rotating)}", hint=move, **kw)
    if full:
        return warned(
            f"less than {th.data_free_warn_fraction:.0%} free under {', '.join(full)}",
            hint="free space or move the dataset to a larger file system",
            **kw,
        )
    if unmeasured and not rates:
        return passed(f"dataset storage non-rotational with room; reads not measured ({dp.source})", **kw)
    return passed(f"dataset storage fast enough: slowest {min(rates):.0f} MB/s >= {need:.0f} MB/s", **kw)
